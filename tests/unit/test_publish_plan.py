"""The publish plan against an index that answers as PyPI does (PEP 691 JSON with PEP 700 sizes, upload
times and versions), served on 127.0.0.1: a foreign build of our version, the window to add files open and
closed, limits, quotas, local versions, new projects, a half-published release, and a redirect off the
index (pypiserver's fallback) read as "not on this index"."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from locks.simple import project_state
from release.plan import RULES_FILE, load_rules, make_plan, render

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
JSON = "application/vnd.pypi.simple.v1+json"


class Index:
    """A PEP 691 index on 127.0.0.1 whose pages the test sets: project -> list of file dicts."""

    def __init__(self) -> None:
        self.projects: dict[str, list[dict[str, Any]]] = {}
        self.redirect: dict[str, str] = {}
        self.raw: dict[str, bytes] = {}  # project -> a body served as it is (PEP 691's content type)
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.strip("/").split("/")[-1]
                if name in index.redirect:
                    self.send_response(302)
                    self.send_header("Location", index.redirect[name])
                    self.end_headers()
                    return
                if name in index.raw:
                    self.send_response(200)
                    self.send_header("Content-Type", JSON)
                    self.end_headers()
                    self.wfile.write(index.raw[name])
                    return
                if name not in index.projects:
                    self.send_error(404)
                    return
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": index.projects[name]})
                self.send_response(200)
                self.send_header("Content-Type", JSON)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def add(self, project: str, filename: str, sha: str = "f" * 64, size: int = 1000, days_ago: float = 1) -> None:
        uploaded = (NOW - timedelta(days=days_ago)).isoformat().replace("+00:00", "Z")
        self.projects.setdefault(project, []).append(
            {
                "filename": filename,
                "url": f"../../files/{filename}",
                "hashes": {"sha256": sha},
                "size": size,
                "upload-time": uploaded,
            }
        )


@pytest.fixture
def index() -> Iterator[Index]:
    ix = Index()
    thread = threading.Thread(target=ix.server.serve_forever, daemon=True)
    thread.start()
    yield ix
    ix.server.shutdown()
    ix.server.server_close()


OURS = {
    "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl": ("a" * 64, 50 << 20),
    "ktransformers-0.6.1-py3-none-manylinux_2_34_x86_64.whl": ("b" * 64, 1 << 20),
}


def plan(index: Index, files: dict[str, tuple[str, int]] = OURS, **kw: Any):  # type: ignore[no-untyped-def]
    rules = kw.pop("rules", None) or load_rules(index.url)
    states = {p: project_state(index.url, p) for p in ("kt-kernel", "ktransformers")}
    return make_plan(files, index.url, rules, states, now=NOW, **kw)


def test_a_clean_index_plans_every_upload_and_says_which_projects_are_new(index: Index) -> None:
    p = plan(index)
    assert p.ok
    assert p.uploads == sorted(OURS)
    assert any("kt-kernel is new on" in n for n in p.notes)
    table = render(p)
    assert "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl        50.0     100  upload" in table
    assert table.endswith("plan: OK: 2 to upload, 0 already there")


def test_another_build_of_our_version_is_refused_before_anything_goes_up(index: Index) -> None:
    """KTransformers' own kt-kernel 0.6.1 on PyPI, other files: an installer could take theirs."""
    index.add("kt-kernel", "kt_kernel-0.6.1-cp311-cp311-manylinux_2_17_x86_64.whl")
    index.add("kt-kernel", "kt_kernel-0.5.0-cp311-cp311-manylinux_2_17_x86_64.whl")  # another version: no matter
    p = plan(index)
    (problem,) = p.problems
    assert problem.startswith("kt-kernel 0.6.1 already exists on")
    assert "kt_kernel-0.6.1-cp311-cp311-manylinux_2_17_x86_64.whl" in problem
    assert "Publish a new version" in problem
    assert "nothing is uploaded" in render(p)


def test_adding_to_an_existing_release_only_inside_the_window(index: Index) -> None:
    index.add("kt-kernel", "kt_kernel-0.6.1-cp312-cp312-manylinux_2_34_x86_64.whl", days_ago=3)
    p = plan(index, add_to_existing=True)
    assert p.ok, p.problems
    assert any("window is open until 2026-12-16" in n for n in p.notes)
    index.projects.clear()
    index.add("kt-kernel", "kt_kernel-0.6.1-cp312-cp312-manylinux_2_34_x86_64.whl", days_ago=20)
    (problem,) = plan(index, add_to_existing=True).problems
    assert "the window to add files closed 2026-11-29" in problem


def test_the_window_cannot_be_checked_without_upload_times(index: Index) -> None:
    index.add("kt-kernel", "kt_kernel-0.6.1-cp312-cp312-manylinux_2_34_x86_64.whl")
    del index.projects["kt-kernel"][0]["upload-time"]
    (problem,) = plan(index, add_to_existing=True).problems
    assert "states none (PEP 700)" in problem


