"""`nox -s bench`: each measurement beside its reference in the same run (kernel throughput, SFT
forward+backward, data preparation, the CUDA payload, the audit). Nothing imports these."""
