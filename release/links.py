"""The link scopes of the release's install profiles: what `nox -s audit` resolves every ELF file against.

For each published install profile, on the release's first Python: the third-party part of its install file
(every pin but the release's own wheels, each with its sha256) is installed with `uv pip install --target
build/link/<profile>-cp3NN --no-deps --require-hashes` for the profile's platform, from uv's cache where it has
them (hard links: 195 distributions of serve in 3.6 s here; the first time, the download: ~4 GB for serve's CUDA
torch and NVIDIA runtime). The audit then resolves the wheels that install file lists (and the payload
archive's ELF files, with the wheel holding its manifest) against that folder: audits/analyzers/link_rules.py.

A profile whose closure cannot be installed here (offline, an index that refuses) is NOT CHECKED, said with the
reason and the command; the other profiles are still resolved.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from base import distdir, paths, progress
from base.version import python_tag
from locks import indexes
from locks.read import LOCKDIR, PLATFORM, Pin, directive, parse_pins, render_pins

WORK = paths.LINK_WORK


def _platform(profile: str) -> str:
    """The platform the profile's locks resolve for: its input's `#:uv-args --python-platform`."""
    args = directive(LOCKDIR / f"{profile}.in", "uv-args")
    return args[args.index("--python-platform") + 1] if "--python-platform" in args else PLATFORM


def _third_party(text: str, pins: Mapping[str, Pin], ours: set[str]) -> str:
    """The install file without the release's own pins (their wheels are the ones audited): its option lines
    (an index the closure comes from), then every other pin with its hashes."""
    options = [ln for ln in text.splitlines() if ln.startswith("-")]
    return "".join(f"{ln}\n" for ln in options) + render_pins(p for n, p in pins.items() if n not in ours)


def scopes(dist: Path, work: Path = WORK, uv: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The link scopes of every published profile on the release's first Python ({"name", "folders", "wheels"},
    as `python -m audits --link-scopes` reads them), and a NOT CHECKED line per profile that could not be
    installed."""
    release = distdir.open_release(dist)
    manifest = release.manifest
    python = manifest.pythons[0]
    ours = {w.name for w in manifest.wheels}
    uv = uv or shutil.which("uv") or "uv"
    out: list[dict[str, Any]] = []
    skipped: list[str] = []
    for entry in [f for f in manifest.install or () if f.python == python and f.format == "requirements"]:
        name = f"{entry.profile}-{python_tag(python)}"
        text = (dist / entry.file).read_text()
        pins = parse_pins(text, dist / entry.file)
        listed = {n for n in pins if n in ours}
        wheels = sorted(w.filename for w in manifest.wheels if w.name in listed and python in w.pythons)
        target = work / name
        subset = work / f"{name}.txt"
        work.mkdir(parents=True, exist_ok=True)
        subset.write_text(_third_party(text, pins, ours))
        adapted = indexes.for_install(subset, work / f"{name}.install.txt")
        shutil.rmtree(target, ignore_errors=True)
        argv = [uv, "pip", "install", "--quiet", "--target", str(target), "--no-deps", "--require-hashes"]
        argv += ["--python-platform", _platform(entry.profile), "--python-version", python, "-r", str(adapted)]
        t0 = time.perf_counter()
        progress.say("links", f"{name}: installing its third-party closure into {target} ...")
        try:
            got = subprocess.run(argv, capture_output=True, text=True, check=False)
        except OSError as exc:  # no uv here (run outside nox -s audit, which installs lockfiles/links.txt)
            got = subprocess.CompletedProcess(argv, 127, "", f"{uv} cannot be run: {exc.strerror or exc}")
        if got.returncode != 0:
            why = (got.stderr.strip() or got.stdout.strip()).splitlines()[-1:] or ["no output"]
            skipped.append(
                f"{name}: NOT CHECKED: its closure could not be installed ({why[0]}); run `{' '.join(argv)}` "
                "where the index is reachable, or audit with --link SITE_PACKAGES of an environment that holds it"
            )
            continue
        progress.say("links", f"{name}: {len(pins) - len(listed)} distributions in {time.perf_counter() - t0:.1f}s")
        out.append({"name": name, "folders": [str(target)], "wheels": wheels})
    return out, skipped


def write(dist: Path, work: Path = WORK, skip: str = "") -> tuple[Path, list[str]]:
    """scopes() into work/scopes.json, each profile that could not be had as {"name", "not_checked"} (the audit
    report's `links_not_checked`: the verdict's INCOMPLETE, never a pass); `skip`: why none is tried
    (--no-links). (Its path, the NOT CHECKED lines.)"""
    found, skipped = ([], [f"links: NOT CHECKED ({skip})"]) if skip else scopes(dist, work)
    unchecked = [{"name": line.split(":", 1)[0], "not_checked": line} for line in skipped]
    work.mkdir(parents=True, exist_ok=True)
    path = work / "scopes.json"
    path.write_text(json.dumps(found + unchecked, indent=2) + "\n")
    return path, skipped