def test_limits_quota_and_local_versions(index: Index, tmp_path: Path) -> None:
    big = {"kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl": ("a" * 64, 150 << 20)}
    (over,) = plan(index, big).problems
    assert "150.0 MiB, over" in over
    assert "per-file limit of 100 MiB" in over
    raised = tmp_path / "rules.toml"
    raised.write_text(
        RULES_FILE.read_text().replace("[default.projects]", "[default.projects.kt-kernel]\nfile_limit_mib = 200")
    )
    assert plan(index, big, rules=load_rules(index.url, raised)).ok
    index.add("kt-kernel", "kt_kernel-0.1.0-cp311-abi3-manylinux_2_34_x86_64.whl", size=10 << 30)
    assert any("project quota of 10 GiB" in x for x in plan(index).problems)
    local = {"ktransformers-0.6.1+kt-py3-none-any.whl": ("b" * 64, 1000)}
    assert any("a local version" in x for x in plan(index, local).problems)


def test_a_half_published_release_is_shown_as_such(index: Index) -> None:
    index.add("kt-kernel", "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl", sha="a" * 64)
    p = plan(index)
    assert p.ok
    assert p.present == ["kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl"]
    assert any(n.startswith("half-published: 1 of 2 files") for n in p.notes)
    index.projects["kt-kernel"][0]["hashes"]["sha256"] = "0" * 64
    assert any("already on" in x and "an index never replaces a file" in x for x in plan(index).problems)


def test_a_redirect_off_the_index_is_not_its_project(index: Index) -> None:
    """pypiserver sends a project it lacks to its fallback (pypi.org): that is not this index's."""
    index.redirect["kt-kernel"] = "https://pypi.org/simple/kt-kernel/"
    state = project_state(index.url, "kt-kernel")
    assert (state.exists, dict(state.files)) == (False, {})


def test_another_build_of_our_version_with_a_local_label_is_ours_too(index: Index) -> None:
    """Someone's kt_kernel-0.6.1+cu132: pip takes it for our pin kt-kernel==0.6.1, so it is refused as their
    plain 0.6.1 is."""
    index.add("kt-kernel", "kt_kernel-0.6.1+cu132-cp311-cp311-manylinux_2_28_x86_64.whl")
    (problem,) = plan(index).problems
    assert problem.startswith("kt-kernel 0.6.1 already exists on")
    assert "kt_kernel-0.6.1+cu132-cp311-cp311-manylinux_2_28_x86_64.whl" in problem


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not a PEP 691 project page (not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deep"),
        (b'{"files": {"a": 1}}', "no `files` list"),
        (b'{"files": [{"filename": 3, "url": "x"}]}', "files[0] has no string filename and url"),
        (
            b'{"files": [{"filename": "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl", '
            b'"url": "file:///work/dist/kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl",'
            b'"hashes": {"sha256": "' + b"a" * 64 + b'"}}]}',
            "not over http(s); not an index's project page",
        ),
    ],
)
def test_a_page_that_is_not_what_the_api_says_is_refused_by_name(index: Index, body: bytes, message: str) -> None:
    """A malformed page, and one naming our wheels as file:/// URLs (which would make publish say
    "already there, identical" and upload nothing), are refused naming the page; never a traceback."""
    from locks.simple import IndexPageError

    index.raw["kt-kernel"] = body
    with pytest.raises(IndexPageError, match=re.escape(message)) as exc:
        project_state(index.url, "kt-kernel")
    assert "/simple/kt-kernel/" in str(exc.value)


def test_pages_are_read_over_http_only_and_bounded(index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    from locks import simple
    from locks.simple import IndexPageError, file_sha256

    for url in ("file:///dev/zero", "ftp://example.org/simple/", "data:,x"):
        with pytest.raises(IndexPageError, match="read over http"):
            project_state(url, "kt-kernel")
        with pytest.raises(IndexPageError, match="read over http"):
            file_sha256(url)
    monkeypatch.setattr(simple, "MAX_PAGE", 1000)
    index.raw["kt-kernel"] = b'{"files": []}' + b" " * 5000
    with pytest.raises(IndexPageError, match="more than 0 MiB"):
        project_state(index.url, "kt-kernel")


class _Drip:
    """A server on 127.0.0.1 that sends its answer one byte every `pause` seconds: the headers (`headers`) or
    the body only."""

    def __init__(self, headers: bool, pause: float = 0.2) -> None:
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/simple/"
        self.stop = threading.Event()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100000\r\nX-Pad: " + b"a" * 5000
        self.slow = head + b"\r\n\r\n" + b"x" * 100000 if headers else b"x" * 100000
        self.fast = b"" if headers else head + b"\r\n\r\n"
        self.pause = pause
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        import time

        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(self.fast)
                    for b in self.slow:
                        if self.stop.is_set():
                            break
                        conn.sendall(bytes([b]))
                        time.sleep(self.pause)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers"])
def test_an_index_that_drips_its_page_is_given_up_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, headers: bool
) -> None:
    """A byte every 0.2 s is within any per-read timeout, and read(1 MiB) waited for a whole MiB: publish and
    --plan hung. The deadline covers the whole request now, headers and body, and is said."""
    import time

    from locks import simple
    from locks.simple import IndexPageError, file_sha256

    monkeypatch.setattr(simple, "DEADLINE_S", 1.5)
    monkeypatch.setattr(simple, "FILE_DEADLINE_S", 1.5)
    drip = _Drip(headers)
    try:
        for call in (lambda: project_state(drip.url, "kt-kernel"), lambda: file_sha256(drip.url + "f.whl")):
            t0 = time.monotonic()
            with pytest.raises(IndexPageError, match=r"not read whole within 2 s"):
                call()
            assert time.monotonic() - t0 < 5
    finally:
        drip.close()
