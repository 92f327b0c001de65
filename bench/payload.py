"""The multi-carrier CUDA payload, measured side by side with the reference approach.

The reference is the shape KTransformers 0.7.2 ships: a gzip tar cut into parts; at
first use the parts are concatenated into one temporary payload.tar.gz, the whole
archive is hashed, extracted, every file hashed, renamed into the cache; and every
later call re-hashes every file. Both run here on the same files (the release's real
sgl_kernel and kt-kernel CUDA binaries, read back out of dist/), in one run:

    python -m bench.payload --dist dist [--assembly] [--json build/bench-payload.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base import cachedir, distdir, paths
from base.cli import dist_option
from base.errors import StageError, report
from base.keys import file_sha256
from base.paths import ROOT

from . import results
from .errors import BenchError

RUNTIME = ROOT / "kernel" / "python" / "kt_kernel" / "payload.py"
_CHUNK = 1 << 20


def manifest_member() -> str:
    """The payload manifest's member (`[payload] manifest_member` of the audit policy, its owner)."""
    from audits.policy import load_policy

    payload = load_policy().payload
    if payload is None:
        raise BenchError("the audit policy has no [payload] table; the release has no CUDA payload to measure")
    return payload.manifest_member


def _say(msg: str) -> None:
    print(f"[bench-payload] {msg}", flush=True)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class DiskPeak:
    """Polls the bytes under some directories while a step runs; keeps the maximum."""

    def __init__(self, *dirs: Path) -> None:
        self.dirs, self.peak, self._stop = dirs, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, sum(_du(d) for d in self.dirs))
            time.sleep(0.05)

    def __enter__(self) -> DiskPeak:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, sum(_du(d) for d in self.dirs))


def installed_site(dist: Path, site: Path) -> tuple[Path, dict[str, Any]]:
    """A site directory as pip would leave it: each part carrier's part member and .dist-info."""
    (provider,) = dist.glob("sglang_kernel_kt-*.whl")
    with zipfile.ZipFile(provider) as zf:
        manifest: dict[str, Any] = json.loads(zf.read(manifest_member()))
    for part in manifest["parts"]:
        norm = part["distribution"].replace("-", "_")
        # a carrier built per CPython (sglang-kt) carries the same part in each of its wheels
        wheels = sorted(dist.glob(f"{norm}-{part['version']}-*.whl"))
        if not wheels:
            raise BenchError(
                f"{dist} has no {part['distribution']} {part['version']} wheel (payload part {part['index']})"
            )
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(part["member"]) as src:
            target = site / part["member"]
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
        di = site / f"{norm}-{part['version']}.dist-info"
        di.mkdir(parents=True, exist_ok=True)
        (di / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {part['distribution']}\nVersion: {part['version']}\n"
        )
        (di / "RECORD").write_text(f"{part['member']},,\n")
    path = site / manifest_member()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path, manifest


_OURS = """
import importlib.util, json, sys, time
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("kt_payload", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules["kt_payload"] = m; spec.loader.exec_module(m)
t1 = time.perf_counter()
out = m.materialize(m.Path(sys.argv[2]), m.Path(sys.argv[3]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "call_s": t2 - t1, "dir": str(out)}))
"""


