"""Audit policy: TOML data -> frozen dataclasses, validated on load."""

from __future__ import annotations

import datetime
import difflib
import fnmatch
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
from packaging.utils import canonicalize_name

from .errors import PolicyError
from .model import Limits, Severity

POLICY_DIR = Path(__file__).resolve().parent / "policy"
DEFAULT_POLICY = POLICY_DIR / "default.toml"
# Built-in policies selected by name (--policy third-party): ours, and one for any wheel.
BUILTIN = {"default": DEFAULT_POLICY, "third-party": POLICY_DIR / "third-party.toml"}


@dataclass(frozen=True)
class ForbiddenNeeded:
    """A DT_NEEDED pattern our libraries (`members`) must never carry, with the fix."""

    pattern: str
    fix: str
    members: tuple[str, ...] = ("*",)  # fnmatch patterns of the files the rule applies to

    def applies(self, member: str) -> bool:
        return any(fnmatch.fnmatchcase(member.split("!", 1)[-1], m) for m in self.members)


@dataclass(frozen=True)
class Waiver:
    """A known, explained finding reported as info instead of failing the audit."""

    rule: str
    wheel: str  # normalized distribution name
    member: str  # "" = any member
    reason: str


@dataclass(frozen=True)
class IncompleteAcceptance:
    """A release check that may be missing (NOT VERIFIED, NOT CHECKED, not run) without holding the release
    back: the item's name or a glob, why, until a date (release/verdict.py; an expired one accepts nothing)."""

    item: str
    reason: str
    expires: datetime.date


@dataclass(frozen=True)
class VulnerabilityWaiver:
    """A known vulnerability of one package the release ships anyway, with why, until a date
    (`nox -s audit`'s vulnerability check: an expired waiver waives nothing)."""

    id: str  # the advisory (GHSA-..., PYSEC-..., CVE-...), or one of its aliases
    package: str  # normalized distribution name
    reason: str
    expires: datetime.date


@dataclass(frozen=True)
class SeverityRule:
    """This policy reports `rule` at `level` instead of its default (error), with the reason."""

    rule: str
    level: Severity
    reason: str
    wheel: str = ""  # "" = every wheel


@dataclass(frozen=True)
class ExternalProvider:
    """A required distribution whose libraries resolve outside the wheel (torch/lib)."""

    provider: str
    path: str  # an RPATH entry ending in this reaches the provider's libraries ("" if preloaded)
    libraries: tuple[str, ...]
    # The importing package loads the provider first (sgl_kernel imports torch), so its
    # libraries are found by soname in the process without any RPATH.
    preloaded: bool = False


@dataclass(frozen=True)
class CpuVariantPolicy:
    """One CPU variant of the ladder: its features, marker, allowed set and member path."""

    name: str
    features: frozenset[str]
    marker: str
    allowed: frozenset[str]  # features + implied + baseline
    member: str


@dataclass(frozen=True)
class CudaLibraryPolicy:
    """The SASS and PTX a CUDA library of kt-kernel's archive must hold."""

    member: str  # path inside the CUDA payload
    sass: frozenset[str]
    ptx: frozenset[str]


@dataclass(frozen=True)
class Coverage:
    """A narrower set of compute capabilities for one archived binary, with the reason."""

    file: str  # path inside the release archive
    targets: tuple[str, ...]  # compute capabilities this file must run on
    reason: str


@dataclass(frozen=True)
class PayloadPolicy:
    """The release's lazy CUDA archive: what goes in, how it is packed, what it must cover."""

    manifest_member: str
    include: tuple[str, ...]
    min_bytes: int
    kt_cuda_root: str
    headroom_bytes: int
    zstd_level: int
    zstd_window_log: int
    targets: tuple[str, ...]
    coverage: tuple[Coverage, ...]

    def targets_for(self, file: str) -> tuple[tuple[str, ...], str]:
        """(compute capabilities `file` must cover, the reason when narrower than the matrix)."""
        for c in self.coverage:
            if c.file == file:
                return c.targets, c.reason
        return self.targets, ""


def _limits(data: Mapping[str, Any]) -> Limits:
    base = Limits()
    return Limits(
        member_max_bytes=int(data.get("member_max_mib", base.member_max_bytes / 2**20) * 2**20),
        ratio_max=float(data.get("ratio_max", base.ratio_max)),
        ratio_min_bytes=int(data.get("ratio_min_mib", base.ratio_min_bytes / 2**20) * 2**20),
        archive_max_bytes=int(data.get("archive_max_mib", base.archive_max_bytes / 2**20) * 2**20),
        memory_max_bytes=int(data.get("memory_max_mib", base.memory_max_bytes / 2**20) * 2**20),
    )


