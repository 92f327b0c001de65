"""Content keys for the release's stages: a stage whose every ingredient is byte-for-byte what it was
the last time it succeeded, and whose outputs are still the bytes it wrote, is reused, not re-run.

A key is the sha256 of the stage's ingredients (name -> sha256 of a file, a tree of files, or a value
such as the Python's version); base/stages.py derives them from what each stage reads (base/keys.py).
The record of the last success, ``build/stage-cache/NAME.json``, holds the key, each ingredient's hash
(so a miss says what changed), the environment variables of the allowlist, when it was produced, the
sha256 of every output file, the repository files the stage's own process opened beyond its key
(re-hashed on reuse) and, for stages whose output is a result (a verification profile), the result.

What makes a reuse trustworthy:
- **Authenticated records**: each is sealed with an HMAC under a per-checkout secret
  (``build/stage-cache/.secret``, made on first use, mode 0600): a record edited by hand, or
  written by another checkout, is refused, named, and the stage re-runs.
- **One run of a stage at a time** per build tree: ``reuse()`` takes the stage's lock (``NAME.lock``,
  holding the pid) and keeps it until ``done()`` or ``release()``, so a record binds the key to the
  outputs hashed under that lock; a second run waits, naming the pid it waits for.
- **Expiry**: a result that depends on an outside service carries its time and expires (``max_age_s``).

``fresh=True`` (``--fresh``, ``KT_FRESH=1``; CI always) ignores every record. Stdlib only: nox imports
this before any venv exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import platform
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from . import distdir, keys, paths, swap
from .errors import StageError

CACHE = paths.STAGE_CACHE
SKIP_PARTS = keys.SKIP_PARTS
KEY_FILE = ".secret"  # the per-checkout record key (a file name, not a secret)
WAIT_NOTE_S = 60.0  # a waiting run says again that it waits, this often


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file (hashlib reads it in chunks)."""
    return keys.file_sha256(path)


def files_sha256(files: Iterable[Path], root: Path | None = None) -> str:
    """One digest over these files' paths (relative to `root`) and contents, in sorted order."""
    return keys.Digests().files(files, root or paths.ROOT)


def tree_sha256(*roots: Path, suffixes: Sequence[str] = ()) -> str:
    """One digest over every file under `roots` (caches skipped; only `suffixes`, when given)."""
    return files_sha256(keys.tree_files(*roots, suffixes=suffixes))


def value_sha256(value: object) -> str:
    """The sha256 of a JSON-able value (keys sorted)."""
    return keys.value_sha256(value)


def python_sha256() -> str:
    """The interpreter that runs the stage: implementation, version, ABI, platform."""
    return value_sha256([sys.implementation.name, sys.version, sys.abiflags, platform.machine(), sys.platform])


def cpu_sha256() -> str:
    """This host's CPU as the kernel's variant choice sees it: the model name and the feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return value_sha256(platform.processor())
    first = text.split("\n\n", 1)[0]
    wanted = [line for line in first.splitlines() if line.split(":")[0].strip() in ("model name", "flags")]
    return value_sha256(wanted)


def output_sha256(path: Path) -> str:
    """A stage output's digest: a release manifest without its verdict, any other file whole."""
    return distdir.manifest_sha256(path) if path.name == distdir.MANIFEST else file_sha256(path)


def today() -> str:
    """The UTC date: an ingredient of stages whose inputs change by the day (the index's vulnerability data)."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def fresh_asked(flag: bool = False) -> bool:
    """--fresh on the command line, or KT_FRESH=1 in the environment (CI sets it)."""
    return flag or os.environ.get("KT_FRESH", "") not in ("", "0")


def _say(msg: str) -> None:
    sys.stdout.write(f"[cache {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stdout.flush()


# --- authenticated records ---------------------------------------------------------------------------


_SECRETS: dict[Path, bytes] = {}  # each checkout's key, read once per process


def _secret(cache: Path) -> bytes:
    """This checkout's record key: made once (32 random bytes, mode 0600), never leaves build/."""
    if cache not in _SECRETS:
        _SECRETS[cache] = _read_or_make_secret(cache)
    return _SECRETS[cache]