def ours(site: Path, manifest: Path, cache: Path) -> dict[str, Any]:
    """Cold materialization of the lazy CUDA archive by kt_kernel.payload in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _OURS, str(RUNTIME), str(manifest), str(cache)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def reference_pack(files: Path, names: list[str], out: Path, parts: int) -> tuple[list[Path], str, dict[str, str]]:
    """The reference archive: gzip tar (level 6), cut into `parts` equal slices."""
    tgz = out / "payload.tar.gz"
    with tarfile.open(tgz, "w:gz", compresslevel=6) as tar:
        for n in names:
            tar.add(files / n, arcname=n)
    size = tgz.stat().st_size
    step = -(-size // parts)
    paths = []
    with tgz.open("rb") as fh:
        for i in range(parts):
            p = out / f"payload.part{i}"
            p.write_bytes(fh.read(step))
            paths.append(p)
    digest = file_sha256(tgz)
    tgz.unlink()
    return paths, digest, {n: file_sha256(files / n) for n in names}


def reference_materialize(parts: list[Path], digest: str, hashes: dict[str, str], cache: Path) -> None:
    """Concatenate into a temp archive, hash it, extract, hash every file, rename into the cache."""
    final = cache / digest
    if final.exists():
        reference_warm(final, hashes)
        return
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        tgz = Path(tmp) / "payload.tar.gz"
        with tgz.open("wb") as out:
            for p in parts:
                with p.open("rb") as src:
                    shutil.copyfileobj(src, out, _CHUNK)
        if file_sha256(tgz) != digest:
            raise BenchError("reference archive hash mismatch")
        dest = Path(tmp) / "x"
        with tarfile.open(tgz, "r:gz") as tar:
            tar.extractall(dest, filter="data")
        for n, h in hashes.items():
            if file_sha256(dest / n) != h:
                raise BenchError(f"reference: {n} hash mismatch")
        dest.rename(final)


def reference_warm(final: Path, hashes: dict[str, str]) -> None:
    """The gzip reference's warm path: every extracted file re-hashed against its manifest."""
    for n, h in hashes.items():
        if file_sha256(final / n) != h:
            raise BenchError(f"reference: {n} hash mismatch")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def audit_numbers(dist: Path) -> dict[str, Any]:
    """The audit of dist/ in a fresh process: passed, seconds and peak RSS (its own and its tools')."""
    code = (
        "import json, resource, time, sys; from pathlib import Path; from audits import core, load_policy; "
        "t=time.perf_counter(); r=core.run([Path(sys.argv[1])], load_policy()); "
        "print(json.dumps({'passed': r['passed'], 'seconds': time.perf_counter()-t, "
        "'self_peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, "
        "'children_peak_rss_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024}))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(dist)], capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def assembly_numbers(kernel: Path) -> dict[str, Any]:
    """A cold and a warm assembly of the carriers around `kernel`, timed."""
    cache = paths.INPUTS_CACHE / paths.PAYLOAD_FRAMES
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("cold", "warm"):
            if label == "cold":  # the assembly's own frames and archives only: never a user's file there
                cachedir.prune(cache, re.compile(paths.PAYLOAD_NAMES), max_count=0)
            t, _ = timed(
                lambda: subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "carriers",
                        "assemble",
                        "--kernel",
                        str(kernel),
                        "--dist",
                        str(Path(tmp) / "dist"),
                    ],
                    check=True,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                )
            )
            out[f"{label}_s"] = round(t, 1)
            _say(f"assembly {label}: {t:.1f}s")
    return out


