"""CPU variant selection: pure decision logic, no native code.

``kt_kernel/__init__.py`` feeds this module what ``_core.detect_cpu()`` read
from CPUID/XGETBV; tests feed it synthetic feature sets. Nothing here imports
numpy or the extension, so it can run (and fail cleanly) on any x86-64 CPU.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "VARIANT_ENV",
    "CpuState",
    "CpuVariantError",
    "Decision",
    "Ladder",
    "LadderError",
    "Variant",
    "VariantStatus",
    "choose",
]

VARIANT_ENV = "KT_KERNEL_CPU_VARIANT"

# Register state each feature needs the OS to have enabled in XCR0.
_NEEDS_AVX_STATE = frozenset({"AVX", "AVX2", "FMA", "F16C"})
_NEEDS_AVX512_STATE = frozenset(
    {"AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512_VNNI", "AVX512_VBMI", "AVX512_BF16"}
)
_NEEDS_AMX_STATE = frozenset({"AMX_TILE", "AMX_INT8", "AMX_BF16"})
_LADDER_KEYS = frozenset({"name", "marker", "features"})


class KTKernelError(Exception):
    """Root of kt_kernel's own errors."""


class LadderError(KTKernelError):
    """cpu_variants.json is malformed."""


class CpuVariantError(KTKernelError, ImportError):
    """No CPU variant can run here, or KT_KERNEL_CPU_VARIANT asks for one that cannot."""


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Variant:
    """One rung of the CPU ladder: its name, the CPUID features it needs, its marker."""

    name: str
    features: frozenset[str]
    marker: str


@dataclass(frozen=True)
class Ladder:
    """CPU variants, lowest first; each one's features contain the one below it."""

    variants: tuple[Variant, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variants)

    def __getitem__(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], source: str = "<ladder>") -> Ladder:
        if data.get("schema_version") != 1:
            raise LadderError(f"{source}: schema_version must be 1, got {data.get('schema_version')!r}")
        raw = data.get("variants")
        if not isinstance(raw, list) or not raw:
            raise LadderError(f"{source}: 'variants' must be a non-empty list")
        variants: list[Variant] = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict):
                raise LadderError(f"{source}: variants[{i}] must be a table")
            for key in entry:
                if key not in _LADDER_KEYS:
                    raise LadderError(
                        f"{source}: variants[{i}] has unknown key {key!r}{_did_you_mean(key, _LADDER_KEYS)}"
                    )
            missing = _LADDER_KEYS - entry.keys()
            if missing:
                raise LadderError(f"{source}: variants[{i}] lacks {sorted(missing)}")
            v = Variant(str(entry["name"]), frozenset(entry["features"]), str(entry["marker"]))
            if v.marker not in v.features:
                raise LadderError(f"{source}: variant {v.name}: marker {v.marker} is not one of its features")
            if variants and not variants[-1].features < v.features:
                lost = sorted(variants[-1].features - v.features)
                raise LadderError(
                    f"{source}: variant {v.name} must strictly contain the features of {variants[-1].name}"
                    + (f" (it lacks {', '.join(lost)})" if lost else " (it adds nothing)")
                )
            if any(v.name == o.name for o in variants):
                raise LadderError(f"{source}: variant name {v.name} appears twice")
            variants.append(v)
        return cls(tuple(variants))

    @classmethod
    def load(cls, path: Path | None = None) -> Ladder:
        path = path or Path(__file__).with_name("cpu_variants.json")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LadderError(f"{path}: cannot read the CPU variant ladder: {exc}") from exc
        return cls.from_dict(data, str(path))


@dataclass(frozen=True)
class CpuState:
    """What the CPU reports and what the OS has enabled."""

    cpuid: Mapping[str, bool]
    os_avx: bool
    os_avx512: bool
    os_amx: bool
    # None: not asked (no AMX on this CPU/OS); True/False: the kernel's answer.
    amx_permitted: bool | None = None
    amx_errno: int = 0
    vendor: str = ""
    brand: str = ""

    def unavailable(self, feature: str) -> str | None:
        """Why `feature` cannot be used here, or None if it can."""
        if not self.cpuid.get(feature, False):
            return f"{feature} (not reported by CPUID)"
        if feature in _NEEDS_AVX_STATE and not self.os_avx:
            return f"{feature} (the CPU has it, but the OS has not enabled AVX state in XCR0)"
        if feature in _NEEDS_AVX512_STATE and not self.os_avx512:
            return f"{feature} (the CPU has it, but the OS has not enabled AVX-512 state in XCR0)"
        if feature in _NEEDS_AMX_STATE:
            if not self.os_amx:
                return f"{feature} (the CPU has it, but the OS has not enabled AMX tile state in XCR0)"
            if self.amx_permitted is not True:
                return f"{feature} (the kernel refused AMX permission, arch_prctl errno {self.amx_errno})"
        return None


