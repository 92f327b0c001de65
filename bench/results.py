"""Where each benchmark's numbers go: its JSON file (base.paths.BENCH_JSON, or --json), indented, one
trailing newline, the folder made if needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(path: Path, result: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
