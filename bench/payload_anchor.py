"""The CUDA payload beside KTransformers 0.7.2's own, in one run: both installed as users get them, each
materialized by its own runtime, cold and warm, interleaved round by round, with `zstd -d` of our stream as
the floor of what any extraction of ours can cost.

- KT: its five carrier wheels from PyPI (bench/anchor_payload.toml: URL and sha256; cached in
  build/cache/anchor-kt), installed with `--no-deps` into a fresh venv; its runtime (sgl_kernel's
  payload_runtime, bench/payload_kt.py) materializes into a fresh SGL_KERNEL_KT_CACHE_DIR.
- ours: the release's part carriers and the manifest's provider from dist/ (CPython 3.11) and zstandard
  (pinned by hash in dist/install/serve-cp311.txt), installed into a fresh venv; the installed
  kt_kernel/payload.py's `materialize` (run by its path, so kt_kernel's torch import is not timed, as
  KT's probe does not import sgl_kernel's ops) into a fresh KT_KERNEL_CACHE_DIR.
- the floor: `zstd -d --long=31` of our parts joined (the stream ours decompresses) into a file beside it.

Cold: a fresh cache directory, and every part evicted from the page cache first (posix_fadvise
DONTNEED, then checked with util-linux's fincore); where the pages stay (or fincore is missing) the table
says so. Warm: the same call again. Each measurement runs in a child process (wall time, peak RSS from
wait4, read by a small interpreter between this process and the command); the CPU time other processes
used meanwhile is kept, and a busy machine is said in the table, never hidden. Before each run the
previous one's written pages are flushed (sync), so no run pays for another's writeback.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import tomllib

from base import distdir, paths, swap
from base.keys import file_sha256
from base.paths import ROOT

from .errors import BenchError

WHEELS = Path(__file__).with_name("anchor_payload.toml")
KT_PROBE = Path(__file__).with_name("payload_kt.py")
CACHE = paths.CACHE / "anchor-kt"
WORK = paths.BUILD / "bench-payload"
DOC = ROOT / "docs" / "payload.md"
BEGIN, END = "<!-- bench payload beside KTransformers: begin -->", "<!-- bench payload beside KTransformers: end -->"
PYTHON = "3.11"


class Unreachable(BenchError):
    """KTransformers' wheels could not be downloaded: the comparison is not measured, and says so."""


def say(msg: str) -> None:
    print(f"[bench-payload] {msg}", flush=True)


def fetch_kt() -> list[Path]:
    """KTransformers 0.7.2's carrier wheels, downloaded once and checked against their sha256."""
    entries = tomllib.loads(WHEELS.read_text())["wheel"]
    CACHE.mkdir(parents=True, exist_ok=True)
    out = []
    for e in entries:
        path = CACHE / e["file"]
        if not path.is_file() or file_sha256(path) != e["sha256"]:
            say(f"downloading {e['file']} ...")
            tmp = swap.part(path)
            try:
                with urllib.request.urlopen(e["url"], timeout=300) as resp, tmp.open("wb") as fh:  # noqa: S310
                    shutil.copyfileobj(resp, fh, 1 << 20)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise Unreachable(f"cannot download {e['url']}: {exc}; the comparison needs PyPI") from None
            if file_sha256(tmp) != e["sha256"]:
                tmp.unlink(missing_ok=True)
                raise BenchError(f"{e['file']}: the download's sha256 is not {e['sha256']} ({WHEELS.name})")
            tmp.replace(path)
        out.append(path)
    return out