def _read_or_make_secret(cache: Path) -> bytes:
    path = cache / KEY_FILE
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except OSError:
        pass
    cache.mkdir(parents=True, exist_ok=True)
    tmp = swap.part(cache / KEY_FILE, str(threading.get_ident()))  # threads of one run make it at once
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    try:
        os.link(tmp, path)  # the first writer wins; a concurrent one reads the winner's
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes()


def _seal(record: Mapping[str, Any], cache: Path) -> str:
    body = {k: v for k, v in record.items() if k != "record_hmac"}
    text = json.dumps(body, sort_keys=True, default=str).encode()
    return hmac.new(_secret(cache), text, hashlib.sha256).hexdigest()


def _verified(path: Path, cache: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record, "") if its seal holds under this checkout's secret, else (None, why not)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, "not a readable JSON record (truncated or corrupted)"
    if not isinstance(record, dict):
        return None, "not a record (valid JSON of another shape)"
    seal = record.get("record_hmac")
    if not isinstance(seal, str):
        return None, "it carries no seal (written by an older kt-release, or by hand)"
    if not hmac.compare_digest(seal, _seal(record, cache)):
        return None, "its seal does not hold (edited after it was written, or written by another checkout)"
    return record, ""


# --- what the stage's own process reads ----------------------------------------------------------------


class _Reads:
    """The repository files and folders this process opened or listed (an audit hook, installed once),
    outside build/, dist/ and the hidden folders (.git, .nox, .venv): what a stage read."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()
        self.on = False

    def start(self) -> None:
        if not self.on:
            self.on = True
            sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            into = self.files
        elif event in ("os.listdir", "os.scandir"):
            into = self.dirs
        else:
            return
        target = args[0] if args else None
        if isinstance(target, os.PathLike):
            target = os.fspath(target)
        if not isinstance(target, str):
            return
        root = str(paths.ROOT)
        if not target.startswith("/"):
            target = os.path.join(os.getcwd(), target)  # noqa: PTH118, PTH109 (an audit hook: no Path per event)
        if target.startswith(root + "/"):
            into.add(target)

    def outside(self, covered: Sequence[Path]) -> tuple[list[Path], list[Path]]:
        """(files, folders) read that no ingredient covers."""
        root = paths.ROOT
        skip = [paths.BUILD, paths.DIST, *covered]

        def keep(p: Path) -> bool:
            if not p.is_relative_to(root):
                return False
            rel = p.relative_to(root)
            if not rel.parts or rel.parts[0].startswith(".") or SKIP_PARTS & set(rel.parts):
                return False
            return not any(p == c or p.is_relative_to(c) for c in skip)

        # a copy first (one C-level step under the GIL): another thread of the run may be reading meanwhile
        files = sorted(p for p in map(Path, set(self.files)) if keep(p) and p.is_file() and not p.name.endswith(".pyc"))
        dirs = sorted(p for p in map(Path, set(self.dirs)) if keep(p) and p.is_dir())
        return files, dirs


READS = _Reads()


def _listing(folder: Path) -> str:
    return value_sha256(sorted(p.name for p in folder.iterdir()))


# --- one run of a stage at a time --------------------------------------------------------------------

_HELD: dict[Path, tuple[IO[str], int]] = {}  # this process's stage locks and the thread holding each
LOCK_TIMEOUT_ENV = "KT_LOCK_TIMEOUT_S"
LOCK_TIMEOUT_S = 3600.0  # a run waits this long for another run of the same stage, then stops naming it


class LockTimeout(StageError):
    """Another run held a stage's lock past the timeout; the message names it and the fix."""


def _timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "")
    try:
        return float(raw) if raw else LOCK_TIMEOUT_S
    except ValueError:
        return LOCK_TIMEOUT_S


