"""Facts of a release directory's install files (<dist>/install/*.txt and pylock.*.toml): the pins
each holds, with their hashes, read as text and TOML only (the audit imports nothing it checks)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from packaging.utils import canonicalize_name

INSTALL_DIR = "install"
MAX_BYTES = 16 << 20  # an install file is a few hundred KB; anything larger is refused unread
# requirements form: `name==version \` then `--hash=sha256:HEX` lines; pylock: pylock.<profile>-cp3XX.toml
_PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)((?:\s*\\\n\s*--hash=sha256:[0-9a-f]{64})*)", re.M
)
_PYTHON = re.compile(r"-cp3(\d{1,2})$")


@dataclass(frozen=True)
class Pin:
    """One package of an install file: its version, allowed sha256s and (pylock) the files it names."""

    name: str
    version: str
    hashes: frozenset[str]
    files: tuple[str, ...] = ()  # pylock wheels' `path` values (relative to the install file)


@dataclass(frozen=True)
class InstallFile:
    """One install file of a release directory: where it is, for which Python, its pins or why unreadable."""

    path: Path
    label: str  # "install/serve-cp312.txt", as findings name it
    python: str  # "3.12", from the file name ("" if the name says none)
    pins: dict[str, Pin] = field(default_factory=dict)
    error: str = ""


def _python(stem: str) -> str:
    m = _PYTHON.search(stem)
    return f"3.{m.group(1)}" if m else ""


def _read_txt(path: Path, label: str) -> InstallFile:
    text = path.read_text(encoding="utf-8")
    pins: dict[str, Pin] = {}
    for m in _PIN.finditer(text):
        name = canonicalize_name(m.group(1))
        pins[name] = Pin(name, m.group(2), frozenset(re.findall(r"sha256:([0-9a-f]{64})", m.group(3))))
    return InstallFile(path, label, _python(path.stem), pins)


def _read_pylock(path: Path, label: str) -> InstallFile:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    packages = data.get("packages")
    if not isinstance(packages, list):
        raise ValueError("no [[packages]] array")
    pins: dict[str, Pin] = {}
    for p in packages:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise ValueError(f"a [[packages]] entry without a name: {str(p)[:80]}")
        wheels = [w for w in p.get("wheels", []) if isinstance(w, dict)]
        hashes = frozenset(str(w.get("hashes", {}).get("sha256", "")) for w in wheels) - {""}
        name = canonicalize_name(p["name"])
        files = tuple(str(w["path"]) for w in wheels if isinstance(w.get("path"), str))
        pins[name] = Pin(name, str(p.get("version", "")), hashes, files)
    stem = path.name.removeprefix("pylock.").removesuffix(".toml")
    return InstallFile(path, label, _python(stem), pins)


def read_install_files(directory: Path) -> list[InstallFile]:
    """Every install file under `directory`/install/ (none: an empty list); an unreadable one is a fact
    with its error, never an exception."""
    root = directory / INSTALL_DIR
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.iterdir()):
        label = f"{INSTALL_DIR}/{path.name}"
        is_pylock = path.name.startswith("pylock.") and path.suffix == ".toml"
        if not (is_pylock or path.suffix == ".txt"):
            continue
        try:
            if path.is_symlink() or not path.is_file():
                raise ValueError("not a regular file")
            if path.stat().st_size > MAX_BYTES:
                raise ValueError(
                    f"{path.stat().st_size} bytes, over the {MAX_BYTES >> 20} MiB an install file may have"
                )
            out.append(_read_pylock(path, label) if is_pylock else _read_txt(path, label))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, TypeError, AttributeError) as exc:
            out.append(InstallFile(path, label, _python(path.stem), error=f"{type(exc).__name__}: {exc}"))
    return out
