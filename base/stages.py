"""What each release stage's content key is made of: its one owner (base.stagecache keys and records).

Every ingredient is named, so a miss says what changed. Trees are whole packages: a line of any module
of the code that runs a stage re-runs it (too often is safe; a stage reused after its code changed is not).

- ``assemble``: the kernel wheel(s), every lock (the carriers' inputs and the install files' closures),
  carriers/ (carriers.toml, the patch series, the schemas, the code), the packages it imports (base,
  locks, audits: the payload packer reads the policy), the Pythons asked for, the interpreter.
- ``audit``: every file dist/ lists (SHA256SUMS, re-hashed), the audit's code and policy, its lock, the
  baseline report if one is given, the interpreter.
- ``verify-PROFILE``: every file dist/ lists, the verification code (verify/ with its probes, and what it
  imports), the locks the profile installs from, the interpreter and this host's CPU (the variant the
  kernel picks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from . import paths, stagecache

CODE_BASE = (paths.ROOT / "base", paths.ROOT / "locks")
ASSEMBLE_CODE = (paths.ROOT / "carriers", paths.ROOT / "audits", *CODE_BASE)
AUDIT_CODE = (paths.ROOT / "audits", paths.ROOT / "release" / "audit.py", paths.ROOT / "release" / "vulns.py")
VERIFY_CODE = (paths.ROOT / "verify", paths.ROOT / "carriers", *CODE_BASE)


def _code(roots: Sequence[Path]) -> dict[str, str]:
    return {f"code:{r.relative_to(paths.ROOT)}": stagecache.tree_sha256(r) for r in roots}


def assemble(kernel: Path, dist: Path, pythons: Sequence[str] | None, *, fresh: bool = False) -> stagecache.Stage:
    """The assembly into `dist` from the kernel wheel(s) in `kernel` (a directory or one wheel)."""
    wheels = sorted(kernel.glob("kt_kernel-*.whl")) if kernel.is_dir() else [kernel]
    ingredients = {
        "dist path": stagecache.value_sha256(str(dist.resolve())),
        "kernel wheels": stagecache.files_sha256(wheels),
        "locks": stagecache.tree_sha256(paths.LOCKFILES),
        **_code(ASSEMBLE_CODE),
        "pythons": stagecache.value_sha256(list(pythons or [])),
        "python": stagecache.python_sha256(),
    }
    return stagecache.Stage("assemble", ingredients, fresh=fresh)


def assembled_outputs(dist: Path) -> list[Path]:
    """What the assembly wrote: every file SHA256SUMS lists, SHA256SUMS and manifest.json."""
    sums = dist / "SHA256SUMS"
    names = [line.split(maxsplit=1)[1] for line in sums.read_text().splitlines() if line.strip()]
    return [dist / n for n in names] + [sums, dist / "manifest.json"]


def audit(
    dist: Path, reports: Sequence[Path], baseline: Path | None, *, vulnerabilities: bool = True, fresh: bool = False
) -> stagecache.Stage:
    """The audit of a release's dist/ into `reports` (audit-report.json and .md, vulnerabilities.json);
    `vulnerabilities`: the known-vulnerability check runs, so the day is an ingredient (its data changes)."""
    ingredients = {
        "vulnerability data": stagecache.today() if vulnerabilities else "skipped",
        "dist": stagecache.dist_sha256(dist),
        **_code(AUDIT_CODE),
        "lock": stagecache.files_sha256([paths.LOCKFILES / "audit.txt", paths.LOCKFILES / "vulns.txt"]),
        "baseline": stagecache.file_sha256(baseline) if baseline else "none",
        "python": stagecache.python_sha256(),
    }
    return stagecache.Stage("audit", ingredients, outputs=reports, fresh=fresh)


DIST_FREE = "installs nothing from dist/"  # a profile's dist key when it installs no wheel of the release


def verify(
    profile: str,
    dist: Path,
    dist_key: str | None = None,
    *,
    extra: Mapping[str, object] | None = None,
    fresh: bool = False,
) -> stagecache.Stage:
    """One verification profile over dist/ (its result is the record's result). `dist_key`: the
    already re-hashed dist_sha256(dist), when the caller has it (one hash of dist/ per run); `extra`:
    the profile's own arguments (the Pythons resolved, the index behind the release's). A profile that
    installs nothing of dist/ (lf-standard: upstream only) passes DIST_FREE: a new build does not re-run it."""
    ingredients = {
        **{f"arg:{k}": stagecache.value_sha256(v) for k, v in (extra or {}).items()},
        "dist": DIST_FREE if dist_key == DIST_FREE else dist_key or stagecache.dist_sha256(dist),
        **_code(VERIFY_CODE),
        "locks": stagecache.tree_sha256(paths.LOCKFILES),
        "python": stagecache.python_sha256(),
        "cpu": stagecache.cpu_sha256(),
    }
    return stagecache.Stage(f"verify-{profile}", ingredients, fresh=fresh)