def _lock(path: Path, stage: str) -> None:
    """Take the stage's lock in this build tree, waiting (and saying for whom) while another run holds it,
    at most KT_LOCK_TIMEOUT_S. A caller that holds several at once takes them in one global order (their
    names', as verify.resolution does), so two runs can never each hold one the other waits for."""
    me = threading.get_ident()
    if path in _HELD and _HELD[path][1] == me:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+")
    t0 = time.monotonic()
    limit = _timeout()
    noted = -WAIT_NOTE_S
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            waited = time.monotonic() - t0
            f.seek(0)
            holder = f.read().strip() or "another process"
            if waited >= limit:
                f.close()
                raise LockTimeout(
                    f"{stage}: {path} is still held by {holder} after {waited:.0f} s; if that run is alive, wait for "
                    f"it or stop it (kill its pid), then run again; {LOCK_TIMEOUT_ENV} (now {limit:g}) sets the wait"
                ) from None
            if waited - noted >= WAIT_NOTE_S:
                noted = waited
                _say(f"{stage}: another run of this stage holds {path} ({holder}); waiting for it to finish")
            time.sleep(min(1.0, max(0.05, limit - waited)))
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
    f.flush()
    _HELD[path] = (f, me)


def _unlock(path: Path) -> None:
    held = _HELD.pop(path, None)
    if held is not None:
        f = held[0]
        f.seek(0)
        f.truncate()
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()


def _differs(recorded: Mapping[str, str], digest_of: Callable[[Path], str], gone: str, changed: str) -> str | None:
    """The first of `recorded` (path under the root -> digest) whose digest is no longer the same."""
    for rel, digest in recorded.items():
        try:
            actual = digest_of(paths.ROOT / rel)
        except OSError:
            return gone.format(rel=rel)
        if actual != digest:
            return changed.format(rel=rel)
    return None


def _reads_changed(record: Mapping[str, Any]) -> str | None:
    """A file the stage's process read beyond its key, or a folder it listed, that is not what it was."""
    reads = record.get("reads", {})
    return _differs(
        reads.get("files", {}), file_sha256, "changed: read:{rel} (gone)", "changed: read:{rel}"
    ) or _differs(reads.get("dirs", {}), _listing, "changed: listed:{rel} (gone)", "changed: listed:{rel}")


def _outputs_changed(record: Mapping[str, Any]) -> str | None:
    return _differs(
        record.get("outputs", {}),
        output_sha256,
        "output {rel} is missing",
        "output {rel} changed since it was produced",
    )


@dataclass
class Hit:
    """A reused stage: its key, when it was produced, and its stored result (if it has one)."""

    stage: str
    key: str
    produced: str
    result: Any


