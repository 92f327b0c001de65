"""`kt-doctor --run`: run what a KT environment needs, not only look at who owns it.

Each check says what it ran, what is wrong and the command that fixes it:

cpu      the CPU variant this host gets (or the one KT_KERNEL_CPU_VARIANT forces) loads, and a
         tiny MoE through it matches a float64 reference computed here with numpy;
payload  the release's CUDA payload: materialized or not, every file's size against the manifest
         (`--deep`: its sha256 too);
needed   every extracted library's DT_NEEDED resolved by the dynamic loader itself (`ldd`, with the
         environment's own library folders, torch's NVIDIA libraries among them, on its path); a
         library needing another CUDA major than the environment holds is named as such;
symbols  every undefined symbol of those libraries (and of sgl-deep-gemm-kt's extension) bound by the loader
         (`ldd -r`): one this environment's torch lacks is named, with the torch installed, the torch the
         release requires exactly, and the command that restores it;
gpu      with a GPU torch can see: each device's compute capability against each payload file's SASS
         and PTX, then one small op per library (kt-kernel's CUDA library, sgl_kernel) through torch.

A check that cannot run here (no payload in a CPU-only profile, no GPU) says "skipped" and why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BOUND = 0.03  # the kernel quantizes activations to int8; against a float64 reference of the same weights
DRIVER = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})  # the NVIDIA driver's, never a wheel's
DRIVER_API = {"libcuda.so.1": r"cu[A-Z]", "libnvidia-ml.so.1": r"nvml[A-Z]"}  # what each defines


@dataclass
class Check:
    """One check's verdict: "ok", "problem" or "skipped"; what it found; how to fix it."""

    name: str
    state: str
    detail: str
    fix: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


def _timed(name: str, fn: Callable[[], Check]) -> Check:
    t0 = time.perf_counter()
    try:
        check = fn()
    except Exception as exc:  # a check that crashes is a finding, never a crashed doctor
        check = Check(name, "problem", f"{type(exc).__name__}: {exc}", "report it with `kt-doctor --run --json`")
    check.seconds = round(time.perf_counter() - t0, 2)
    return check


def _reference_moe(kt: Any, np: Any) -> tuple[str, float]:
    """A MoE forward through kt_kernel against float64 numpy on the same dequantized weights."""
    rng = np.random.default_rng(7)
    experts, hidden, inter, tokens, topk = 8, 256, 128, 5, 2
    q = [
        kt.quantize(rng.standard_normal((experts, r, c), dtype=np.float32) * 0.05, "int8")
        for r, c in ((inter, hidden), (inter, hidden), (hidden, inter))
    ]
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    ids = np.stack([rng.permutation(experts)[:topk] for _ in range(tokens)])
    w = rng.random((tokens, topk), dtype=np.float32)
    y = np.asarray(kt.MoE(*q)(x, ids, w), dtype=np.float64)
    # INT8 layout: q int8 [E, rows, cols] times a per-row float32 scale (not kt_kernel.dequantize)
    gate, up, down = (p.q.astype(np.float64) * p.scale.astype(np.float64)[:, :, None] for p in q)
    ref = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(topk):
            e = ids[t, k]
            g, u = gate[e] @ x[t], up[e] @ x[t]
            ref[t] += w[t, k] * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return kt.__cpu_variant__, float(np.abs(y - ref).max() / np.abs(ref).max())