# The installed runtime module run by its path, so neither side pays for importing torch:
# `python -m kt_kernel.payload` would import kt_kernel (numpy, torch) first, and the
# KTransformers probe likewise calls its payload step without importing sgl_kernel's ops.
OURS_PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kt_kernel_payload", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)
raise SystemExit(m.main(sys.argv[2:]))
"""


def _venv(where: Path, requirements: list[str]) -> Path:
    """A fresh venv at `where` with `requirements` installed by pip, --no-deps; its python."""
    shutil.rmtree(where, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    got = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", *requirements],
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        raise BenchError(f"installing into {where} failed:\n{got.stderr[-2000:]}")
    return python


def our_wheels(dist: Path) -> tuple[list[Path], list[str]]:
    """(the release's part carriers and the manifest's provider for CPython 3.11, zstandard's pin lines)."""
    release = distdir.open_release(dist)
    payload = release.manifest.payload
    if payload is None:
        raise BenchError(f"{dist} has no CUDA payload; run nox -s build_all first")
    names = {p.distribution for p in payload.parts}
    wheels = []
    for w in release.wheels_for(PYTHON):
        with zipfile.ZipFile(dist / w.filename) as zf:
            provider = any(n.endswith("/_kt_payload.json") for n in zf.namelist())
        if w.name in names or provider:
            wheels.append(dist / w.filename)
    install, _ = release.install_file("serve", PYTHON)
    text = install.read_text()
    start = text.index("\nzstandard==") + 1
    end = text.find("\n", text.find("--hash", start) + 1)
    while text[end + 1 : end + 5] == "    ":  # the pin's continuation lines (its other hashes)
        end = text.find("\n", end + 1)
    pin = [ln.strip().rstrip("\\").strip() for ln in text[start:end].splitlines()]
    return wheels, pin


def evict(files: list[Path]) -> str:
    """Drop `files` from the page cache; "" when fincore confirms none of their pages stay, else why not."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # a page still dirty (pip or this bench just wrote it) is not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    fincore = shutil.which("fincore")
    if fincore is None:
        return "not checked (no fincore: util-linux)"
    got = subprocess.run(
        [fincore, "--bytes", "--noheadings", "--raw", *map(str, files)], check=False, capture_output=True, text=True
    )
    resident = sum(int(line.split()[0]) for line in got.stdout.splitlines() if line.split())
    return "" if got.returncode == 0 and resident == 0 else f"{resident / 2**20:.0f} MiB stayed in the page cache"


# A peak RSS read by wait4 in this process would start at this process's own (Linux carries the
# parent's high-water mark across fork and exec into the child's ru_maxrss): a small interpreter
# started with -S forks and times the command and reads its wait4, so the floor is its own ~10 MiB.
_PEAK = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
s = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump({"s": s, "rss_kib": usage.ru_maxrss, "rc": os.waitstatus_to_exitcode(status)}, f)
"""


def _busy_s() -> float | None:
    """CPU seconds every process of the machine has used since boot (/proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
    ticks = [int(x) for x in fields]
    return (sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)) / os.sysconf("SC_CLK_TCK")


def measured(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Wall time and peak RSS of one command, what it printed, and how many CPUs other processes kept busy
    meanwhile (the machine's busy time from /proc/stat less the command's own CPU time from wait4)."""
    with tempfile.TemporaryDirectory() as tmp:
        result, outf, errf = Path(tmp) / "peak.json", Path(tmp) / "stdout", Path(tmp) / "stderr"
        os.sync()  # the previous run's dirty pages are written back now, not while this one runs
        before = _busy_s()
        with outf.open("wb") as out, errf.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _PEAK, str(result), *cmd], env=env, stdout=out, stderr=err
            )
            _, status, usage = os.wait4(proc.pid, 0)
        after = _busy_s()
        rc = proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must know
        peak = json.loads(result.read_text()) if result.exists() else {"rc": rc}
        if rc != 0 or peak["rc"] != 0:
            raise BenchError(
                f"{' '.join(cmd[:3])} failed (exit {peak['rc']}):\n{errf.read_text(errors='replace')[-2000:]}"
            )
        printed = outf.read_text(errors="replace").strip()
    others = None
    if before is not None and after is not None and peak["s"] > 0:
        own = usage.ru_utime + usage.ru_stime
        others = max(0.0, (after - before - own) / peak["s"])
    return {
        "s": peak["s"],
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "sys_s": usage.ru_stime,
        "minflt": usage.ru_minflt,
        "rss_mib": peak["rss_kib"] / 1024,
        "others_cpus": others,
        "out": printed,
    }


