"""The simple repository API, read: what an index serves of one project (PEP 691 JSON with PEP 700's
sizes and upload times where served, PEP 503 HTML otherwise), redirects followed on the index's own host
only. The publish plan reads the target index with it; normal resolution reads pip's page with it to
tell whether an index serves the public index's projects itself.

Over http(s) only (no file:, ftp: or data: handler, for the page, its redirects and the files it names),
each body bounded in size (MAX_PAGE) and each request in time, whole (DEADLINE_S: connecting, headers and
body, however slowly the bytes come; READ_S per read); a page that is not what the API says (malformed
JSON, a file entry of the wrong shape, a file served by another scheme) is refused naming the URL."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_sdist_filename,
    parse_wheel_filename,
)

from .read import LockError

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.01"
MAX_PAGE = 64 << 20  # the largest project pages (PyPI's torch, JSON) are a few MiB
MAX_FILE = 8 << 30  # a file read to hash it: the index's own 1 GiB limit, well inside this
DEADLINE_S = 300.0  # one page, whole: connecting, headers and body
FILE_DEADLINE_S = 3600.0  # one file read to hash it, whole (8 GiB at 2.4 MB/s)
READ_S = 60.0  # one read of the socket
SCHEMES = ("http", "https")


class IndexPageError(LockError):
    """An index's project page cannot be read; the message names the URL and what went wrong."""


@dataclass(frozen=True)
class IndexFile:
    """One file an index serves for a project."""

    filename: str
    url: str
    sha256: str | None
    size: int | None
    uploaded: datetime | None


@dataclass(frozen=True)
class ProjectState:
    """What the index holds of one project (exists False: it has never heard of it)."""

    name: str
    exists: bool
    files: Mapping[str, IndexFile]
    how: str  # "PEP 691 JSON" or "PEP 503 HTML"

    def versions(self) -> dict[str, list[IndexFile]]:
        out: dict[str, list[IndexFile]] = {}
        for f in self.files.values():
            v = version_of(f.filename)
            if v is not None:
                out.setdefault(v, []).append(f)
        return out


def version_of(filename: str) -> str | None:
    """The normalized version a wheel or sdist file name carries (None for anything else)."""
    try:
        return canonicalize_version(str(parse_wheel_filename(filename)[1]))
    except InvalidWheelFilename:
        pass
    try:
        return canonicalize_version(str(parse_sdist_filename(filename)[1]))
    except InvalidSdistFilename:
        return None


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follow redirects on the index's own host only: pypiserver sends a project it does not hold to its
    fallback (pypi.org), which would pass PyPI's files off as this index's."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            fp.close()
            raise urllib.error.HTTPError(newurl, 404, "redirected off this index", headers, None)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# The deadline covers a request whole: connecting, the status line and headers, and the body. A socket's own
# timeout bounds one read only, so a server that drips a byte a second would hold a read for ever; a timer
# shuts every socket of the request down at the deadline instead (a blocked read then returns at once).
_LOCAL = threading.local()


def _register(sock: socket.socket) -> None:
    sockets = getattr(_LOCAL, "sockets", None)
    if sockets is not None:
        sockets.append(sock)


class _Connection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _register(self.sock)


class _SecureConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _register(self.sock)


