"""Carrier assembly from the real, hash-locked upstream wheels (network on the
first run; cached after): repack byte-identity, unchanged bounds, determinism,
hash refusal, stale patches, source-tree inputs, and the atomic dist/."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from carriers import CarrierSet, InputError, PatchError, load, wheelio
from carriers.assemble import assemble, build_set
from carriers.inputs import LOCK, fetch
from carriers.model import DEFINITIONS, Source
from carriers.transform import derive

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cs() -> CarrierSet:
    return load()


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def _requires(members: dict[str, bytes]) -> list[str]:
    meta = next(d for n, d in members.items() if n.endswith(".dist-info/METADATA")).decode()
    return re.findall(r"^Requires-Dist: (.*)$", meta.partition("\n\n")[0], re.MULTILINE)


def _without_license(meta: str) -> str:
    """METADATA without its license headers (License with its continuation lines, License-Expression,
    License-File, license classifiers) and Metadata-Version: what a carrier's license statement rewrites."""
    head, sep, body = meta.partition("\n\n")
    kept: list[str] = []
    dropping = False
    for line in head.split("\n"):
        if dropping and line[:1] in (" ", "\t"):
            continue
        dropping = line.startswith(("License:", "License-Expression:", "License-File:", "Metadata-Version:"))
        dropping = dropping or line.startswith("Classifier: License ::")
        if not dropping:
            kept.append(line)
    return "\n".join(kept) + sep + body


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path, cs: CarrierSet) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("carriers")
    return {b.name: b.path for b in build_set(cs, kt_wheel, out)}


@pytest.mark.parametrize(("carrier", "upstream"), [("peft-kt", "peft"), ("trl-kt", "trl")])
def test_repack_changes_nothing_but_requirement_names(built: dict[str, Path], carrier: str, upstream: str) -> None:
    up = _members(fetch(upstream).path)
    new = _members(built[carrier])
    up_files = {n: d for n, d in up.items() if ".dist-info/" not in n}
    new_files = {n: d for n, d in new.items() if ".dist-info/" not in n}
    assert new_files == up_files, "runtime files must be byte-identical"
    for name, data in up.items():
        if ".dist-info/" in name and not name.endswith(("/METADATA", "/RECORD")):
            assert new[name.replace(upstream, carrier.replace("-", "_"), 1)] == data, name
    up_meta = next(d for n, d in up.items() if n.endswith("/METADATA")).decode()
    new_meta = next(d for n, d in new.items() if n.endswith("/METADATA")).decode()
    # ... but for its license, which it states (PEP 639: Metadata-Version 2.4, License-Expression, License-File)
    assert "License-Expression: Apache-2.0\n" in new_meta.partition("\n\n")[0]
    renamed_meta = new_meta.replace(f"Name: {carrier}\n", f"Name: {upstream}\n", 1)
    assert _without_license(renamed_meta).replace("-kt", "") == _without_license(up_meta).replace("-kt", "")
    # Bounds unchanged: the same lines with only the project name swapped.
    renamed = [re.sub(r"^(transformers|accelerate|peft|trl)(?![\w.-])", r"\1-kt", r) for r in _requires(up)]
    assert _requires(new) == renamed


def test_fork_is_renamed_and_pinned_to_siblings(built: dict[str, Path]) -> None:
    reqs = _requires(_members(built["sglang-kt"]))
    assert "transformers-kt==5.19.0.post1" in reqs
    assert not [r for r in reqs if re.match(r"(transformers|accelerate|peft|trl|sglang)(?![\w-])", r)]
    assert built["transformers-kt"].name.startswith("transformers_kt-5.19.0.post1-")


def test_wrong_input_hash_is_refused_and_dist_untouched(tmp_path: Path, kt_wheel: Path, cs: CarrierSet) -> None:
    lock = tmp_path / "carrier-inputs.txt"
    text = LOCK.read_text()
    digest = re.search(r"^peft==.*\n    --hash=sha256:([0-9a-f]{64})", text, re.MULTILINE).group(1)  # type: ignore[union-attr]
    lock.write_text(text.replace(digest, "0" * 64))
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "previous.txt").write_text("old release")
    with pytest.raises(InputError) as exc:
        assemble(cs, kt_wheel, dist, lock=lock, cache=tmp_path / "cache")
    assert digest in str(exc.value)
    assert "0" * 64 in str(exc.value)
    assert [p.name for p in dist.iterdir()] == ["previous.txt"]
    assert not list(tmp_path.glob(".dist.kt-*.staging"))


