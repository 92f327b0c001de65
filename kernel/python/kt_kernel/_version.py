# The KT release version: the one place it is set. kt-kernel, ktransformers and
# sglang-kt take it from here (kernel/pyproject.toml reads it by regex).
__version__ = "0.6.1"
