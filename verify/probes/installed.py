"""name -> version of every distribution in the venv (names normalized). One JSON line."""

import json
import re
from importlib.metadata import distributions

print(json.dumps({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in distributions()}))