def run(dist: Path, rounds: int = 3) -> dict[str, Any]:
    """Install both sides, then `rounds` interleaved rounds of cold and warm materialization and the floor."""
    kt_wheels = fetch_kt()
    ours_wheels, zstd_pin = our_wheels(dist)
    WORK.mkdir(parents=True, exist_ok=True)
    say(f"installing KTransformers 0.7.2's {len(kt_wheels)} carriers into a fresh venv ...")
    kt_python = _venv(WORK / "kt", [str(w) for w in kt_wheels])
    say(f"installing our {len(ours_wheels)} payload wheels into a fresh venv ...")
    req = WORK / "ours.txt"
    # hashed like every install of the release: the wheels by their bytes, zstandard by its lock's pin
    req.write_text("".join(f"{w} --hash=sha256:{file_sha256(w)}\n" for w in ours_wheels) + " ".join(zstd_pin) + "\n")
    ours_python = _venv(WORK / "ours", ["-r", str(req)])
    manifest = distdir.open_release(dist).manifest.payload
    assert manifest is not None
    our_parts = [
        WORK / "ours" / "lib" / f"python{PYTHON}" / "site-packages" / p for p in _our_part_members(ours_wheels)
    ]
    kt_parts = sorted((WORK / "kt" / "lib" / f"python{PYTHON}" / "site-packages").glob("*/payload.part"))
    stream = WORK / "ours-stream.tar.zst"
    with stream.open("wb") as out:
        for p in our_parts:
            with p.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    zstd = shutil.which("zstd")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KT_KERNEL_CACHE", "SGL_KERNEL_KT"))}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in ("ours cold", "ours warm", "kt cold", "kt warm", "floor")}
    eviction: list[str] = []
    ours_runtime = WORK / "ours" / "lib" / f"python{PYTHON}" / "site-packages" / "kt_kernel" / "payload.py"
    sides = ["ours", "kt", "floor"]
    for r in range(rounds):
        for side in sides[r % 3 :] + sides[: r % 3]:  # interleaved: each side first in some round
            cache = WORK / f"cache-{side}-{r}"
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)
            if side == "ours":
                eviction.append(evict(our_parts))
                env = {**base, "KT_KERNEL_CACHE_DIR": str(cache)}
                cmd = [str(ours_python), "-c", OURS_PROBE, str(ours_runtime), "materialize"]
            elif side == "kt":
                eviction.append(evict(kt_parts))
                env = {**base, "SGL_KERNEL_KT_CACHE_DIR": str(cache)}
                cmd = [str(kt_python), str(KT_PROBE)]
            else:
                if zstd is None:
                    continue
                eviction.append(evict([stream]))
                env, cmd = base, [zstd, "-d", "-q", "-f", "--long=31", str(stream), "-o", str(cache / "out.tar")]
            say(f"round {r + 1}/{rounds}: {side} cold ...")
            rows[f"{side} cold" if side != "floor" else "floor"].append(measured(cmd, env))
            if side != "floor":
                rows[f"{side} warm"].append(measured(cmd, env))
            shutil.rmtree(cache, ignore_errors=True)
    return {
        "rows": {
            k: [{x: round(v, 3) if isinstance(v, float) else v for x, v in m.items() if x != "out"} for m in ms]
            for k, ms in rows.items()
        },
        "eviction": sorted({e for e in eviction if e}),
        "floor": "zstd -d --long=31 of our parts joined, into a file" if zstd else "no zstd on PATH: not measured",
        "ours_stream_mib": round(stream.stat().st_size / 2**20, 1),
        "kt_parts_mib": round(sum(p.stat().st_size for p in kt_parts) / 2**20, 1),
        "extracted_mib": round(manifest.extracted_size / 2**20, 1),
        "kt_parts": len(kt_parts),
        "host": _host(),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
    }


def _our_part_members(wheels: list[Path]) -> list[str]:
    """Our part members in the order the provider's manifest joins them."""
    for w in wheels:
        with zipfile.ZipFile(w) as zf:
            name = next((n for n in zf.namelist() if n.endswith("/_kt_payload.json")), None)
            if name:
                return [p["member"] for p in json.loads(zf.read(name))["parts"]]
    raise BenchError("no wheel of the release holds the payload manifest")


def _host() -> str:
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{model}, {os.cpu_count()} CPUs"