def _main(argv: list[str] | None) -> int:
    """`nox -s bench -- --only payload`: payload size, materialization and audit numbers."""
    p = argparse.ArgumentParser(prog="python -m bench.payload", description=__doc__.splitlines()[0])
    dist_option(p)
    p.add_argument("--kernel", type=Path, default=paths.KERNEL_OUT)
    p.add_argument("--assembly", action="store_true", help="also time a cold and a warm assembly (minutes)")
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["payload"])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds beside KTransformers (default: 3)")
    p.add_argument("--no-anchor", action="store_true", help="skip the comparison with KTransformers 0.7.2's carriers")
    p.add_argument("--no-doc", action="store_true", help="do not write the comparison's table into docs/payload.md")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error(f"--rounds {args.rounds}: the comparison needs at least 3 interleaved rounds (fewer make no median)")
    if not list(args.dist.glob("sglang_kernel_kt-*.whl")):
        print(f"error: {args.dist} holds no release with a CUDA payload; run nox -s build_all first", file=sys.stderr)
        return 2
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kt-bench-") as tmp_s:
        tmp = Path(tmp_s)
        manifest_path, m = installed_site(args.dist, tmp / "site")
        names = sorted(m["files"])
        extracted = sum(f["size"] for f in m["files"].values())
        biggest_part = max(p["size"] for p in m["parts"])
        _say(f"ours: cold materialization of {extracted / 2**20:.0f} MiB from {len(m['parts'])} parts")
        with DiskPeak(tmp / "cache-ours") as disk:
            cold = ours(tmp / "site", manifest_path, tmp / "cache-ours")
        warm = ours(tmp / "site", manifest_path, tmp / "cache-ours")
        files = Path(cold["dir"])
        _say("reference: gzip-6 tar of the same files (single thread, as tarfile does)")
        ref_dir = tmp / "ref"
        ref_dir.mkdir()
        pack_s, (ref_parts, ref_digest, ref_hashes) = timed(lambda: reference_pack(files, names, ref_dir, 5))
        ref_bytes = sum(p.stat().st_size for p in ref_parts)
        _say("reference: cold materialization")
        with DiskPeak(tmp / "cache-ref") as ref_disk:
            ref_cold, _ = timed(lambda: reference_materialize(ref_parts, ref_digest, ref_hashes, tmp / "cache-ref"))
        ref_warm, _ = timed(lambda: reference_materialize(ref_parts, ref_digest, ref_hashes, tmp / "cache-ref"))
        res["payload"] = {
            "files": len(names),
            "extracted_bytes": extracted,
            "ours_bytes": m["archive"]["size"],
            "reference_gzip_bytes": ref_bytes,
            "bytes_ratio": round(m["archive"]["size"] / ref_bytes, 3),
            "reference_pack_s": round(pack_s, 1),
            "ours_cold_s": round(cold["process_s"], 2),
            "reference_cold_s": round(ref_cold, 2),
            "cold_ratio": round(cold["process_s"] / ref_cold, 3),
            "ours_warm_call_ms": round(1000 * warm["call_s"], 2),
            "ours_warm_process_ms": round(1000 * warm["process_s"], 1),
            "reference_warm_ms": round(1000 * ref_warm, 1),
            "ours_peak_disk_bytes": disk.peak,
            "reference_peak_disk_bytes": ref_disk.peak,
            "disk_limit_bytes": extracted + biggest_part,
        }
    dist_manifest = distdir.read_manifest(args.dist / distdir.MANIFEST)
    from audits import load_policy

    budget = load_policy().wheel_budget_bytes
    res["wheels"] = [
        {"filename": w.filename, "bytes": w.size, "budget_pct": round(100 * w.size / budget, 1)}
        for w in dist_manifest.wheels
    ]
    _say("auditing dist/ (payload streamed, every archived ELF inspected)")
    res["audit"] = audit_numbers(args.dist)
    if args.assembly:
        res["assembly"] = assembly_numbers(args.kernel)
    results.write(args.json, res)
    pl = res["payload"]
    print(
        f"payload bytes: ours {pl['ours_bytes'] / 1e6:.1f} MB vs gzip {pl['reference_gzip_bytes'] / 1e6:.1f} MB "
        f"({pl['bytes_ratio']:.2f}x, goal <= 0.55x)"
    )
    print(
        f"cold materialization: ours {pl['ours_cold_s']:.1f} s vs reference {pl['reference_cold_s']:.1f} s "
        f"({pl['cold_ratio']:.2f}x, goal <= 0.33x)"
    )
    print(
        f"warm check: ours {pl['ours_warm_call_ms']:.1f} ms in-process ({pl['ours_warm_process_ms']:.0f} ms for a new "
        f"process, interpreter included) vs reference {pl['reference_warm_ms']:.0f} ms (goal <= 50 ms)"
    )
    print(
        f"peak extra disk: ours {pl['ours_peak_disk_bytes'] / 2**20:.0f} MiB, reference "
        f"{pl['reference_peak_disk_bytes'] / 2**20:.0f} MiB (goal <= {pl['disk_limit_bytes'] / 2**20:.0f} MiB)"
    )
    for w in res["wheels"]:
        print(f"  {w['filename']:<72} {w['bytes'] / 2**20:7.2f} MiB  {w['budget_pct']:5.1f}% of budget")
    a = res["audit"]
    print(
        f"audit of dist/: {a['seconds']:.1f} s, peak RSS {a['self_peak_rss_mib']:.0f} MiB (cuobjdump child "
        f"{a['children_peak_rss_mib']:.0f} MiB), passed={a['passed']} (goal <= 60 s, <= 512 MiB)"
    )
    if "assembly" in res:
        print(f"assembly: cold {res['assembly']['cold_s']} s, warm {res['assembly']['warm_s']} s")
    if not args.no_anchor:
        from . import payload_anchor

        _say("beside KTransformers 0.7.2's own carriers, installed as users get them")
        try:
            res["anchor"] = payload_anchor.run(args.dist, args.rounds)
            lines = payload_anchor.table(res["anchor"])
        except payload_anchor.Unreachable as exc:  # said in the table, never a number that means something else
            res["anchor"] = {"not_measured": str(exc)}
            lines = payload_anchor.not_measured(str(exc))
        print("\n".join(lines))
        if not args.no_doc:
            payload_anchor.write_doc(lines)
            print(f"wrote the table into {payload_anchor.DOC}")
        results.write(args.json, res)
    print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The CLI: errors a user can fix are one `error:` line and exit 1, never a traceback."""
    try:
        return _main(argv)
    except (StageError, OSError) as exc:
        return report(exc)


if __name__ == "__main__":
    raise SystemExit(main())
