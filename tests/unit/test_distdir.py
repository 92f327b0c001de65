"""base.distdir, dist/ as one typed contract: the manifest's types are its schema (the committed JSON Schema
is generated from them and the typed reader and jsonschema agree on hostile manifests), a release
directory is opened once and re-hashed once per process, and a dist/ that differs from its own record is
refused naming the file and the fix."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from base import distdir, keys, stagecache
from tests import distkit

WHEEL = "a-1-py3-none-any.whl"


def _full(tmp_path: Path) -> distdir.Manifest:
    """A release with every member the assembly writes: inputs, patches, install files, payload, partial."""
    fork = {"kind": "fork", "inputs": (distdir.Input("a", "1", "a-1.whl", "1" * 64),)}
    fork |= {"patches": (distdir.Patch("0001-x.patch", "2" * 64),), "pythons": ("3.11", "3.12")}
    part = distdir.Part(1, "a", "1", 10, "3" * 64)
    return distkit.make_release(
        tmp_path / "dist",
        {WHEEL: b"a", "b-2-cp311-cp311-manylinux_2_34_x86_64.whl": b"b"},
        {"install/sft-cp311.txt": "a==1\n", "install/pylock.sft-cp311.toml": "lock-version = '1.0'\n"},
        records={WHEEL: fork},
        pythons=("3.11",),
        partial=distdir.Partial(("3.11",), ("3.12",)),
        payload=distdir.Payload("4" * 64, 10, 1, 20, (part,)),
    )


def test_the_committed_schema_is_generated_from_the_types() -> None:
    """Regenerate it with: python -m base.distdir --schema > audits/schemas/release-manifest.schema.json"""
    assert distdir.SCHEMA_FILE.read_text() == distdir.schema_text()
    jsonschema.Draft202012Validator.check_schema(json.loads(distdir.SCHEMA_FILE.read_text()))


def test_a_written_manifest_reads_back_equal_and_validates(tmp_path: Path) -> None:
    manifest = _full(tmp_path)
    path = tmp_path / "dist" / distdir.MANIFEST
    assert distdir.read_manifest(path) == manifest
    assert distdir.manifest_text(distdir.read_manifest(path)) == path.read_text()  # the same bytes
    jsonschema.validate(json.loads(path.read_text()), json.loads(distdir.SCHEMA_FILE.read_text()))
    release = distdir.open_release(tmp_path / "dist")
    assert [n for _, n in release.sums] == [
        WHEEL,
        "b-2-cp311-cp311-manylinux_2_34_x86_64.whl",
        *(
            "install/sft-cp311.txt",
            "install/pylock.sft-cp311.toml",
        ),
    ]
    assert release.install_file("sft", "3.11") == (tmp_path / "dist/install/sft-cp311.txt", manifest.listed()[2][0])
    assert [w.filename for w in release.wheels_for("3.12")] == [WHEEL]


def _set(path: list[Any], value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        here: Any = doc
        for step in path[:-1]:
            here = here[step]
        if value is KeyError:
            del here[path[-1]]
        else:
            here[path[-1]] = value

    return change


HOSTILE = {
    "a member missing": _set(["kt_version"], KeyError),
    "an unknown member": _set(["extra"], 1),
    "a wheel path outside dist/": _set(["wheels", 0, "filename"], "../../etc/passwd.whl"),
    "an absolute wheel path": _set(["wheels", 0, "filename"], "/tmp/a-1-py3-none-any.whl"),
    "an install file outside install/": _set(["install", 0, "file"], "install/../../x.txt"),
    "a digest that is no sha256": _set(["wheels", 0, "sha256"], "A" * 64),
    "a digest with a trailing newline": _set(["wheels", 0, "sha256"], "a" * 64 + "\n"),
    "a wheel name with a trailing newline": _set(["wheels", 0, "filename"], "a-1-py3-none-any.whl\n"),
    "a size that is text": _set(["wheels", 0, "size"], "1"),
    "a size that is true": _set(["wheels", 0, "size"], True),
    "a negative size": _set(["wheels", 0, "size"], -1),
    "an unknown kind": _set(["wheels", 0, "kind"], "sdist"),
    "a python that is no version": _set(["pythons", 0], "cp311"),
    "a list that is an object": _set(["wheels"], {}),
    "a patch without its digest": _set(["wheels", 0, "patches", 0, "sha256"], KeyError),
    "an unknown install format": _set(["install", 0, "format"], "conda"),
    "a verdict that is a word": _set(["release"], {"verdict": "OK"}),
    "schema version 0": _set(["schema_version"], 0),
    "schema version true": _set(["schema_version"], True),
}


@pytest.mark.parametrize("mutation", HOSTILE.values(), ids=list(HOSTILE))
def test_the_typed_reader_and_the_schema_refuse_the_same_hostile_manifests(
    tmp_path: Path, mutation: Callable[[dict[str, Any]], None]
) -> None:
    _full(tmp_path)
    path = tmp_path / "dist" / distdir.MANIFEST
    doc = json.loads(path.read_text())
    bad = copy.deepcopy(doc)
    mutation(bad)
    path.write_text(json.dumps(bad))
    with pytest.raises(distdir.DistError, match=r"manifest\.json: not a release manifest") as exc:
        distdir.read_manifest(path)
    assert "rebuild dist/" in str(exc.value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json.loads(distdir.SCHEMA_FILE.read_text()))


def test_a_newer_schema_version_names_the_tool_to_use(tmp_path: Path) -> None:
    _full(tmp_path)
    path = tmp_path / "dist" / distdir.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 2}))
    with pytest.raises(distdir.DistError, match="schema_version 2 is newer than this kt-release reads"):
        distdir.read_manifest(path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("x  a.whl\n", "is not '<sha256>  <file in this directory>'"),
        (f"{'0' * 64}  ../a.whl\n", "is not '<sha256>  <file in this directory>'"),
        (f"{'0' * 64}  /etc/passwd\n", "is not '<sha256>  <file in this directory>'"),
        (f"{'0' * 64}  a.whl\n{'1' * 64}  a.whl\n", "lists it twice"),
    ],
)
def test_sha256sums_lines_that_are_not_one_file_of_the_directory_are_refused(
    tmp_path: Path, text: str, why: str
) -> None:
    (tmp_path / distdir.SUMS).write_text(text)
    with pytest.raises(distdir.DistError, match=f"SHA256SUMS:[12]: .* {why}"):
        distdir.read_sums(tmp_path / distdir.SUMS)


def test_sha256sums_and_the_manifest_must_list_the_same_files(tmp_path: Path) -> None:
    distkit.make_release(tmp_path, {WHEEL: b"a"})
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"b")
    sums = tmp_path / distdir.SUMS
    sums.write_text(sums.read_text() + f"{keys.file_sha256(tmp_path / 'b-1-py3-none-any.whl')}  b-1-py3-none-any.whl\n")
    with pytest.raises(distdir.DistError, match=r"list other files or digests \(b-1-py3-none-any.whl\)"):
        distdir.open_release(tmp_path)


def test_the_key_re_hashes_every_listed_file_and_reads_the_manifest(tmp_path: Path) -> None:
    distkit.make_release(tmp_path, {WHEEL: b"a"})
    key = distdir.key(tmp_path)
    assert key == distdir.key(tmp_path)
    distkit.rewrite(tmp_path, partial=distdir.Partial(("3.11",), ()))  # not listed in SHA256SUMS, yet read
    assert distdir.key(tmp_path) != key
    (tmp_path / WHEEL).write_bytes(b"b")
    with pytest.raises(distdir.DistError, match=r"a-1-py3-none-any.whl: sha256 .* differs from SHA256SUMS"):
        distdir.key(tmp_path)
    (tmp_path / WHEEL).unlink()
    with pytest.raises(distdir.DistError, match="listed in SHA256SUMS but unreadable"):
        distdir.key(tmp_path)
    with pytest.raises(distdir.DistError, match=r"manifest\.json is missing: .* holds no release"):
        distdir.key(tmp_path / "nowhere")


def test_a_release_is_re_hashed_once_per_process_until_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    distkit.make_release(tmp_path, {WHEEL: b"a", "b-1-py3-none-any.whl": b"b"}, {"install/sft-cp311.txt": "a\n"})
    hashed: list[str] = []
    real = keys.file_sha256

    def counted(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(keys, "file_sha256", counted)
    distdir.open_release(tmp_path)
    distdir.key(tmp_path)
    distdir.open_release(tmp_path).key()
    assert sorted(hashed) == sorted([WHEEL, "b-1-py3-none-any.whl", "sft-cp311.txt"])  # three opens, one hash each
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"c")  # same size, other bytes: its stat changes
    with pytest.raises(distdir.DistError, match="differs from SHA256SUMS"):
        distdir.open_release(tmp_path)


def test_the_verdict_is_written_whole_and_is_no_stage_s_input(tmp_path: Path) -> None:
    before = distkit.make_release(tmp_path, {WHEEL: b"a"})
    manifest = tmp_path / distdir.MANIFEST
    key, out = distdir.key(tmp_path), stagecache.output_sha256(manifest)
    verdict = {"verdict": "PASSED", "publishable": True, "dist_sha256": key, "judged": "now"}
    distdir.record_verdict(tmp_path, {**verdict, "passed": ["dist"], "failed": [], "missing": [], "accepted": []})
    judged = distdir.read_manifest(manifest)
    assert judged.release is not None
    assert judged.release.verdict == "PASSED"
    assert dataclasses.replace(judged, release=None) == before  # every other member as it was
    assert distdir.key(tmp_path) == key  # the audit and verification stay reused
    assert stagecache.output_sha256(manifest) == out  # and so does the assembly
    distkit.rewrite(tmp_path, kt_version="2")
    assert distdir.key(tmp_path) != key  # any other member is an input
    assert not list(tmp_path.glob(".manifest.json.*"))  # no temporary file left behind


def test_a_verdict_of_the_wrong_shape_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    distkit.make_release(tmp_path, {WHEEL: b"a"})
    before = (tmp_path / distdir.MANIFEST).read_bytes()
    with pytest.raises(distdir.DistError, match=r"release.verdict: 'GOOD' is none of"):
        distdir.record_verdict(tmp_path, {"verdict": "GOOD"})
    assert (tmp_path / distdir.MANIFEST).read_bytes() == before


def test_install_files_are_named_in_one_place() -> None:
    assert distdir.install_name("sft", "3.12") == "install/sft-cp312.txt"
    assert distdir.install_name("sft", "3.12", "pylock") == "install/pylock.sft-cp312.toml"