@dataclass(frozen=True)
class VariantStatus:
    """Whether this host can run one variant, and if not, which features it lacks."""

    name: str
    usable: bool
    missing: tuple[str, ...] = ()
    note: str = ""

    def describe(self) -> str:
        if self.usable:
            return "usable"
        if self.note:
            return self.note
        return "missing " + ", ".join(self.missing)


@dataclass(frozen=True)
class Decision:
    """The variant chosen for this process, every variant's status, and whether the environment forced it."""

    chosen: str
    statuses: tuple[VariantStatus, ...]
    overridden: bool = False
    notes: tuple[str, ...] = field(default=())


def statuses(ladder: Ladder, state: CpuState, built: Iterable[str] | None = None) -> tuple[VariantStatus, ...]:
    """Each ladder variant's status on this CPU and OS (`built`: the variants in this wheel)."""
    built_set = set(ladder.names if built is None else built)
    out = []
    for v in ladder.variants:
        if v.name not in built_set:
            out.append(VariantStatus(v.name, False, note="not built into this wheel"))
            continue
        missing = tuple(r for f in sorted(v.features) if (r := state.unavailable(f)) is not None)
        out.append(VariantStatus(v.name, not missing, missing))
    return tuple(out)


def choose(
    ladder: Ladder, state: CpuState, override: str | None = None, built: Iterable[str] | None = None
) -> Decision:
    """Pick the best usable variant, or the one `override` names if it can run."""
    sts = statuses(ladder, state, built)
    usable = [s for s in sts if s.usable]
    if override:
        if override not in ladder.names:
            raise CpuVariantError(
                f"{VARIANT_ENV}={override!r} is not a CPU variant{_did_you_mean(override, ladder.names)} "
                f"Valid names: {', '.join(ladder.names)}. Unset it to pick automatically."
            )
        st = next(s for s in sts if s.name == override)
        if not st.usable:
            best = usable[-1].name if usable else "none"
            raise CpuVariantError(
                f"{VARIANT_ENV}={override} cannot run on this CPU ({state.brand or state.vendor or 'unknown'}): "
                f"{st.describe()}. Unset {VARIANT_ENV} to use the best usable variant ({best})."
            )
        return Decision(override, sts, overridden=True)
    if not usable:
        lowest = sts[0]
        raise CpuVariantError(
            f"kt_kernel needs an x86-64 CPU with {', '.join(sorted(ladder.variants[0].features))}; "
            f"this CPU ({state.brand or state.vendor or 'unknown'}) cannot run even the "
            f"{lowest.name} variant: {lowest.describe()}."
        )
    return Decision(usable[-1].name, sts)


def render_report(state: CpuState, decision: Decision, ladder: Ladder) -> str:
    """The human-readable table behind kt_kernel.cpu_report()."""
    lines = [f"CPU: {state.brand or '?'} ({state.vendor or '?'})"]
    feats = sorted({f for v in ladder.variants for f in v.features})
    lines.append("features: " + " ".join(f"{f}{'+' if state.unavailable(f) is None else '-'}" for f in feats))
    lines.append(f"OS state: AVX={state.os_avx} AVX-512={state.os_avx512} AMX={state.os_amx}")
    width = max(len(n) for n in ladder.names)
    for s in decision.statuses:
        mark = "*" if s.name == decision.chosen else " "
        lines.append(f"{mark} {s.name:<{width}}  {s.describe()}")
    how = f"forced by {VARIANT_ENV}" if decision.overridden else "best usable"
    lines.append(f"selected: {decision.chosen} ({how})")
    return "\n".join(lines)
