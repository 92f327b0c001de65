"""What each release stage's content key is made of: its one owner (base.stagecache keys and records).

The code a stage runs is derived, not listed: from the stage's entry module, the import closure over
this repository's packages (base/keys.py), each package reached counted whole (its code and every data
file under it: the policy, schemas, patches, the alias .pth). Beside it, what each stage reads outside
its packages, the allowlisted environment (keys.ENVIRONMENT) and the host facts it depends on. Every
ingredient is named, so a miss says what changed; too often is safe, a stage reused after what it reads
changed is not. tests/unit/test_stage_ingredients.py changes every file of the repository and every
allowlisted variable, one at a time, and checks which stages get a new key.

- ``assemble``: the kernel wheel(s), every lock, the version file, the code of ``carriers.__main__``, the
  Pythons asked for, the dist path, the interpreter, SOURCE_DATE_EPOCH.
- ``audit``: dist/ (every file SHA256SUMS lists, re-hashed, and manifest.json), the code of
  ``release.audit``, every lock, the day's vulnerability data, the baseline, the interpreter.
- ``verify-PROFILE-cp3NN``: dist/ (or DIST_FREE), the code of the run's entry (``verify``,
  ``verify.resolution``), every lock, the version file and kt-doctor's source, the run's own arguments
  (the interpreter it ran on: path, version, source, its bytes), the interpreter running it, this host's CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from . import distdir, keys, paths, stagecache

ASSEMBLE_ENTRY = "carriers.__main__"
AUDIT_ENTRY = "release.audit"
VERIFY_ENTRIES = {"resolve": "verify.resolution", "": "verify.__main__"}


def outside(kind: str) -> tuple[Path, ...]:
    """What a stage of `kind` reads outside the packages it imports (the import closure covers those):
    the locks, the version file, the CPU ladder (the audit policy's [isa] ladder: every stage that loads
    the policy reads it), kt-doctor's source (verify/lf.py loads it by path)."""
    kt = paths.KERNEL / "python" / "kt_kernel"
    ladder = kt / "cpu_variants.json"
    return {
        "assemble": (paths.LOCKFILES, paths.VERSION_FILE, ladder),
        "audit": (paths.LOCKFILES, ladder),
        "verify": (paths.LOCKFILES, paths.VERSION_FILE, ladder, kt / "doctor.py"),
    }[kind]


def verify_entry(profile: str) -> str:
    """The module a verification run's code is derived from: resolve-* normal resolution, every other one
    verify.__main__ (a venv profile on one Python: sft-cp312)."""
    for prefix, entry in VERIFY_ENTRIES.items():
        if profile.startswith(prefix):
            return entry
    raise AssertionError("unreachable: the empty prefix matches")


def _code(entry: str, digests: keys.Digests) -> tuple[dict[str, str], list[Path]]:
    """The code ingredients of `entry` and the package folders they cover."""
    root = paths.ROOT
    packages = keys.packages_read([entry], root)
    return {f"code:{p}": digests.tree(root / p, root=root) for p in packages}, [root / p for p in packages]


def _outside(kind: str, digests: keys.Digests) -> tuple[dict[str, str], list[Path]]:
    found = [p for p in outside(kind) if p.exists()]
    named = {f"reads:{p.relative_to(paths.ROOT)}": digests.tree(p, root=paths.ROOT) for p in found}
    return named, found


def _digests() -> keys.Digests:
    """A fresh memo for one key: a file edited between two stages' keys in one process is hashed again."""
    return keys.Digests()


def wheel_memo() -> str:
    """What the wheel memo keys every derived wheel by besides its input: the assembly's code as its
    stage key derives it (every package `python -m carriers` imports, whole: code, patches, the alias
    .pth, schemas) and the allowlisted environment that reaches the assembly (SOURCE_DATE_EPOCH)."""
    code, _ = _code(ASSEMBLE_ENTRY, _digests())
    return stagecache.value_sha256([code, keys.environment("assemble")])


def assemble(kernel: Path, dist: Path, pythons: Sequence[str] | None, *, fresh: bool = False) -> stagecache.Stage:
    """The assembly into `dist` from the kernel wheel(s) in `kernel` (a directory or one wheel)."""
    d = _digests()
    wheels = sorted(kernel.glob("kt_kernel-*.whl")) if kernel.is_dir() else [kernel]
    code, covers = _code(ASSEMBLE_ENTRY, d)
    outside, more = _outside("assemble", d)
    ingredients = {
        "dist path": stagecache.value_sha256(str(dist.resolve())),
        "kernel wheels": stagecache.files_sha256(wheels),
        **code,
        **outside,
        "pythons": stagecache.value_sha256(list(pythons or [])),
        "python": stagecache.python_sha256(),
    }
    env = keys.environment("assemble")
    return stagecache.Stage("assemble", ingredients, fresh=fresh, environment=env, covers=[*covers, *more])


def audit(
    dist: Path,
    reports: Sequence[Path],
    baseline: Path | None,
    *,
    vulnerabilities: str = "",
    fresh: bool = False,
) -> stagecache.Stage:
    """The audit of a release's dist/ into `reports` (audit-report.json and .md, vulnerabilities.json);
    `vulnerabilities`: what the known-vulnerability data is ("" skipped; the day for the index's live
    data, or an advisory file's sha256)."""
    d = _digests()
    code, covers = _code(AUDIT_ENTRY, d)
    outside, more = _outside("audit", d)
    ingredients = {
        "vulnerability data": vulnerabilities or "skipped",
        "dist": distdir.key(dist),
        **code,
        **outside,
        "baseline": stagecache.file_sha256(baseline) if baseline else "none",
        "python": stagecache.python_sha256(),
    }
    env = keys.environment("audit")
    return stagecache.Stage(
        "audit", ingredients, outputs=reports, fresh=fresh, environment=env, covers=[*covers, *more, dist]
    )


DIST_FREE = "installs nothing from dist/"  # a profile's dist key when it installs no wheel of the release
RESOLUTION_MAX_AGE_H = 24.0  # normal resolution against a live index: its answer expires (KT_RESOLVE_MAX_AGE_H)


def verify(
    profile: str,
    dist: Path,
    dist_key: str | None = None,
    *,
    extra: Mapping[str, object] | None = None,
    fresh: bool = False,
    max_age_s: float | None = None,
) -> stagecache.Stage:
    """One verification profile over dist/ (its result is the record's result). `dist_key`: the
    already re-hashed dist_sha256(dist), when the caller has it (one hash of dist/ per run); `extra`:
    the profile's own arguments (the Pythons resolved, the index behind the release's). A profile that
    installs nothing of dist/ (lf-standard: upstream only) passes DIST_FREE: a new build does not re-run it.
    `max_age_s`: a result that depends on an outside service expires after this long."""
    d = _digests()
    code, covers = _code(verify_entry(profile), d)
    outside, more = _outside("verify", d)
    ingredients = {
        **{f"arg:{k}": stagecache.value_sha256(v) for k, v in (extra or {}).items()},
        "dist": DIST_FREE if dist_key == DIST_FREE else dist_key or distdir.key(dist),
        **code,
        **outside,
        "python": stagecache.python_sha256(),
        "cpu": stagecache.cpu_sha256(),
    }
    env = keys.environment("verify")
    return stagecache.Stage(
        f"verify-{profile}",
        ingredients,
        fresh=fresh,
        max_age_s=max_age_s,
        environment=env,
        covers=[*covers, *more, dist],
    )
