"""The audit's install-file rules (dist/install/ against the release's wheels): each rule id from exactly
its defect, unreadable files as findings (never a traceback), third-party pins left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from audits.analyzers.install_rules import analyze
from audits.readers._install import read_install_files

KT = "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl"
SG11 = "sglang_kt-0.6.1-cp311-cp311-manylinux_2_34_x86_64.whl"
SG12 = "sglang_kt-0.6.1-cp312-cp312-manylinux_2_34_x86_64.whl"
WHEELS = {KT: "a" * 64, SG11: "b" * 64, SG12: "c" * 64}


def _txt(kt: str = "a" * 64, sg: str = "c" * 64, numpy: str = "d" * 64) -> str:
    return (
        "# KT release install file\n--only-binary :all:\n"
        f"kt-kernel==0.6.1 \\\n    --hash=sha256:{kt}\n"
        f"sglang-kt==0.6.1 \\\n    --hash=sha256:{sg}\n"
        f"numpy==2.3.5 \\\n    --hash=sha256:{numpy} \\\n    --hash=sha256:{'e' * 64}\n"
    )


def _pylock(path: str = SG12, sha: str = "c" * 64) -> str:
    return (
        'lock-version = "1.0"\ncreated-by = "uv"\n\n[[packages]]\nname = "sglang-kt"\nversion = "0.6.1"\n'
        f'wheels = [{{ name = "{Path(path).name}", path = "../{path}", size = 1, hashes = {{ sha256 = "{sha}" }} }}]\n'
    )


def _audit(tmp_path: Path, files: dict[str, str | bytes]) -> list[tuple[str, str, str]]:
    (tmp_path / "install").mkdir()
    for name, text in files.items():
        target = tmp_path / "install" / name
        target.write_bytes(text if isinstance(text, bytes) else text.encode())
    return [(f.rule, f.wheel, f.member) for f in analyze(read_install_files(tmp_path), WHEELS)]


def test_a_release_whose_install_files_pin_its_own_wheels_passes(tmp_path: Path) -> None:
    assert _audit(tmp_path, {"serve-cp312.txt": _txt(), "pylock.serve-cp312.toml": _pylock()}) == []


def test_no_install_directory_is_no_finding(tmp_path: Path) -> None:
    assert analyze(read_install_files(tmp_path), WHEELS) == []


@pytest.mark.parametrize(
    ("files", "member"),
    [
        ({"serve-cp312.txt": _txt(kt="0" * 64)}, "kt-kernel"),  # another build's hash
        ({"serve-cp312.txt": _txt(sg="b" * 64)}, "sglang-kt"),  # the cp311 wheel's hash in a cp312 file
        ({"serve-cp312.txt": _txt().replace("sglang-kt==0.6.1", "sglang-kt==0.6.0")}, "sglang-kt"),  # version
        (
            {
                "serve-cp312.txt": _txt().replace(
                    "--hash=sha256:" + "a" * 64, "--hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "f" * 64
                )
            },
            "kt-kernel",
        ),
        ({"pylock.serve-cp312.toml": _pylock(sha="0" * 64)}, "sglang-kt"),
        ({"pylock.serve-cp312.toml": _pylock(path=SG11, sha="c" * 64)}, "sglang-kt"),  # names another file
        ({"serve-cp313.txt": _txt()}, "sglang-kt"),  # no cp313 sglang-kt in the release
    ],
)
def test_a_carrier_pinned_wrongly_is_install_carrier_hash(
    tmp_path: Path, files: dict[str, str | bytes], member: str
) -> None:
    (label,) = files
    assert _audit(tmp_path, files) == [("install.carrier-hash", f"install/{label}", member)]


def test_third_party_pins_are_not_the_audits_to_judge(tmp_path: Path) -> None:
    assert _audit(tmp_path, {"serve-cp312.txt": _txt(numpy="9" * 64)}) == []


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe not utf-8",
        b"lock-version = \n",
        b'lock-version = "1.0"\npackages = 3\n',
        b"[[packages]]\nversion = 1\n",
    ],
)
def test_an_unreadable_install_file_is_a_finding_not_a_crash(tmp_path: Path, content: bytes) -> None:
    name = "pylock.serve-cp312.toml" if content.startswith((b"lock", b"[[")) else "serve-cp312.txt"
    assert _audit(tmp_path, {name: content}) == [("install.unreadable", f"install/{name}", "")]


def test_a_symlinked_install_file_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "install").mkdir()
    (tmp_path / "elsewhere.txt").write_text(_txt())
    (tmp_path / "install" / "serve-cp312.txt").symlink_to(tmp_path / "elsewhere.txt")
    findings = analyze(read_install_files(tmp_path), WHEELS)
    assert [(f.rule, "not a regular file" in f.message) for f in findings] == [("install.unreadable", True)]


def test_a_badly_named_wheel_beside_install_files_is_no_crash(tmp_path: Path) -> None:
    (tmp_path / "install").mkdir()
    (tmp_path / "install" / "serve-cp312.txt").write_text(_txt())
    assert analyze(read_install_files(tmp_path), {**WHEELS, "bad-name.whl": "0" * 64}) == []
