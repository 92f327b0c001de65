# The KT release version: the one place it is set. kt-kernel, ktransformers and
# sglang-kt take it from here (kernel/pyproject.toml reads it by regex).
__version__ = "0.6.1"
# The release's timestamp (UTC date): every archive member and wheel file of the release is
# dated here unless SOURCE_DATE_EPOCH says otherwise, so a git clone and a source archive of the
# same commit build identical bytes. Bump it with the version.
__release_date__ = "2026-11-30"