def check_cpu() -> Check:
    try:
        import numpy as np

        import kt_kernel as kt
    except Exception as exc:  # CpuVariantError (a forced variant this CPU cannot run) is an ImportError's cause
        cause = exc.__cause__ or exc
        fix = (
            "unset KT_KERNEL_CPU_VARIANT"
            if os.environ.get("KT_KERNEL_CPU_VARIANT")
            else "pip install --force-reinstall kt-kernel"
        )
        return Check("cpu", "problem", f"kt_kernel does not load: {cause}", fix)
    decision = kt.cpu_report().decision
    refused = getattr(kt, "_OVERRIDE_ERROR", None)  # a forced variant this CPU cannot run (kt-doctor still starts)
    usable = [s.name for s in decision.statuses if s.usable]
    best = usable[-1] if usable else decision.chosen
    variant, err = _reference_moe(kt, np)
    data = {"variant": variant, "best": best, "forced": decision.overridden, "moe_max_rel_error": err}
    if err > BOUND:
        return Check(
            "cpu",
            "problem",
            f"the {variant} kernels compute a MoE {err:.3g} away from the reference (bound {BOUND})",
            "report it with `kt-doctor --run --json`; KT_KERNEL_CPU_VARIANT=<lower variant> works around it",
            data=data,
        )
    if refused is not None:
        data["forced"] = os.environ.get("KT_KERNEL_CPU_VARIANT")
        return Check(
            "cpu",
            "problem",
            f"{refused} (every other program fails to import kt_kernel)",
            "unset KT_KERNEL_CPU_VARIANT",
            data=data,
        )
    if decision.overridden and variant != best:
        return Check(
            "cpu",
            "problem",
            f"KT_KERNEL_CPU_VARIANT forces {variant}; this CPU runs {best}, which is faster (the MoE still matches)",
            "unset KT_KERNEL_CPU_VARIANT",
            data=data,
        )
    return Check(
        "cpu", "ok", f"{variant}: a MoE matches the float64 reference ({err:.2g} max relative error)", data=data
    )


def _payload() -> tuple[Any, Any] | Check:
    from importlib.util import find_spec

    from kt_kernel import payload

    try:
        return payload, payload.load_manifest()
    except payload.PayloadError as exc:
        if find_spec(payload.MANIFEST_PACKAGE) is None:
            return Check(
                "payload",
                "skipped",
                f"no CUDA payload here: {payload.MANIFEST_PACKAGE} is not installed (a CPU-only profile)",
            )
        return Check("payload", "problem", str(exc), "pip install --force-reinstall --no-deps sglang-kernel-kt")


def check_payload(found: tuple[Any, Any] | Check, deep: bool) -> Check:
    if isinstance(found, Check):
        return replace(found, name="payload")
    payload, m = found
    final = payload.target_dir(m)
    data: dict[str, Any] = {"files": len(m.files), "bytes": m.extracted_size, "root": str(final), "deep": deep}
    try:
        payload.locate_parts(m)
    except payload.PayloadError as exc:
        return Check("payload", "problem", str(exc), m.install_hint(), data=data)
    if not (final / payload.COMPLETE).is_file():
        data["materialized"] = False
        return Check(
            "payload",
            "ok",
            f"not materialized yet in {final}: the first CUDA use extracts it",
            "python -m kt_kernel.payload materialize (to extract it now)",
            data=data,
        )
    data["materialized"] = True
    wrong = []
    for name, f in sorted(m.files.items()):
        try:
            size = (final / name).lstat().st_size
        except OSError as exc:
            wrong.append(f"{name}: {exc.strerror}")
            continue
        if size != int(f["size"]):
            wrong.append(f"{name} is {size} bytes, the manifest says {f['size']}")
    if deep and not wrong:
        wrong = payload.verify(m)
    if wrong:
        return Check(
            "payload",
            "problem",
            f"{len(wrong)} extracted file(s) differ from the manifest: " + "; ".join(wrong[:3]),
            "python -m kt_kernel.payload materialize (re-extracts an entry that differs)",
            data=data,
        )
    how = "sizes and sha256" if deep else "sizes"
    return Check("payload", "ok", f"{len(m.files)} files in {final} match the manifest ({how})", data=data)


def _environment_libraries() -> dict[str, Path]:
    """Every shared library installed in this environment's site-packages, by file name."""
    import site
    import sysconfig

    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    libs: dict[str, Path] = {}
    for root in sorted(roots):
        for so in sorted(Path(root).rglob("*.so*")):
            if so.is_file() and ".so" in so.name:
                libs.setdefault(so.name, so)
    return libs


