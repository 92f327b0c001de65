"""`nox -s bench`: each measurement beside its reference in the same run (the audit, the CUDA
payload, kernel throughput, SFT forward+backward, data preparation; `__main__` runs them, `--only` one).
Nothing imports these."""