def test_stale_patch_names_patch_and_file(tmp_path: Path, kt_wheel: Path) -> None:
    patches = tmp_path / "patches" / "accelerate-kt"
    patches.mkdir(parents=True)
    (patches / "0001-stale.patch").write_text(
        "--- a/accelerate/__init__.py\n+++ b/accelerate/__init__.py\n@@ -1,3 +1,3 @@\n"
        "-this line is not in accelerate\n+replaced\n context\n context\n"
    )
    cs = load(DEFINITIONS, patches_dir=tmp_path / "patches")
    with pytest.raises(PatchError) as exc:
        build_set(cs, kt_wheel, tmp_path, only=frozenset({"accelerate-kt"}))
    assert "0001-stale.patch" in str(exc.value)
    assert "accelerate/__init__.py" in str(exc.value)


def test_patch_that_applies_changes_the_fork(tmp_path: Path, kt_wheel: Path) -> None:
    src = _members(fetch("accelerate").path)["accelerate/__init__.py"].decode().splitlines(keepends=True)
    patches = tmp_path / "patches" / "accelerate-kt"
    patches.mkdir(parents=True)
    hunk = "".join(f" {ln}" for ln in src[:3])
    (patches / "0001-mark.patch").write_text(
        f"--- a/accelerate/__init__.py\n+++ b/accelerate/__init__.py\n@@ -1,3 +1,4 @@\n+# kt fork\n{hunk}"
    )
    cs = load(DEFINITIONS, patches_dir=tmp_path / "patches")
    out = {b.name: b for b in build_set(cs, kt_wheel, tmp_path, only=frozenset({"accelerate-kt"}))}
    assert _members(out["accelerate-kt"].path)["accelerate/__init__.py"].startswith(b"# kt fork\n")
    assert out["accelerate-kt"].patches[0]["file"] == "0001-mark.patch"


def test_source_tree_input_builds_the_pinned_commit(tmp_path: Path, cs: CarrierSet) -> None:
    repo = tmp_path / "repo"
    (repo / "accelerate").mkdir(parents=True)
    (repo / "accelerate" / "__init__.py").write_text('__version__ = "1.15.0"\n')
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "accelerate"\nversion = "1.15.0"\nrequires-python = ">=3.10"\n'
        'dependencies = ["torch>=2.0.0", "transformers>=4"]\n[tool.setuptools]\npackages = ["accelerate"]\n'
    )
    git = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "v1.15.0"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "accelerate" / "__init__.py").write_text('__version__ = "9.9.9"  # a later commit\n')
    subprocess.run([*git, "commit", "-qam", "later"], check=True)
    from carriers.inputs import build_source

    src = build_source("accelerate", Source(repo.as_uri(), commit), tmp_path / "cache")
    versions = {c.name: "0" for c in cs.carriers} | {"accelerate-kt": "1.15.0.post1", "transformers-kt": "5.19.0.post1"}
    out = derive(cs["accelerate-kt"], cs, src.path, tmp_path, versions, {"transformers-kt": "5.19.0"})
    members = _members(out)
    assert members["accelerate/__init__.py"] == b'__version__ = "1.15.0"\n'
    assert "transformers-kt>=4" in _requires(members)


def test_assembly_is_deterministic_and_dist_is_complete(
    tmp_path: Path, kt_wheel: Path, cs: CarrierSet, built: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every wheel encoded anew (no wheel memo), against the module's build of the same set in another
    # process-time and folder, whose wheels came from the memo or were encoded into it: the same bytes.
    # Each wheel is finished in memory and written once: no wheel file is written twice or renamed.
    written: list[str] = []
    real = wheelio.atomic

    @contextlib.contextmanager
    def counted(path: Path) -> Iterator[IO[bytes]]:
        written.append(path.name)
        with real(path) as fh:
            yield fh

    monkeypatch.setattr(wheelio, "atomic", counted)
    a = assemble(cs, kt_wheel, tmp_path / "a", memo=False)
    monkeypatch.undo()
    assert sorted(n for n in written if n.endswith(".whl")) == sorted(w.filename for w in a.wheels)
    other = next(iter(built.values())).parent
    assert {w.filename: w.sha256 for w in a.wheels} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(other.glob("*.whl"))
    }
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert {w["name"] for w in manifest["wheels"]} == {c.name for c in cs.carriers}
    assert {w["kind"] for w in manifest["wheels"]} == {"native", "umbrella", "fork", "repack"}
    assert all(w["inputs"] for w in manifest["wheels"] if w["kind"] in ("fork", "repack"))
    names = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    listed = [*(w["filename"] for w in manifest["wheels"]), *(f["file"] for f in manifest["install"])]
    assert names == sorted([*listed, "SHA256SUMS", "manifest.json"])
    assert sorted(
        line.split("  ", 1)[1] for line in (tmp_path / "a" / "SHA256SUMS").read_text().splitlines()
    ) == sorted(listed)  # every file of the release is listed with its sha256, the install files included
    shutil.rmtree(tmp_path / "a")