def _major(name: str) -> tuple[str, str] | None:
    m = re.fullmatch(r"(lib[A-Za-z0-9_+-]+\.so)\.(\d+)(?:\..*)?", name)
    return (m.group(1), m.group(2)) if m else None


def _ldd(files: list[Path], env: dict[str, Path], *flags: str) -> dict[Path, str]:
    """file -> what `ldd FLAGS file` says (stdout and stderr), this environment's library folders first on the
    loader's path."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise FileNotFoundError("ldd is not installed (glibc's libc-bin)")
    path = ":".join(sorted({str(p.parent) for p in env.values()}))
    run_env = {**os.environ, "LD_LIBRARY_PATH": ":".join(x for x in (path, os.environ.get("LD_LIBRARY_PATH")) if x)}
    out = {}
    for f in files:
        proc = subprocess.run([ldd, *flags, str(f)], capture_output=True, text=True, check=False, env=run_env)
        out[f] = proc.stdout + proc.stderr
    return out


def _not_found(text: str) -> list[str]:
    return [ln.split()[0] for ln in text.splitlines() if "=> not found" in ln]


def unresolved(files: list[Path], env: dict[str, Path]) -> dict[str, list[str]]:
    """file -> the DT_NEEDED entries the dynamic loader (`ldd`) cannot find, with this environment's
    library folders on its path; the driver's libraries aside."""
    out: dict[str, list[str]] = {}
    for f, text in _ldd(files, env).items():
        if missing := [n for n in _not_found(text) if n not in DRIVER]:
            out[str(f)] = missing
    return out


_UNDEFINED = re.compile(r"^undefined symbol: (\S+?)(?:, version (\S+))?\t\((.+)\)$")


def undefined_symbols(files: list[Path], env: dict[str, Path]) -> dict[str, list[str]]:
    """file -> the undefined symbols of that file the dynamic loader binds nowhere (`ldd -r`: it loads the file's
    libraries with the environment's library folders on its path and performs every relocation, running no
    code of theirs). Python's own symbols (Py*, bound by the interpreter that imports it) aside, and the
    driver's API (cu*, nvml*) where its library is absent (a machine without a GPU)."""
    out: dict[str, list[str]] = {}
    for f, text in _ldd(files, env, "-r").items():
        absent = set(_not_found(text)) & DRIVER
        names = []
        for ln in text.splitlines():
            m = _UNDEFINED.match(ln.strip())
            if m is None or Path(m.group(3)) != f or m.group(1).startswith(("Py", "_Py")):
                continue
            if any(re.match(DRIVER_API[lib], m.group(1)) for lib in absent):
                continue
            names.append(m.group(1) + (f"@{m.group(2)}" if m.group(2) else ""))
        if names:
            out[str(f)] = sorted(set(names))
    return out


def _demangled(names: list[str]) -> list[str]:
    """C++ names as people read them (binutils' c++filt, where this machine has it)."""
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        return names
    got = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=False)
    lines = got.stdout.splitlines()
    return lines if got.returncode == 0 and len(lines) == len(names) else names


def _torch_pin() -> tuple[str, str]:
    """(the torch installed here, the torch the release's torch-built wheels require exactly), each "" if none."""
    from importlib import metadata

    try:
        have = metadata.version("torch")
    except metadata.PackageNotFoundError:
        have = ""
    for dist in ("sglang-kernel-kt", "sgl-deep-gemm-kt", "sglang-kt"):
        try:
            reqs = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for r in reqs:
            m = re.match(r"torch\s*==\s*([^;,\s]+)\s*(;.*)?$", r)
            if m and "extra" not in (m.group(2) or ""):
                return have, m.group(1)
    return have, ""


def _torch_built() -> list[Path]:
    """The installed ELF files of the release's wheels built against torch (sgl-deep-gemm-kt's extension)."""
    from importlib import metadata

    out = []
    for dist in ("sgl-deep-gemm-kt",):
        try:
            d = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        out += [Path(str(d.locate_file(f))) for f in d.files or [] if str(f).endswith(".so")]
    return [p for p in out if p.is_file() and _is_elf(p)]