def summary(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """min/median/max seconds and the peak RSS of each row."""
    out = {}
    for k, ms in res["rows"].items():
        if ms:
            s = [m["s"] for m in ms]
            out[k] = {
                "min": min(s),
                "median": statistics.median(s),
                "max": max(s),
                "rss": max(m["rss_mib"] for m in ms),
                "cpu": statistics.median(m["cpu_s"] for m in ms),
                "sys": (min(m["sys_s"] for m in ms), max(m["sys_s"] for m in ms)),
            }
    return out


def table(res: dict[str, Any]) -> list[str]:
    """The Markdown table and what it rests on."""
    s = summary(res)
    seen = [m["others_cpus"] for ms in res["rows"].values() for m in ms if m.get("others_cpus") is not None]
    busy = max(seen, default=None)
    lines = [
        f"Measured {res['date']} on {res['host']} (Python {res['python']}) by `nox -s bench -- --only payload`: "
        f"{len(res['rows']['ours cold'])} interleaved rounds; our stream {res['ours_stream_mib']} MiB, KTransformers' "
        f"{res['kt_parts']} parts {res['kt_parts_mib']} MiB, {res['extracted_mib']} MiB extracted.",
        "",
        "| | min s | median s | max s | CPU s (median) | of it kernel s (min-max) | peak RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in ("ours cold", "kt cold", "floor", "ours warm", "kt warm"):
        if k in s:
            v = s[k]
            name = {
                "kt cold": "KTransformers 0.7.2 cold",
                "kt warm": "KTransformers 0.7.2 warm",
                "floor": f"floor: {res['floor']}",
            }.get(k, k)
            lines.append(
                f"| {name} | {v['min']:.2f} | {v['median']:.2f} | {v['max']:.2f} | {v['cpu']:.2f} "
                f"| {v['sys'][0]:.2f}-{v['sys'][1]:.2f} | {v['rss']:.0f} |"
            )
    lines.append("")

    def bar(ratio: float, limit: float) -> str:
        return f"{ratio:.3f}x (bar <= {limit}x: {'met' if ratio <= limit else 'NOT MET'})"

    if "kt cold" in s:
        lines.append(
            f"- cold, ours / KTransformers (medians): {bar(s['ours cold']['median'] / s['kt cold']['median'], 0.15)}"
        )
    if "floor" in s:
        lines.append(f"- cold, ours / the floor (medians): {bar(s['ours cold']['median'] / s['floor']['median'], 1.3)}")
    if "kt warm" in s:
        lines.append(
            f"- warm, ours / KTransformers (medians): {s['ours warm']['median'] / s['kt warm']['median']:.3f}x"
        )
    lines.append(
        "- page cache: "
        + (
            "every part evicted before each cold run (fincore: 0 bytes resident)"
            if not res["eviction"]
            else "NOT evicted: " + "; ".join(res["eviction"]) + " (cold runs read from memory)"
        )
    )
    cpus = os.cpu_count() or 1
    if busy is None:
        lines.append("- other processes' CPU use: not measured (no /proc/stat)")
    else:
        lines.append(
            f"- other processes kept at most {busy:.2f} of {cpus} CPUs busy during a measurement"
            + (" (a BUSY machine: these are not quiet numbers)" if busy > 0.25 else " (a quiet machine)")
        )
    return lines


def not_measured(why: str) -> list[str]:
    """The table's place when KTransformers' wheels could not be had: why, and no number."""
    return [
        f"NOT MEASURED on {time.strftime('%Y-%m-%d')} on {_host()}: {why}.",
        "",
        "Nothing is compared: run `nox -s bench -- --only payload` where PyPI (files.pythonhosted.org) is reachable,",
        "or with the five wheels of bench/anchor_payload.toml already in build/cache/anchor-kt.",
    ]


def write_doc(lines: list[str]) -> None:
    """The table into docs/payload.md, between its markers (added at the end the first time)."""
    text = DOC.read_text()
    block = "\n".join([BEGIN, *lines, END])
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n## Beside KTransformers 0.7.2's own carriers\n\n" + block + "\n"
    DOC.write_text(text)
