"""Which installed distribution owns each import package of the KT stack, and is that right?

    kt-doctor              (also: python -m kt_kernel.doctor)
    kt-doctor --json       machine-readable
    kt-doctor --site DIR   another environment's site-packages
    kt-doctor --find-links DIR | --index-url URL
                           where the repair commands take the release's wheels from
    kt-doctor --run [--deep]
                           also run things: the CPU kernels against a reference, the CUDA
                           payload against its manifest (--deep: hashes), every extracted
                           library's DT_NEEDED, a GPU's compute capability and one op per library

A KT environment must get ``transformers``, ``accelerate``, ``peft``, ``trl``, ``sglang``,
``sgl_kernel``, ... from exactly one distribution each, the KT one where the release forks or
repacks the upstream (``transformers-kt``, ``peft-kt``, ...). pip cannot see the difference: an
``pip install peft`` on top writes the same ``peft/`` files as ``peft-kt`` and both stay
"installed". The owners come from each distribution's RECORD (``importlib.metadata``'s listing, so
the release's name alias plays no part). A conflict is two distributions writing one package, or an
upstream distribution where an installed KT distribution requires the fork; each gets the pip
commands that repair it. Exit status: 0 healthy, 1 a conflict or (--run) a problem found, 2 an
unusable invocation.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("kt_kernel", "transformers", "accelerate", "peft", "trl", "llamafactory", "sglang", "sgl_kernel")
UPSTREAM_FILE = "kt_upstream.json"  # what the release's carriers write into each fork's dist-info


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Owner:
    """One distribution writing files of the package."""

    name: str
    version: str
    kt: bool  # a KT distribution (records an upstream) or the KT kernel itself


@dataclass
class Package:
    """One import package: its owners, its state and, for a conflict, the repair."""

    package: str
    owners: list[Owner] = field(default_factory=list)
    state: str = "absent"  # absent | ok | conflict
    problem: str = ""
    repair: list[str] = field(default_factory=list)


def _owners(dists: Iterable[metadata.Distribution]) -> dict[str, list[Owner]]:
    """Top-level import package -> the distributions whose RECORD lists files in it."""
    out: dict[str, list[Owner]] = {}
    for d in dists:
        name = d.metadata["Name"]
        if not name:
            continue
        kt = bool(d.read_text(UPSTREAM_FILE)) or _norm(name) in ("kt-kernel", "ktransformers")
        tops = set()
        try:
            files = d.files or []
        except (TypeError, ValueError):  # a malformed RECORD: no files to attribute
            files = []
        for f in files:
            parts = f.parts
            if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] in ("..", "__pycache__"):
                continue
            top = parts[0][:-3] if len(parts) == 1 and parts[0].endswith(".py") else parts[0]
            tops.add(top)
        for top in tops:
            out.setdefault(top, []).append(Owner(name, d.version, kt))
    return out


def _wanted_forks(dists: Iterable[metadata.Distribution]) -> dict[str, str]:
    """upstream name -> the fork some installed distribution requires instead (`peft` -> `peft-kt ==X`)."""
    out = {}
    for d in dists:
        for req in d.requires or []:
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*?)-kt\b\s*(\[[^\]]*\])?\s*([^;]*)", req)
            if m:
                out[_norm(m.group(1))] = f"{_norm(m.group(1))}-kt{m.group(3).strip()}"
    return out


def diagnose(packages: Iterable[str] = PACKAGES, site: Path | None = None, source: str = "") -> list[Package]:
    """The state of each import package in this environment (or in `site`). `source`: pip options
    naming where the release's wheels are, added to each repair that installs one."""
    dists = list(metadata.distributions(path=[str(site)]) if site else metadata.distributions())
    owners, wanted = _owners(dists), _wanted_forks(dists)
    out = []
    for pkg in packages:
        p = Package(pkg, sorted(owners.get(pkg, []), key=lambda o: (not o.kt, o.name)))
        upstream = [o for o in p.owners if not o.kt]
        forks = [o for o in p.owners if o.kt]
        want = wanted.get(_norm(upstream[0].name)) if upstream else None  # the fork required instead
        if not p.owners:
            out.append(p)
            continue
        p.state = "ok"
        if len(p.owners) > 1:
            p.state = "conflict"
            names = " and ".join(f"{o.name} {o.version}" for o in p.owners)
            p.problem = f"{names} all write {pkg}/: whichever installed last wins, file by file"
        elif want:
            p.state = "conflict"
            p.problem = f"upstream {upstream[0].name} provides {pkg}, where the KT release requires {want}"
        if p.state == "conflict":
            for o in upstream:
                p.repair.append(f"pip uninstall -y {o.name}")
            keep = forks[0] if forks else None
            where = f" {source}" if source else ""
            if keep is not None:
                p.repair.append(f"pip install --force-reinstall --no-deps{where} {keep.name}=={keep.version}")
            elif want:
                p.repair.append(f"pip install --no-deps{where} '{want}'")
        out.append(p)
    return out


