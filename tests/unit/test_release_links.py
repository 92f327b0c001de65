"""The link scopes `nox -s audit` resolves the release's ELF files against (release/links.py): one per published
profile on the first Python, its third-party closure installed by uv with every hash, the release's own wheels
left out (they are what is audited); a closure uv cannot install is NOT CHECKED with the reason, the rest go on."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from release import links
from tests import distkit

A = "a" * 64
INSTALL = f"""# KT release install file: profile serve
--only-binary :all:
kt-kernel==1.0 \\
    --hash=sha256:{A}
torch==2.14.1 \\
    --hash=sha256:{"b" * 64} \\
    --hash=sha256:{"c" * 64}
numpy==2.1.0 \\
    --hash=sha256:{"d" * 64}
"""


def _fake_uv(tmp_path: Path, fail_for: str = "") -> Path:
    """A `uv` that records its arguments and the requirements it was given, and fails for `fail_for`."""
    uv = tmp_path / "uv"
    uv.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys, pathlib\n"
        "argv = sys.argv[1:]\n"
        "req = pathlib.Path(argv[argv.index('-r') + 1]).read_text()\n"
        "target = pathlib.Path(argv[argv.index('--target') + 1])\n"
        f"if {fail_for!r} and {fail_for!r} in str(target):\n"
        "    sys.exit('error: Failed to fetch: https://pypi.org/simple/torch/ (offline)')\n"
        "target.mkdir(parents=True)\n"
        "(target / 'args.json').write_text(json.dumps({'argv': argv, 'req': req}))\n"
    )
    uv.chmod(uv.stat().st_mode | stat.S_IXUSR)
    return uv


def _dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    distkit.make_release(
        dist,
        wheels={"kt_kernel-1.0-cp311-abi3-manylinux_2_28_x86_64.whl": b"k", "other-1.0-py3-none-any.whl": b"o"},
        install={"install/serve-cp311.txt": INSTALL, "install/sft-cp311.txt": INSTALL.replace("torch", "tokenizers")},
    )
    return dist


def test_each_profile_gets_its_third_party_closure_and_the_wheels_it_installs(tmp_path: Path) -> None:
    dist = _dist(tmp_path)
    found, skipped = links.scopes(dist, tmp_path / "link", str(_fake_uv(tmp_path)))
    assert skipped == []
    assert [s["name"] for s in found] == ["serve-cp311", "sft-cp311"]
    serve = found[0]
    assert serve["wheels"] == ["kt_kernel-1.0-cp311-abi3-manylinux_2_28_x86_64.whl"]  # `other` is in no install file
    got = json.loads((Path(serve["folders"][0]) / "args.json").read_text())
    assert "kt-kernel" not in got["req"]  # the release's own wheel is audited, not installed
    assert f"torch==2.14.1 \\\n    --hash=sha256:{'b' * 64} \\\n    --hash=sha256:{'c' * 64}" in got["req"]
    assert "numpy==2.1.0" in got["req"]
    for flag in ("--no-deps", "--require-hashes", "--target"):
        assert flag in got["argv"]
    assert got["argv"][got["argv"].index("--python-version") + 1] == "3.11"


def test_a_closure_that_cannot_be_installed_is_not_checked_and_the_others_go_on(tmp_path: Path) -> None:
    dist = _dist(tmp_path)
    found, skipped = links.scopes(dist, tmp_path / "link", str(_fake_uv(tmp_path, fail_for="serve")))
    assert [s["name"] for s in found] == ["sft-cp311"]
    (line,) = skipped
    assert line.startswith("serve-cp311: NOT CHECKED: its closure could not be installed (error: Failed to fetch")
    assert "--link SITE_PACKAGES" in line


def test_no_uv_is_not_checked_named_not_a_traceback(tmp_path: Path) -> None:
    found, skipped = links.scopes(_dist(tmp_path), tmp_path / "link", str(tmp_path / "no-such-uv"))
    assert found == []
    assert [s.split(":", 1)[0] for s in skipped] == ["serve-cp311", "sft-cp311"]
    assert "no-such-uv cannot be run: No such file or directory" in skipped[0]


def test_the_scopes_file_carries_what_was_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile not had goes into scopes.json as {"name", "not_checked"} (the audit report's links_not_checked,
    the verdict's INCOMPLETE); with --no-links, one entry says so."""
    import json

    had = {"name": "sft-cp311", "folders": ["x"], "wheels": []}
    monkeypatch.setattr(links, "scopes", lambda dist, work: ([had], ["serve-cp311: NOT CHECKED: offline"]))
    path, skipped = links.write(tmp_path / "dist", tmp_path / "link")
    assert json.loads(path.read_text()) == [had, {"name": "serve-cp311", "not_checked": skipped[0]}]
    path, skipped = links.write(tmp_path / "dist", tmp_path / "link", skip="--no-links")
    assert json.loads(path.read_text()) == [{"name": "links", "not_checked": "links: NOT CHECKED (--no-links)"}]
    assert skipped == ["links: NOT CHECKED (--no-links)"]
