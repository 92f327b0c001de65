"""Where locked wheels come from: the one owner of index URLs and of the optional local mirror.

A lock that needs the CPU build of torch (PyPI has no ``+cpu`` wheels) names the PyTorch CPU
index in its own text, as a pip/uv option line, so ``pip install --require-hashes -r LOCK`` works
on any machine that reaches that index. Two variables adapt it to a machine that does not:

``KT_TORCH_INDEX``
    a stand-in for the PyTorch CPU index (a company mirror, or a test server on 127.0.0.1).
``KT_FIND_LINKS``
    an optional local wheel directory holding the same files (same sha256: the lock checks).
    Unset, pip's own ``PIP_FIND_LINKS`` or its configuration's ``find-links`` is used if it
    names a directory (the mirror a plain ``pip install`` on that machine already uses).

``for_install(lock)`` writes the lock as this machine installs it. Only this stdlib-only module
knows these names; no lock, and no other code, holds a machine path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_INDEX_ENV = "KT_TORCH_INDEX"
MIRROR_ENV = "KT_FIND_LINKS"
# The line a lock carries when it pins a wheel only the PyTorch CPU index serves.
INDEX_LINE = f"--extra-index-url {PYTORCH_CPU_INDEX}"


def _pip_config_find_links() -> str:
    """find-links from pip's own configuration files (the mirror a plain `pip install` uses here)."""
    import configparser

    if os.environ.get("PIP_CONFIG_FILE") == os.devnull:
        return ""
    home = Path.home()
    files = [
        Path("/etc/xdg/pip/pip.conf"),
        Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        home / ".config" / "pip" / "pip.conf",
    ]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    found = ""
    for f in files:
        cfg = configparser.ConfigParser()
        try:
            cfg.read(f)
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):
            if cfg.has_option(section, "find-links"):
                found = cfg.get(section, "find-links")
    return found


def mirror() -> Path | None:
    """The local wheel directory, if one is configured and exists: KT_FIND_LINKS, else pip's own
    PIP_FIND_LINKS or its configuration's find-links."""
    for value in (os.environ.get(MIRROR_ENV), os.environ.get("PIP_FIND_LINKS"), _pip_config_find_links()):
        for word in (value or "").split():
            path = Path(word.removeprefix("file://"))
            if path.is_dir():
                return path
    return None


def needs_torch_index(requirements: str) -> bool:
    """Whether a lock or input pins a +cpu build (only the PyTorch CPU index serves those)."""
    return bool(re.search(r"^torch==[^\s;]+\+cpu\b", requirements, re.MULTILINE))


def _cpu_pins(text: str) -> list[str]:
    return [f"{m.group(1)}-{m.group(2)}-" for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+\+cpu)", text, re.M)]


def source(text: str) -> list[str]:
    """The option lines a lock's +cpu pins install from on this machine: the stand-in index if
    KT_TORCH_INDEX is set, else the local mirror if it holds every +cpu file, else the PyTorch CPU
    index itself."""
    if os.environ.get(TORCH_INDEX_ENV):
        return [f"--extra-index-url {os.environ[TORCH_INDEX_ENV]}"]
    local = mirror()
    if local is not None:
        names = [p.name.replace("_", "-") for p in local.glob("*.whl")]
        if all(any(n.startswith(pin.replace("_", "-")) for n in names) for pin in _cpu_pins(text)):
            return [f"--find-links {local}"]
    return [INDEX_LINE]


def for_install(lock: Path, dest: Path, extra: str = "") -> Path:
    """lockfiles/NAME.txt (plus `extra` requirement lines) as this machine installs it, at `dest`."""
    text = lock.read_text()
    if INDEX_LINE in text:
        text = text.replace(INDEX_LINE, "\n".join(source(text)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text + (("\n" + extra.strip() + "\n") if extra.strip() else ""))
    return dest


def locked_install(index_url: str = "https://pypi.org/simple", behind: tuple[str, ...] = ()) -> tuple[str, ...]:
    """How a locked set is installed: hashes checked, wheels only, from `index_url` (and the indexes `behind`
    it, merged in); the lock's own option lines add the PyTorch CPU index or this machine's stand-in."""
    return ("--require-hashes", "--only-binary", ":all:", "--index-url", index_url, *extra_indexes(behind))


def extra_indexes(behind: tuple[str, ...]) -> tuple[str, ...]:
    """pip's and uv's options merging the indexes `behind` into the one asked first."""
    return tuple(a for url in behind for a in ("--extra-index-url", url))


# How every locked set is installed by default: from PyPI.
LOCKED_INSTALL = locked_install()

# uv prefers an extra index over PyPI for every package it finds there ("first index"); with every
# file hash-pinned, taking the best match across indexes is safe and matches pip.
UV_ARGS = ("--index-strategy", "unsafe-best-match")