@dataclass
class Damage:
    """One installed distribution whose files are not what its RECORD lists: missing, or changed."""

    distribution: str
    version: str
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    repair: str = ""


def _is_kt(d: metadata.Distribution) -> bool:
    return bool(d.read_text(UPSTREAM_FILE)) or _norm(d.metadata["Name"] or "") in ("kt-kernel", "ktransformers")


def _record_hash(path: Path, algorithm: str) -> str | None:
    import base64
    import hashlib

    try:
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, algorithm).digest()
    except (OSError, ValueError):
        return None
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def integrity(site: Path | None = None, source: str = "") -> tuple[list[Damage], int]:
    """Every installed distribution's files against its RECORD: each listed file present with its size, and
    for the KT stack's own distributions (the release's carriers and forks) its sha256 too; compiled
    bytecode (.pyc), which Python rewrites at will, is passed over. pip deletes a file that changes owner
    between two releases when it uninstalls the old owner after installing the new one (pypa/pip#8509):
    the new owner then lacks it, and nothing else notices. A file two installed distributions both list (two
    projects shipping a top-level build_backend.py) holds one's bytes: it is a collision, not damage, and is
    only checked for presence. Returns (the damaged distributions, files checked)."""
    dists = list(metadata.distributions(path=[str(site)]) if site else metadata.distributions())
    where = f" {source}" if source else ""
    out: list[Damage] = []
    checked = 0
    listed: list[tuple[metadata.Distribution, list[tuple[Any, Path]]]] = []
    shared: dict[Path, int] = {}  # a file two distributions list: one's copy overwrote the other's
    for d in dists:
        if not d.metadata["Name"]:
            continue
        try:
            files = [(f, Path(str(d.locate_file(f)))) for f in d.files or []]
        except (TypeError, ValueError):  # a RECORD pip cannot read either
            continue
        listed.append((d, files))
        for _, path in files:
            shared[path] = shared.get(path, 0) + 1
    for d, files in listed:
        name = d.metadata["Name"]
        deep = _is_kt(d)
        damage = Damage(name, d.version)
        for f, path in files:
            if f.suffix == ".pyc" or f.name == "RECORD" or (f.hash is None and f.size is None):
                continue
            checked += 1
            try:
                size = path.stat().st_size
            except OSError:
                damage.missing.append(str(f))
                continue
            if shared[path] > 1:  # the content is one owner's: a collision, which diagnose names
                continue
            resized = f.size is not None and size != f.size
            if resized or (deep and f.hash is not None and _record_hash(path, f.hash.mode) != f.hash.value):
                damage.changed.append(str(f))
        if damage.missing or damage.changed:
            damage.repair = f"pip install --force-reinstall --no-deps{where} {name}=={d.version}"
            out.append(damage)
    return sorted(out, key=lambda x: _norm(x.distribution)), checked