class Stage:
    """One stage's key and record: ``reuse()`` before running it, ``done()`` after it succeeded."""

    def __init__(
        self,
        name: str,
        ingredients: Mapping[str, str],
        *,
        outputs: Sequence[Path] = (),
        fresh: bool = False,
        cache: Path | None = None,
        max_age_s: float | None = None,
        environment: Mapping[str, str | None] | None = None,
        covers: Sequence[Path] = (),
    ) -> None:
        self.name = name
        self.environment = dict(sorted((environment or {}).items()))
        env = {f"env:{k}": value_sha256(v) for k, v in self.environment.items()}
        self.ingredients = dict(sorted({**ingredients, **env}.items()))
        self.key = value_sha256([name, self.ingredients])  # two stages of the same ingredients: two keys
        self.outputs = [Path(o) for o in outputs]
        self.fresh = fresh_asked(fresh)
        self.cache = cache or CACHE
        self.path = self.cache / f"{name}.json"
        self.lock_path = self.cache / f"{name}.lock"
        self.max_age_s = max_age_s
        self.covers = [Path(c) for c in covers]  # the trees the ingredients hash (reads inside them are keyed)
        READS.start()

    def _load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        record, why = _verified(self.path, self.cache)
        if record is None:
            _say(f"{self.name}: the record {self.path} is refused: {why}; re-running the stage")
        return record

    def why_not(self) -> str | None:
        """None when the stage can be reused; otherwise why it must run."""
        return self._judge()[0]

    def _judge(self) -> tuple[str | None, dict[str, Any] | None]:
        """(why it must run, or None; the record when it can be reused): the record loaded once."""
        if self.fresh:
            return "--fresh: every stage runs", None
        record = self._load()
        if record is None:
            return ("no record of a previous run" if not self.path.exists() else "refused record"), None
        why = self._changed(record) or self._expired(record) or _reads_changed(record) or _outputs_changed(record)
        return why, record

    def _changed(self, record: Mapping[str, Any]) -> str | None:
        if record.get("key") == self.key:
            return None
        old = record.get("ingredients", {})
        changed = [n for n in self.ingredients if old.get(n) != self.ingredients[n]]
        changed += [f"{n} (gone)" for n in old if n not in self.ingredients]
        return "changed: " + (", ".join(changed) or "the key")

    def _expired(self, record: Mapping[str, Any]) -> str | None:
        if self.max_age_s is None:
            return None
        age = time.time() - float(record.get("produced_at", 0))
        if age <= self.max_age_s:
            return None
        return (
            f"expired: produced {record.get('produced')}, {age / 3600:.1f} h ago, and the result depends on "
            f"an outside service (kept {self.max_age_s / 3600:g} h)"
        )

    def reuse(self) -> Hit | None:
        """The previous result if nothing changed (and a line saying so), else None (and why). Takes the
        stage's lock: held until ``done()`` or ``release()`` (or this process's end) on a miss."""
        _lock(self.lock_path, self.name)
        why, record = self._judge()
        if why is not None or record is None:
            _say(f"{self.name}: running ({why}); key {self.key[:16]}")
            return None
        _say(f"{self.name}: reused, key {self.key[:16]}, produced {record['produced']} (--fresh re-runs it)")
        record["last"] = {"outcome": "reused", "at": time.time()}
        self._write(record)
        self.release()
        return Hit(self.name, self.key, record["produced"], record.get("result"))

    def release(self) -> None:
        """Let another run of this stage go on (a run that did not succeed records nothing)."""
        _unlock(self.lock_path)

    @staticmethod
    def now() -> str:
        """A record's time format (UTC)."""
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

    def done(self, result: Any = None) -> None:
        """Record a success: the key, the ingredients, the outputs' sha256, what else it read, the result."""
        outputs = {}
        for out in self.outputs:
            rel = out.resolve().relative_to(paths.ROOT) if out.resolve().is_relative_to(paths.ROOT) else out
            outputs[str(rel)] = output_sha256(out)
        files, dirs = READS.outside(self.covers)
        record = {
            "stage": self.name,
            "key": self.key,
            "ingredients": self.ingredients,
            "environment": self.environment,
            "produced": self.now(),
            "produced_at": time.time(),
            "outputs": outputs,
            "reads": {
                "files": {str(f.relative_to(paths.ROOT)): file_sha256(f) for f in files},
                "dirs": {str(d.relative_to(paths.ROOT)): _listing(d) for d in dirs},
            },
            "result": result,
            "last": {"outcome": "ran", "at": time.time()},
        }
        self._write(record)
        self.release()

    def _write(self, record: dict[str, Any]) -> None:
        record["record_hmac"] = _seal(record, self.cache)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = swap.part(self.path, str(threading.get_ident()))
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(self.path)


def last_outcomes(cache: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every stage's record: name -> {"outcome": "ran"|"reused", "at", "key", "produced"} (refused ones left out)."""
    cache = cache or CACHE
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(cache.glob("*.json")):
        record, _ = _verified(f, cache)
        if record is None:
            continue
        out[f.stem] = {**record.get("last", {}), "key": record.get("key"), "produced": record.get("produced")}
    return out