def check_symbols(found: tuple[Any, Any] | Check) -> Check:
    """Every undefined symbol of the payload's libraries (and of the release's other torch-built extensions) binds
    in what this environment holds: the failure `import sgl_kernel` meets beside another torch."""
    files = _torch_built()
    where = Path("/")
    if not isinstance(found, Check):
        payload, m = found
        final = payload.target_dir(m)
        if (final / payload.COMPLETE).is_file():
            where = final
            files += [p for p in sorted(final.rglob("*")) if p.is_file() and not p.is_symlink() and _is_elf(p)]
    if not files:
        return Check("symbols", "skipped", "no materialized payload and no torch-built extension of the release here")
    missing = undefined_symbols(files, _environment_libraries())
    have, want = _torch_pin()
    data: dict[str, Any] = {"files": len(files), "torch": have, "release_torch": want, "unresolved": missing}
    if not missing:
        return Check(
            "symbols", "ok", f"every undefined symbol of {len(files)} libraries binds here (torch {have})", data=data
        )
    lines = []
    for f, names in missing.items():
        shown = _demangled(names[:3])
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        inside = where != Path("/") and Path(f).is_relative_to(where)
        name = Path(f).relative_to(where) if inside else Path(Path(f).parent.name) / Path(f).name
        lines.append(f"{name}: {len(names)} symbols bind nowhere ({'; '.join(shown)}{more})")
    torch = f"torch {have} is installed, the release needs torch=={want}" if want and have != want else ""
    restore = (
        f"pip install --force-reinstall --no-deps torch=={want} (from the index the release's install file names), "
        "or reinstall the profile: pip install --require-hashes -r serve-cp3XX.txt"
        if want
        else "reinstall the profile as the release locks it: pip install --require-hashes -r serve-cp3XX.txt"
    )
    detail = (f"{torch}: " if torch else "") + "; ".join(lines[:4])
    return Check("symbols", "problem", detail, restore, data=data)


def check_needed(found: tuple[Any, Any] | Check) -> Check:
    if isinstance(found, Check):
        return replace(found, name="needed")
    payload, m = found
    final = payload.target_dir(m)
    if not (final / payload.COMPLETE).is_file():
        return Check(
            "needed",
            "skipped",
            f"the payload is not materialized in {final}",
            "python -m kt_kernel.payload materialize",
        )
    files = [p for p in sorted(final.rglob("*")) if p.is_file() and not p.is_symlink() and _is_elf(p)]
    env = _environment_libraries()
    missing = unresolved(files, env)
    data: dict[str, Any] = {
        "libraries": len(files),
        "unresolved": {str(Path(k).relative_to(final)): v for k, v in missing.items()},
    }
    if not missing:
        return Check(
            "needed",
            "ok",
            f"every DT_NEEDED of {len(files)} extracted libraries resolves here (the driver aside)",
            data=data,
        )
    majors = {k: m for k in env if (m := _major(k)) is not None}
    lines = []
    for f, names in missing.items():
        for n in names:
            want = _major(n)
            have = sorted(k for k, m in majors.items() if want and m[0] == want[0] and m[1] != want[1])
            where = f"; this environment has {', '.join(have)} (another CUDA major)" if have else ""
            lines.append(f"{Path(f).relative_to(final)} needs {n}{where}")
    cuda_major = any("another CUDA major" in ln for ln in lines)
    install = "pip install --require-hashes -r serve-cp3XX.txt (the release's install file)"
    fix = (
        f"install the torch the release pins, whose NVIDIA libraries are the payload's CUDA major: {install}"
        if cuda_major
        else f"install the serve profile as the release locks it: {install}"
    )
    return Check("needed", "problem", "; ".join(lines[:5]), fix, data=data)