def render_damage(damaged: list[Damage], checked: int) -> str:
    """The damaged distributions, a few of their files each, and the command that restores each."""
    if not damaged:
        return f"files: every installed distribution has the {checked} files its RECORD lists"
    lines = [f"files: {len(damaged)} installed distribution(s) differ from their RECORD ({checked} files checked)"]
    for x in damaged:
        for kind, names in (("missing", x.missing), ("changed", x.changed)):
            if names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                lines.append(f"  {x.distribution} {x.version}: {len(names)} {kind}: {shown}")
        lines.append(f"    repair: {x.repair}")
    return "\n".join(lines)


def render(report: list[Package]) -> str:
    """The table a person reads, and the repairs."""
    lines = [f"{'package':<14} {'state':<9} owner(s)"]
    for p in report:
        owners = ", ".join(f"{o.name} {o.version}" for o in p.owners) or "-"
        lines.append(f"{p.package:<14} {p.state:<9} {owners}")
    for p in report:
        if p.state == "conflict":
            lines += ["", f"{p.package}: {p.problem}", "  repair:", *(f"    {c}" for c in p.repair)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The kt-doctor command: 0 when every package has one right owner and every file its RECORD lists, 1
    otherwise."""
    p = argparse.ArgumentParser(prog="kt-doctor", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--site", type=Path, help="inspect this site-packages directory instead of this environment")
    p.add_argument(
        "packages", nargs="*", default=list(PACKAGES), help=f"import packages (default: {' '.join(PACKAGES)})"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--find-links", metavar="DIR", help="repairs install the release's wheels from DIR only")
    src.add_argument("--index-url", metavar="URL", help="repairs install the release's wheels from this index")
    p.add_argument("--run", action="store_true", help="also run the checks of kt_kernel._doctor_run (see --help)")
    p.add_argument("--deep", action="store_true", help="with --run: hash every extracted payload file")
    args = p.parse_args(argv)
    if args.deep and not args.run:
        print("kt-doctor: --deep goes with --run", file=sys.stderr)
        return 2
    if args.run and args.site is not None:
        print("kt-doctor: --run checks this environment; it cannot run another's (--site)", file=sys.stderr)
        return 2
    if args.site is not None and not args.site.is_dir():
        print(f"kt-doctor: {args.site}: no such directory", file=sys.stderr)
        return 2
    if args.find_links and not Path(args.find_links).is_dir():
        print(f"kt-doctor: --find-links {args.find_links}: no such directory", file=sys.stderr)
        return 2
    source = ""
    if args.find_links:
        source = f"--no-index --find-links {shlex.quote(str(Path(args.find_links).resolve()))}"
    elif args.index_url:
        source = f"--index-url {shlex.quote(args.index_url)}"
    report = diagnose(args.packages, args.site, source)
    conflicts = [r for r in report if r.state == "conflict"]
    damaged, checked = integrity(args.site, source)
    checks = []
    if args.run:
        from . import _doctor_run

        checks = _doctor_run.run(deep=args.deep)
    problems = [c for c in checks if c.state == "problem"]
    if args.json:
        out: dict[str, Any] = {
            "packages": [asdict(r) for r in report],
            "conflicts": len(conflicts),
            "files": {"checked": checked, "damaged": [asdict(x) for x in damaged]},
        }
        if args.run:
            out["checks"] = [asdict(c) for c in checks]
            out["problems"] = len(problems)
        print(json.dumps(out, indent=2))
    else:
        print(render(report))
        print(f"\n{len(conflicts)} conflict(s)" if conflicts else "\nno conflicts")
        print(render_damage(damaged, checked))
        if args.run:
            from . import _doctor_run

            print(_doctor_run.render(checks))
            print(
                f"\n{len(problems)} problem(s) found"
                if problems
                else "\nevery check ran clean or was skipped (see why)"
            )
    return 1 if conflicts or problems or damaged else 0


if __name__ == "__main__":
    raise SystemExit(main())
