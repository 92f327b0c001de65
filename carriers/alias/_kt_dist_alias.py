"""KT release: a distribution renamed ``<name>-kt`` answers importlib.metadata lookups by ``<name>``.

Code asks ``importlib.metadata.version("transformers")`` (or ``metadata``, ``distribution``,
``requires``, ``files``, and helpers built on them) and finds nothing under a fork or repack that
installs as ``transformers-kt``. This finder, last on ``sys.meta_path`` (``_kt_dist_alias.pth``
calls ``install()`` at start-up), answers such a lookup with the installed ``<name>-kt`` whose
``kt_upstream.json`` (in its dist-info, written by the release's carriers) names ``<name>``: its
metadata, with the upstream's Name and Version. Upstream's own distribution, when installed, is
found first; listings (``distributions()``, pip, ``packages_distributions()``) are unchanged.
It imports nothing at start-up and never raises into a lookup.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at start-up; mypy reads the block below
if TYPE_CHECKING:
    import importlib.metadata as md
    import os
    from collections.abc import Iterator
    from typing import Any

UPSTREAM_FILE = "kt_upstream.json"


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _renamed(dist: md.Distribution, name: str, version: str) -> md.Distribution:
    """`dist` (the fork's) with METADATA's Name and Version replaced by the upstream's. It is a
    PathDistribution on the fork's own dist-info directory, as every installed distribution is:
    code that reaches past the public API (tvm_ffi, which loads xgrammar's library, joins
    `distribution("xgrammar")._path.parent` with a RECORD line) finds the fork's files."""
    import importlib.metadata
    import re

    class Renamed(importlib.metadata.PathDistribution):
        def read_text(self, filename: str | os.PathLike[str]) -> str | None:
            text = dist.read_text(str(filename))
            if text and str(filename) in ("METADATA", "PKG-INFO"):
                text = re.sub(r"(?m)^Name:.*$", lambda _: f"Name: {name}", text, count=1)
                text = re.sub(r"(?m)^Version:.*$", lambda _: f"Version: {version}", text, count=1)
            return text

        def locate_file(self, path: str | os.PathLike[str]) -> Any:
            return dist.locate_file(path)

        @property
        def _normalized_name(self) -> str:  # the name it answers to, not its directory's
            return re.sub(r"[-_.]+", "_", name).lower()

    return Renamed(getattr(dist, "_path", None) or dist.locate_file(""))


class KTDistAlias:
    """A meta-path finder that finds no modules, only renamed distributions by their upstream name."""

    @staticmethod
    def find_spec(*args: object, **kwargs: object) -> None:
        return None

    @staticmethod
    def find_distributions(context: object = None) -> Iterator[md.Distribution]:
        name = getattr(context, "name", None)
        if not name:
            return iter(())
        try:
            import importlib.metadata
            import json

            want = _norm(name)
            path = getattr(context, "path", None) or sys.path
            ctx = importlib.metadata.DistributionFinder.Context(name=f"{want}-kt", path=path)
            for dist in importlib.metadata.MetadataPathFinder.find_distributions(ctx):
                up = json.loads(dist.read_text(UPSTREAM_FILE) or "{}")
                if _norm(str(up.get("name", ""))) == want:
                    return iter((_renamed(dist, up["name"], up["version"]),))
        except Exception:  # a lookup must see "not found", never a failure of this finder
            return iter(())
        return iter(())


def install() -> None:
    """Append the finder to sys.meta_path once (the .pth calls this at start-up)."""
    if not any(type(f).__name__ == "KTDistAlias" for f in sys.meta_path):
        sys.meta_path.append(KTDistAlias())