class _Plain(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> Any:
        return self.do_open(_Connection, req)


class _Secure(urllib.request.HTTPSHandler):
    def https_open(self, req: Any) -> Any:
        return self.do_open(_SecureConnection, req, context=self._context)  # type: ignore[attr-defined]


@contextlib.contextmanager
def _deadline(url: str, seconds: float) -> Iterator[None]:
    """Within the block, every connection opened is shut down `seconds` after it began; IndexPageError then."""
    sockets: list[socket.socket] = []
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    late = IndexPageError(f"{url}: not read whole within {seconds:.0f} s (the index answers too slowly)")
    _LOCAL.sockets = sockets
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except (OSError, http.client.HTTPException, ValueError):
        if fired.is_set():
            raise late from None
        raise
    finally:
        timer.cancel()
        _LOCAL.sockets = None
    if fired.is_set():  # a shut socket can also read as the end of a body without a length: never a whole page
        raise late


def _opener(redirects: urllib.request.HTTPRedirectHandler) -> urllib.request.OpenerDirector:
    """An opener with the http(s) handlers alone: a file:, ftp: or data: URL (or a redirect to one) fails."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        _Plain(),
        _Secure(),
        urllib.request.HTTPDefaultErrorHandler(),
        redirects,
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


_OPENER = _opener(_SameOrigin())
_ANYWHERE = _opener(urllib.request.HTTPRedirectHandler())


def http_only(url: str) -> str:
    """`url`, or IndexPageError when it is not an http(s) URL."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise IndexPageError(f"{url}: an index is read over http(s) only, not {scheme or 'a bare path'}:")
    return url


def read_bounded(resp: Any, limit: int, url: str, sink: Any = None, *, deadline_s: float | None = None) -> bytes:
    """A response body, at most `limit` bytes and `deadline_s` (DEADLINE_S) seconds (into `sink` when given:
    nothing kept)."""
    deadline_s = DEADLINE_S if deadline_s is None else deadline_s
    deadline = time.monotonic() + deadline_s
    chunks: list[bytes] = []
    total = 0
    # read1: what has arrived (at most 1 MiB), so the deadline is checked after every read however slowly the
    # bytes come (read(1 MiB) waited for a whole MiB)
    while chunk := resp.read1(1 << 20):
        total += len(chunk)
        if total > limit:
            raise IndexPageError(f"{url}: more than {limit / 2**20:.0f} MiB; not what an index serves here")
        if time.monotonic() > deadline:
            raise IndexPageError(f"{url}: not read whole within {deadline_s:.0f} s")
        if sink is not None:
            sink(chunk)
        else:
            chunks.append(chunk)
    return b"".join(chunks)


def _get(url: str, accept: str = ACCEPT, method: str = "GET", *, anywhere: bool = False) -> tuple[bytes, str, Any]:
    request = urllib.request.Request(http_only(url), headers={"Accept": accept}, method=method)  # noqa: S310
    with _deadline(url, DEADLINE_S), (_ANYWHERE if anywhere else _OPENER).open(request, timeout=READ_S) as resp:
        body = read_bounded(resp, MAX_PAGE, url) if method == "GET" else b""
        return body, resp.headers.get_content_type(), resp.headers


def file_sha256(url: str) -> str:
    """The sha256 of the bytes an index serves at `url` (http(s) only, bounded), downloaded."""
    import hashlib

    digest = hashlib.sha256()
    request = urllib.request.Request(http_only(url))  # noqa: S310 - the operator's index
    try:
        with _deadline(url, FILE_DEADLINE_S), _ANYWHERE.open(request, timeout=READ_S) as resp:
            read_bounded(resp, MAX_FILE, url, digest.update, deadline_s=FILE_DEADLINE_S)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise IndexPageError(f"cannot download {url}: {getattr(exc, 'reason', exc)}") from None
    return digest.hexdigest()


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _file_url(page: str, href: str) -> str:
    """A file's absolute URL on a project page; IndexPageError when the page names another scheme than
    http(s) (a page listing file:///... is not an index's)."""
    target = urllib.parse.urljoin(page, href)
    if urllib.parse.urlsplit(target).scheme.lower() not in SCHEMES:
        raise IndexPageError(f"{page}: names a file at {target}, not over http(s); not an index's project page")
    return target


def _from_json(url: str, page: bytes) -> dict[str, IndexFile]:
    try:
        data = json.loads(page)
    except RecursionError:
        raise IndexPageError(f"{url}: not a PEP 691 project page (JSON nested too deep)") from None
    except ValueError as exc:
        raise IndexPageError(f"{url}: not a PEP 691 project page (not JSON: {exc})") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise IndexPageError(f"{url}: not a PEP 691 project page (no `files` list)")
    out = {}
    for i, f in enumerate(files):
        if not (isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("url"), str)):
            raise IndexPageError(f"{url}: not a PEP 691 project page (files[{i}] has no string filename and url)")
        raw = f.get("hashes")
        sha = raw.get("sha256") if isinstance(raw, dict) else None
        out[f["filename"]] = IndexFile(
            f["filename"],
            _file_url(url, f["url"]),
            sha if isinstance(sha, str) else None,
            f["size"] if isinstance(f.get("size"), int) and not isinstance(f.get("size"), bool) else None,
            _time(f.get("upload-time")),
        )
    return out


def _from_html(url: str, page: bytes) -> dict[str, IndexFile]:
    import html.parser

    links: dict[str, str] = {}

    class Links(html.parser.HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            href = dict(attrs).get("href")
            if tag == "a" and href:
                links[urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])] = href

    Links().feed(page.decode(errors="replace"))
    out = {}
    for name, href in links.items():
        target, fragment = urllib.parse.urldefrag(_file_url(url, href))
        algo, _, value = fragment.partition("=")
        out[name] = IndexFile(name, target, value if algo == "sha256" else None, None, None)
    return out


def project_state(index_url: str, project: str, sizes: bool = True, *, as_pip_sees_it: bool = False) -> ProjectState:
    """The index's files for `project` (PEP 691 JSON, else PEP 503 HTML). Where the index does not state a
    file's size and `sizes` is set, a HEAD request asks the file itself. A redirect to another host counts
    as "not here", unless `as_pip_sees_it`: pip follows it (pypiserver's fallback to the public index)."""
    name = canonicalize_name(project)
    url = f"{index_url.rstrip('/')}/{name}/"
    try:
        page, kind, _ = _get(url, anywhere=as_pip_sees_it)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            return ProjectState(name, False, {}, "absent")
        raise IndexPageError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise IndexPageError(f"cannot reach the index {url}: {getattr(exc, 'reason', exc)}") from None
    if kind == "application/vnd.pypi.simple.v1+json":
        files, how = _from_json(url, page), "PEP 691 JSON"
    else:
        files, how = _from_html(url, page), "PEP 503 HTML"
    if sizes:
        files = {n: f if f.size is not None else _sized(f) for n, f in files.items()}
    return ProjectState(name, True, files, how)


def _sized(f: IndexFile) -> IndexFile:
    try:
        _, _, headers = _get(f.url, "*/*", "HEAD")
        length = headers.get("Content-Length")
        return IndexFile(f.filename, f.url, f.sha256, int(length) if length else None, f.uploaded)
    except (urllib.error.URLError, OSError, ValueError, IndexPageError):
        return f
