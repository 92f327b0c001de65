"""Which distribution provides each upstream name given as an argument: its fork (NAME-kt), the
upstream itself ("UPSTREAM INSTALLED"), or nothing. Run inside an installed venv; one JSON line."""

import json
import re
import sys
from importlib.metadata import distributions

# The listing, not a lookup by name: a lookup by an upstream name is answered by the fork
# (carriers/alias), the listing shows what is really installed.
installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d for d in distributions()}
out = {}
for up in sys.argv[1:]:
    if up in installed:
        out[up] = "UPSTREAM INSTALLED"
        continue
    d = installed.get(up + "-kt")
    if d is None:
        out[up] = "MISSING"
        continue
    # The fork must be what provides the import package, file for file.
    mine = any(str(f).startswith(up.replace("-", "_") + "/") for f in d.files or [])
    out[up] = d.metadata["Name"] if mine else "files not from the fork"
print(json.dumps(out))
