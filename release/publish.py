"""Publish dist/ to a package index, hash-verified (`nox -s publish -- --repository-url URL`).

- Order: computed from the carriers' own requirements (dependencies first), not a list.
- Before each upload the index is asked for the file: identical bytes -> skip (so a
  re-run after success is a no-op); different bytes under the same name -> hard error
  (never `--skip-existing`, which passes an older file off as success).
- After each upload: wait until the index serves the file, download it, compare sha256.
- Before anything: the release verdict in manifest.json must have judged exactly these files and allow
  publishing (PASSED, or INCOMPLETE with every missing item accepted); a partial release never goes up.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from base import stagecache
from base.errors import StageError, report
from base.paths import DIST
from carriers import wheelio
from carriers.graph import Graph
from carriers.inputs import sha256

from .errors import ReleaseError


class PublishError(ReleaseError):
    """Publishing stopped; the message names the file and why."""


def upload_order(dist: Path, files: list[str]) -> list[str]:
    """Wheel filenames, each after every carrier it requires (any extra; carriers.graph orders them,
    cycles as one group). A distribution with one wheel per Python (kt-kernel: cp311, cp312) uploads
    all of them at its place."""
    by_name: dict[str, list[str]] = {}
    for f in sorted(files):
        by_name.setdefault(str(parse_wheel_filename(f)[0]), []).append(f)
    graph = Graph({name: wheelio.read_metadata(dist / fnames[0])[1] for name, fnames in by_name.items()})
    return [f for n in graph.upload_order() for f in by_name[n]]


# PEP 691: ask for the JSON simple API (PyPI, TestPyPI serve it, with every file's hashes); an index
# that serves only PEP 503 HTML (pypiserver) answers with HTML, whose links carry #sha256= fragments.
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.01"


@dataclass(frozen=True)
class Served:
    """One file an index serves: where, and the sha256 it states (None if it states none)."""

    url: str
    sha256: str | None


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links[urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])] = href


def _from_html(url: str, page: str) -> dict[str, Served]:
    parser = _Links()
    parser.feed(page)
    out = {}
    for name, href in parser.links.items():
        fragment = urllib.parse.urldefrag(href).fragment
        algo, _, value = fragment.partition("=")
        out[name] = Served(
            urllib.parse.urljoin(url, urllib.parse.urldefrag(href).url), value if algo == "sha256" else None
        )
    return out


def _from_json(url: str, page: str) -> dict[str, Served]:
    try:
        files = json.loads(page)["files"]
        return {
            f["filename"]: Served(urllib.parse.urljoin(url, f["url"]), f.get("hashes", {}).get("sha256")) for f in files
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise PublishError(f"{url}: not a PEP 691 project page ({exc})") from None


def index_files(index_url: str, project: str) -> dict[str, Served]:
    """filename -> where the index serves it and the sha256 it states (empty if the project is absent)."""
    url = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})  # noqa: S310 - the operator's index URL
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310
            page = resp.read().decode()
            kind = resp.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise PublishError(f"{url}: HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        raise PublishError(f"cannot reach the index {url}: {exc.reason}") from None
    return _from_json(url, page) if kind == "application/vnd.pypi.simple.v1+json" else _from_html(url, page)


def remote_sha256(url: str) -> str:
    """The sha256 of the bytes the index serves at `url` (downloaded)."""
    with urllib.request.urlopen(url, timeout=120) as resp:  # noqa: S310
        return hashlib.file_digest(resp, "sha256").hexdigest()


def releasable(dist: Path) -> dict[str, Any]:
    """dist/'s manifest, if its release verdict (release/report.py, in manifest.json's `release`) judged
    exactly these files and allows publishing (PASSED, or INCOMPLETE with every missing item accepted);
    PublishError naming the verdict and what it lacks otherwise. A partial release is never published."""
    path = dist / "manifest.json"
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise PublishError(f"{path} is missing: {dist} holds no release; build it (nox -s release)") from None
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path} is unreadable ({exc}); rebuild the release (nox -s release)") from None
    if manifest.get("partial"):
        missing = ", ".join(manifest["partial"].get("missing", []))
        raise PublishError(f"{dist} is a partial development release (no wheels for CPython {missing}); not published")
    judged = manifest.get("release")
    if not isinstance(judged, dict):
        raise PublishError(f"{dist} has no release verdict: run nox -s release (or release_report) before publishing")
    try:
        key = stagecache.dist_sha256(dist)
    except stagecache.DistError as exc:
        raise PublishError(str(exc)) from None
    if judged.get("dist_sha256") != key:
        raise PublishError(
            f"the release verdict in {path} ({judged.get('verdict')}, {judged.get('judged')}) judged other files "
            f"than {dist} holds now; run nox -s release again"
        )
    if not judged.get("publishable"):
        lacks = [f"{i['item']} ({i['detail']})" for i in judged.get("failed", []) + judged.get("missing", [])]
        raise PublishError(
            f"the release is {judged.get('verdict')}, not published: "
            + "; ".join(lacks[:10])
            + (f"; and {len(lacks) - 10} more" if len(lacks) > 10 else "")
            + ". Fix what failed; run what is missing, or accept it by name with a reason "
            "(nox -s release -- --accept 'ITEM=REASON', or the policy's [[accept_incomplete]])"
        )
    return manifest


def publish(
    dist: Path, repository_url: str, index_url: str, wait_s: float = 120.0, twine_args: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """Upload dist/ in dependency order and verify each served file by sha256; yields progress."""
    manifest = releasable(dist)
    sums = {w["filename"]: w["sha256"] for w in manifest["wheels"]}
    for fname, digest in sums.items():
        actual = sha256(dist / fname)
        if actual != digest:
            raise PublishError(f"{dist / fname}: sha256 {actual} is not the manifest's {digest}; rebuild dist/")
    done: list[tuple[str, str]] = []
    for fname in upload_order(dist, list(sums)):
        project = parse_wheel_filename(fname)[0]
        listed = index_files(index_url, project)
        if fname in listed:
            served = listed[fname].sha256 or remote_sha256(listed[fname].url)
            if served != sums[fname]:
                raise PublishError(
                    f"{fname} is already on {index_url} with different content (sha256 {served}, ours "
                    f"{sums[fname]}). An index never replaces a file: bump the version (post release) instead."
                )
            done.append((fname, "already published, identical"))
            continue
        if "--attestations" in twine_args:
            # PEP 740: sign with the CI's ambient OIDC identity (trusted publishing); twine uploads the result.
            sign = subprocess.run(
                [sys.executable, "-m", "pypi_attestations", "sign", str(dist / fname)],
                capture_output=True,
                text=True,
                check=False,
            )
            if sign.returncode != 0:
                raise PublishError(
                    f"attesting {fname} failed (is this CI with id-token: write?):\n{sign.stderr[-2000:]}"
                )
        cmd = [
            sys.executable,
            "-m",
            "twine",
            "upload",
            "--non-interactive",
            "--disable-progress-bar",
            "--repository-url",
            repository_url,
            *twine_args,
            str(dist / fname),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise PublishError(f"twine upload {fname} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        deadline = time.monotonic() + wait_s
        while True:
            listed = index_files(index_url, project)
            if fname in listed:
                break
            if time.monotonic() > deadline:
                raise PublishError(f"{fname} was uploaded but {index_url} does not serve it after {wait_s:.0f}s")
            time.sleep(1.0)
        served = remote_sha256(listed[fname].url)  # the bytes themselves, not only what the page states
        if served != sums[fname] or listed[fname].sha256 not in (None, served):
            raise PublishError(f"{index_url} serves {fname} with sha256 {served}, not the uploaded {sums[fname]}")
        done.append((fname, "uploaded, verified"))
    return done


def main(argv: list[str] | None = None) -> int:
    """The publish CLI."""
    p = argparse.ArgumentParser(prog="nox -s publish --")
    p.add_argument("--repository-url", required=True, help="upload endpoint (twine --repository-url)")
    p.add_argument("--index-url", help="its simple index, PEP 691 or 503 (default: <repository-url>/simple/)")
    p.add_argument("--dist", type=Path, default=DIST)
    p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for an upload to be served")
    p.add_argument("--attestations", action="store_true", help="upload PEP 740 attestations (twine --attestations)")
    args = p.parse_args(argv)
    index = args.index_url or args.repository_url.rstrip("/") + "/simple/"
    extra: tuple[str, ...] = ("--attestations",) if args.attestations else ()
    if "TWINE_USERNAME" not in os.environ and "TWINE_PASSWORD" not in os.environ and "127.0.0.1" in args.repository_url:
        extra += ("-u", "kt", "-p", "kt")  # a local test index takes any credentials
    try:
        for fname, what in publish(args.dist, args.repository_url, index, args.wait, extra):
            print(f"{fname}: {what}")
    except StageError as exc:  # PublishError, and the carriers' root (unreadable wheel metadata)
        return report(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
