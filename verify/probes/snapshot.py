"""The installed files (no .pyc) of each distribution named as an argument, with the sha256 of
their bytes on disk: name -> {path: sha256}. One JSON line."""

import hashlib
import json
import sys
from importlib.metadata import distribution
from pathlib import Path

out: dict[str, dict[str, str]] = {}
for n in sys.argv[1:]:
    d = distribution(n)
    out[n] = {}
    for f in d.files or []:
        path = Path(f.locate())
        if path.is_file() and not str(f).endswith(".pyc"):
            with path.open("rb") as fh:
                out[n][str(f)] = hashlib.file_digest(fh, "sha256").hexdigest()
print(json.dumps(out))