def _cc(value: Any, where: str, source: Path) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"\d+\.\d+", value):
        raise PolicyError(f'{source}: {where}: {value!r} is not a compute capability like "9.0"')
    return value


def _str_list(value: Any, where: str, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{source}: {where} must be a list of strings, not {value!r}")
    return tuple(value)


def _number(value: Any, where: str, source: Path, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < 0:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise PolicyError(f"{source}: {where} must be {kind}, not {value!r}")
    return float(value)


def _payload(data: Mapping[str, Any], source: Path) -> PayloadPolicy | None:
    if not data:
        return None
    targets = tuple(_cc(t, f"payload.targets[{i}]", source) for i, t in enumerate(data["targets"]))
    coverage = []
    for i, c in enumerate(data.get("coverage", [])):
        unknown = set(c) - {"file", "targets", "reason"}
        if unknown or not c.get("file") or not c.get("reason"):
            raise PolicyError(
                f"{source}: payload.coverage[{i}] needs file, targets and reason "
                f"(unknown keys: {sorted(unknown) or 'none'})"
            )
        cts = tuple(_cc(t, f"payload.coverage[{i}].targets", source) for t in c["targets"])
        stray = sorted(set(cts) - set(targets))
        if stray:
            raise PolicyError(
                f"{source}: payload.coverage[{i}] ({c['file']}) names {stray}, which payload.targets does not advertise"
            )
        coverage.append(Coverage(str(c["file"]), cts, str(c["reason"])))
    window = int(_number(data["zstd_window_log"], "payload.zstd_window_log", source, integer=True))
    if not 10 <= window <= 31:
        raise PolicyError(f"{source}: payload.zstd_window_log {window} is outside zstd's 10..31")
    return PayloadPolicy(
        manifest_member=str(data["manifest_member"]),
        include=_str_list(data["include"], "payload.include", source),
        min_bytes=int(_number(data["min_mib"], "payload.min_mib", source) * (1 << 20)),
        kt_cuda_root=str(data["kt_cuda_root"]).strip("/"),
        headroom_bytes=int(_number(data["headroom_mib"], "payload.headroom_mib", source) * (1 << 20)),
        zstd_level=int(_number(data["zstd_level"], "payload.zstd_level", source, integer=True)),
        zstd_window_log=window,
        targets=targets,
        coverage=tuple(coverage),
    )


@dataclass(frozen=True)
class Policy:
    """Every limit the audits enforce, loaded from a policy TOML and checked on load."""

    source: Path
    wheel_budget_bytes: int
    growth_threshold_pct: float
    forbidden_needed: tuple[ForbiddenNeeded, ...]
    external: tuple[ExternalProvider, ...]
    exports_allowed: tuple[str, ...]
    exports_applies_to: frozenset[str]
    variants: tuple[CpuVariantPolicy, ...]
    loader_members: tuple[str, ...]
    baseline: frozenset[str]
    loader_guarded: frozenset[str]
    library_sample_bytes: int = 0  # isa.graft-above-baseline: code decoded per library, and per wheel
    wheel_sample_bytes: int = 0
    cuda_libraries: tuple[CudaLibraryPolicy, ...] = ()
    cuda_payload_member: str = ""
    cuda_min_driver_ptx_isa: str = ""
    cuda_kernels: tuple[str, ...] = ()
    waivers: tuple[Waiver, ...] = ()
    diff_warn_bytes: int = 1 << 20  # the release diff: a wheel that grew more than this, or than diff_warn_pct
    diff_warn_pct: float = 5.0
    vulnerability_waivers: tuple[VulnerabilityWaiver, ...] = ()
    incomplete_acceptances: tuple[IncompleteAcceptance, ...] = ()
    payload: PayloadPolicy | None = None
    # Always provided by the system, never by a wheel (the CUDA driver): correct to need.
    always_external: frozenset[str] = frozenset()
    top_level_forbidden: frozenset[str] = frozenset()
    limits: Limits = field(default_factory=Limits)
    severities: tuple[SeverityRule, ...] = ()
    name: str = "default"  # the policy file's stem (default, third-party, or the user's file)
    # path -> the distributions accepted to install it both (verify_install's path owners)
    installed_collisions: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _closure(features: frozenset[str], implies: Mapping[str, list[str]]) -> frozenset[str]:
    out, todo = set(features), list(features)
    while todo:
        for g in implies.get(todo.pop(), []):
            if g not in out:
                out.add(g)
                todo.append(g)
    return frozenset(out)


def _waiver(entry: dict[str, Any], source: Path) -> Waiver:
    from .model import RULES

    unknown = set(entry) - {"rule", "wheel", "member", "reason"}
    if unknown:
        raise PolicyError(f"{source}: waiver has unknown keys {sorted(unknown)}")
    if entry.get("rule") not in RULES:
        close = difflib.get_close_matches(str(entry.get("rule")), list(RULES), n=1)
        raise PolicyError(
            f"{source}: waiver names unknown rule {entry.get('rule')!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    if not entry.get("reason") or not entry.get("wheel"):
        raise PolicyError(f"{source}: waiver for {entry['rule']} needs a wheel and a reason")
    return Waiver(entry["rule"], entry["wheel"], entry.get("member", ""), entry["reason"])


def _expires(entry: dict[str, Any], what: str, source: Path) -> datetime.date:
    """An entry's `expires` date; PolicyError naming the entry if it is no YYYY-MM-DD date."""
    try:
        return datetime.date.fromisoformat(entry["expires"])
    except ValueError:
        raise PolicyError(f"{source}: {what}: expires {entry['expires']!r} is no date (YYYY-MM-DD)") from None


def _vuln_waiver(entry: dict[str, Any], source: Path) -> VulnerabilityWaiver:
    expires = _expires(entry, f"vulnerability waiver {entry['id']}", source)
    return VulnerabilityWaiver(entry["id"], canonicalize_name(entry["package"]), entry["reason"], expires)


def _acceptance(entry: dict[str, Any], source: Path) -> IncompleteAcceptance:
    return IncompleteAcceptance(
        entry["item"], entry["reason"], _expires(entry, f"accept_incomplete {entry['item']}", source)
    )


SCHEMA_FILE = Path(__file__).resolve().parent / "policy" / "schema.json"


def _validator() -> Any:
    from .readers._json import jsonschema_module

    jsonschema = jsonschema_module()

    return jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))


def unknown_keys(validator: Any, data: Mapping[str, Any]) -> list[str]:
    """One line per key the schema does not allow (its additionalProperties: false), each with the
    closest key it does allow: the schema is the one owner of the policy's keys."""
    from .readers._json import hint
    from .readers._json import unknown_keys as refused

    return [
        f"unknown key {''.join(f'{x}.' for x in where)}{key!r}{hint(key, known)}"
        for where, key, known in refused(validator.iter_errors(data))
    ]


def _checked(kind: str, data: Mapping[str, Any], check: Callable[[], None]) -> None:
    """Run `check` (it raises PolicyError) unless the same data passed it before (readers._memo)."""
    from .readers._memo import checked

    def run() -> str:
        check()
        return ""

    blob = json.dumps(data, sort_keys=True, default=str).encode()
    checked(f"policy-{kind}", [blob, SCHEMA_FILE.read_bytes()], ("jsonschema",), run)


def _check_keys(data: Mapping[str, Any], source: Path) -> None:
    """Every key of one policy file (before `extends` merges it) is one the schema names."""
    _checked("keys", data, lambda: _keys_known(data, source))


def _keys_known(data: Mapping[str, Any], source: Path) -> None:
    problems = unknown_keys(_validator(), data)
    if problems:
        raise PolicyError(f"{source}: " + f"\n{source}: ".join(problems))


def _check_types(data: Mapping[str, Any], source: Path) -> None:
    """Every value has the type audits/policy/schema.json gives it: a string where a list belongs
    would otherwise be read as a set of characters and silently disable a rule."""
    _checked("types", data, lambda: _types_right(data, source))


def _types_right(data: Mapping[str, Any], source: Path) -> None:
    validator = _validator()
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(x) for x in e.absolute_path])
    if errors:
        lines = [f"{'.'.join(str(x) for x in e.absolute_path) or '(top)'}: {e.message}" for e in errors[:5]]
        raise PolicyError(f"{source}: the policy does not match {SCHEMA_FILE.name}:\n  " + "\n  ".join(lines))


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: tables merge key by key, every other value replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_toml(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The policy file's data, with the file it `extends` (relative to it) underneath."""
    if path in chain:
        raise PolicyError(f"{path}: `extends` loops back to itself ({' -> '.join(map(str, chain))})")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read policy: {exc}") from exc
    _check_keys(data, path)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise PolicyError(f"{path}: extends must be a file name, not {base!r}")
    under = _read_toml((path.parent / base).resolve(), (*chain, path))
    # A relative ladder path stays relative to the file that names it.
    if "isa" in under and "ladder" in under["isa"] and "ladder" not in data.get("isa", {}):
        under["isa"]["ladder"] = str(((path.parent / base).resolve().parent / under["isa"]["ladder"]).resolve())
    return _merge(under, data)


def resolve_policy(spec: str | Path | None) -> Path:
    """A built-in policy's name (default, third-party) or a policy file's path."""
    if spec is None:
        return DEFAULT_POLICY
    if str(spec) in BUILTIN:
        return BUILTIN[str(spec)]
    return Path(spec)


def _severity(entry: dict[str, Any], source: Path) -> SeverityRule:
    from .model import RULES

    if entry["rule"] not in RULES:
        close = difflib.get_close_matches(str(entry["rule"]), list(RULES), n=1)
        raise PolicyError(
            f"{source}: severity names unknown rule {entry['rule']!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    return SeverityRule(entry["rule"], entry["level"], entry["reason"], entry.get("wheel", ""))


def load_policy(path: Path | str | None = None) -> Policy:
    """Load a built-in policy by name (default, third-party) or a policy file; PolicyError if malformed."""
    path = resolve_policy(path).resolve()
    data = _read_toml(path)
    _check_types(data, path)
    try:
        size, elf, isa = data["size"], data["elf"], data["isa"]
        ladder_path = (path.parent / isa["ladder"]).resolve()
        ladder = json.loads(ladder_path.read_text())["variants"]
        implies: dict[str, list[str]] = isa["implies"]
        baseline = frozenset(isa["baseline"])
        variants: list[CpuVariantPolicy] = []
        for v in ladder:
            feats = frozenset(v["features"])
            if variants and not variants[-1].features < feats:
                raise PolicyError(
                    f"{ladder_path}: variant {v['name']} must strictly contain the features of {variants[-1].name}"
                )
            if v["marker"] not in feats:
                raise PolicyError(f"{ladder_path}: variant {v['name']}: marker {v['marker']} is not a feature")
            variants.append(
                CpuVariantPolicy(
                    v["name"],
                    feats,
                    v["marker"],
                    _closure(feats, implies) | baseline,
                    isa["variant_member"].format(name=v["name"]),
                )
            )
        cuda = data.get("cuda", {})
        libs = tuple(
            CudaLibraryPolicy(m, frozenset(spec.get("sass", [])), frozenset(spec.get("ptx", [])))
            for m, spec in cuda.get("libraries", {}).items()
        )
        return Policy(
            source=path,
            wheel_budget_bytes=int(float(size["wheel_budget_mib"]) * (1 << 20)),
            growth_threshold_pct=float(size["growth_threshold_pct"]),
            diff_warn_bytes=int(float(size.get("diff_warn_mib", 1.0)) * (1 << 20)),
            diff_warn_pct=float(size.get("diff_warn_pct", 5.0)),
            forbidden_needed=tuple(
                ForbiddenNeeded(
                    f["pattern"], f["fix"], _str_list(f.get("members", ["*"]), "elf.forbidden_needed.members", path)
                )
                for f in elf["forbidden_needed"]
            ),
            external=tuple(
                ExternalProvider(
                    e["provider"],
                    e.get("path", ""),
                    _str_list(e["libraries"], "elf.external.libraries", path),
                    bool(e.get("preloaded", False)),
                )
                for e in elf.get("external", [])
            ),
            always_external=frozenset(_str_list(elf.get("always_external", []), "elf.always_external", path)),
            top_level_forbidden=frozenset(data.get("wheel", {}).get("top_level_forbidden", [])),
            installed_collisions={c["path"]: frozenset(c["between"]) for c in data.get("installed_collision", [])},
            exports_allowed=tuple(elf["exports"]["allowed"]),
            exports_applies_to=frozenset(elf["exports"]["applies_to"]),
            variants=tuple(variants),
            loader_members=tuple(isa["loader_members"]),
            baseline=baseline,
            loader_guarded=frozenset(isa["loader_guarded"]),
            library_sample_bytes=int(float(isa.get("library_sample_mib", 0)) * (1 << 20)),
            wheel_sample_bytes=int(float(isa.get("wheel_sample_mib", 0)) * (1 << 20)),
            cuda_libraries=libs,
            cuda_payload_member=cuda.get("payload_member", ""),
            cuda_min_driver_ptx_isa=cuda.get("min_driver_ptx_isa", ""),
            cuda_kernels=tuple(cuda.get("kernels", [])),
            waivers=tuple(_waiver(w, path) for w in data.get("waivers", [])),
            vulnerability_waivers=tuple(_vuln_waiver(w, path) for w in data.get("vulnerability_waivers", [])),
            incomplete_acceptances=tuple(_acceptance(a, path) for a in data.get("accept_incomplete", [])),
            payload=_payload(data.get("payload", {}), path),
            limits=_limits(data.get("limits", {})),
            severities=tuple(_severity(e, path) for e in data.get("severity", [])),
            name=path.stem,
        )
    except KeyError as exc:
        raise PolicyError(f"{path}: missing key {exc}") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read the CPU variant ladder: {exc}") from exc