def _is_elf(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"\x7fELF"


def check_gpu(found: tuple[Any, Any] | Check) -> Check:
    try:
        import torch
    except ImportError:
        return Check("gpu", "skipped", "torch is not installed here")
    if not torch.cuda.is_available():
        return Check("gpu", "skipped", "no CUDA device: torch.cuda.is_available() is False on this machine")
    if isinstance(found, Check):
        return replace(found, name="gpu")
    _, m = found
    wrong, devices = [], []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        cc = major * 10 + minor
        devices.append(f"{torch.cuda.get_device_name(i)} sm_{cc}")
        for name, f in sorted(m.files.items()):
            if f.get("sass") and all(a.endswith("a") for a in f["sass"]) and not f.get("ptx"):
                continue  # an arch-specific library (sm_90a): its loader takes it only on that arch
            sass = {int(re.sub(r"\D", "", a)) for a in f.get("sass", [])}
            ptx = {int(re.sub(r"\D", "", a)) for a in f.get("ptx", [])}
            if (
                (sass or ptx)
                and cc not in sass
                and not any(p <= cc for p in ptx)
                and not any(s // 10 == major and s <= cc for s in sass)
            ):
                have = f"SASS {sorted(f.get('sass', []))}, PTX {sorted(f.get('ptx', []))}"
                wrong.append(f"{name} has no kernel for sm_{cc} ({have})")
    if wrong:
        return Check(
            "gpu", "problem", "; ".join(wrong[:3]), "use a GPU of the release's CUDA matrix", data={"devices": devices}
        )
    ops = []
    from kt_kernel import cuda

    logits = torch.randn(8, 16, device="cuda")
    _, weights = cuda.router_topk(logits, 2)
    want = torch.softmax(logits, dim=-1).topk(2, dim=-1).values
    want = want / want.sum(dim=-1, keepdim=True)
    if not torch.allclose(weights.float().sort(dim=-1).values, want.sort(dim=-1).values, atol=1e-4):
        wrong.append("kt_kernel.cuda.router_topk differs from torch's softmax top-k")
    ops.append(f"kt_kernel.cuda.router_topk ({cuda.load().arch})")
    import sgl_kernel  # the payload's loader puts its binaries on the package path

    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    out = torch.empty(4, 128, device="cuda", dtype=torch.float16)
    sgl_kernel.silu_and_mul(x, out)
    ref = torch.nn.functional.silu(x[:, :128].float()) * x[:, 128:].float()
    if not torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2):
        wrong.append("sgl_kernel.silu_and_mul differs from torch")
    ops.append("sgl_kernel.silu_and_mul")
    torch.cuda.synchronize()
    state = "problem" if wrong else "ok"
    detail = "; ".join(wrong) or f"{', '.join(devices)}: {', '.join(ops)} match torch"
    return Check(
        "gpu",
        state,
        detail,
        "report it with `kt-doctor --run --json`" if wrong else "",
        data={"devices": devices, "ops": ops},
    )


def run(deep: bool = False) -> list[Check]:
    """Every check, in order; the payload's manifest is read once for the three that need it."""
    checks = [_timed("cpu", check_cpu)]
    found: tuple[Any, Any] | Check
    try:
        found = _payload()
    except Exception as exc:  # as _timed does: a finding, never a crashed doctor
        found = Check("payload", "problem", f"{type(exc).__name__}: {exc}", "report it with `kt-doctor --run --json`")
    checks.append(_timed("payload", lambda: check_payload(found, deep)))
    checks.append(_timed("needed", lambda: check_needed(found)))
    checks.append(_timed("symbols", lambda: check_symbols(found)))
    checks.append(_timed("gpu", lambda: check_gpu(found)))
    return checks


def render(checks: list[Check]) -> str:
    lines = ["", f"{'check':<8} {'state':<8} {'seconds':>7}  detail"]
    for c in checks:
        lines.append(f"{c.name:<8} {c.state:<8} {c.seconds:>7}  {c.detail}")
        if c.fix and c.state != "ok":
            lines.append(f"{'':<26}fix: {c.fix}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - run through kt-doctor --run
    sys.exit("run kt-doctor --run")
