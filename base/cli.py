"""The options every stage's command line shares, defined once with one default: `--dist` (the release
directory, the build tree's dist/ unless told) and `--fresh` (run even where a proven result exists).
Stdlib only, like the rest of base."""

from __future__ import annotations

import argparse
from pathlib import Path

from .paths import DIST


def dist_option(p: argparse.ArgumentParser, what: str = "the release") -> None:
    """--dist DIR, default the build tree's dist/ (wherever the command is run from)."""
    p.add_argument("--dist", type=Path, default=DIST, help=f"{what} (default: {DIST})")


def fresh_option(p: argparse.ArgumentParser, what: str) -> None:
    """--fresh: `what` even where a proven result for exactly these inputs exists."""
    p.add_argument("--fresh", action="store_true", help=f"{what} even if proven on exactly these inputs before")
