"""Every installed distribution's files (outside .dist-info and __pycache__) with their RECORD
hashes: distribution -> {path: hash}. One JSON line."""

import json
from importlib.metadata import distributions

out = {}
for d in distributions():
    out[d.metadata["Name"]] = {
        str(f): (f.hash.value if f.hash else "")
        for f in d.files or []
        if ".dist-info/" not in str(f) and "__pycache__/" not in str(f)
    }
print(json.dumps(out))
