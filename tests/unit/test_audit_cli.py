"""The audit CLI on malformed input: each case its exit code and message, never a traceback.
0 pass, 1 error findings, 2 unusable input or policy, 3 internal error."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from audits import __main__ as cli
from audits.policy import DEFAULT_POLICY
from tests.wheelkit import pure_wheel_members, write_wheel

WHEEL = "demo-1.0-py3-none-any.whl"


def _pure(tmp_path: Path) -> Path:
    return write_wheel(tmp_path / WHEEL, pure_wheel_members("demo", "1.0"))


def _policy(tmp_path: Path, old: str, new: str) -> Path:
    text = DEFAULT_POLICY.read_text()
    assert old in text
    ladder = DEFAULT_POLICY.parent / "cpu_variants.json"  # named absolutely: the copy lives in tmp_path
    text = text.replace('ladder = "cpu_variants.json"', f'ladder = "{ladder}"')
    path = tmp_path / "policy.toml"  # never beside the default: the checkout stays as it was
    path.write_text(text.replace(old, new, 1))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_a_clean_wheel_passes_and_json_can_go_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(_pure(tmp_path)), "--json", "-")
    assert code == 0
    report = json.loads(out)
    assert report["passed"] is True
    import jsonschema

    schema = Path(cli.__file__).parent / "schemas" / "audit-report.schema.json"
    jsonschema.validate(report, json.loads(schema.read_text()))
    assert "PASSED: 1 wheels" in err


def test_error_findings_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _pure(tmp_path)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("../evil.py", "")
    code, out, _ = run(capsys, str(path))
    assert code == 1
    assert "wheel.unsafe-path" in out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.whl", "no such file or directory"),
        (lambda d: (d / "x.whl").mkdir() or d / "x.whl", "a directory named like a wheel"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "no wheels found"),
    ],
)
def test_unusable_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    code, _, err = run(capsys, str(target))
    assert code == 2, err
    assert message in err
    assert str(target) in err


def test_non_zip_and_truncated_wheels_are_findings_not_crashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a-1.0-py3-none-any.whl").write_bytes(b"not a zip at all")
    good = _pure(tmp_path).read_bytes()
    (tmp_path / "d" / "b-1.0-py3-none-any.whl").write_bytes(good[: len(good) // 2])
    (tmp_path / "d" / "c-1.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "d" / "bad-name.whl").write_bytes(good)
    code, out, _ = run(capsys, str(tmp_path / "d"))
    assert code == 1
    assert out.count("wheel.unreadable") == 4
    assert "not a wheel filename" in out


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("wheel_budget_mib = 100", 'wheel_budget_mib = "100MiB"', "size.wheel_budget_mib: '100MiB' is not of type"),
        (
            'applies_to = ["kt-kernel"]',
            'applies_to = "kt-kernel"',
            "elf.exports.applies_to: 'kt-kernel' is not of type",
        ),
        ("zstd_window_log = 27", "zstd_window_log = 40", "payload.zstd_window_log: 40 is greater than the maximum"),
        ("growth_threshold_pct", "growth_treshold_pct", "did you mean 'growth_threshold_pct'"),
    ],
)
def test_bad_policy_values_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, message: str
) -> None:
    policy = _policy(tmp_path, old, new)
    code, _, err = run(capsys, str(_pure(tmp_path)), "--policy", str(policy))
    assert code == 2
    assert message in err
    assert policy.name in err


def test_unwritable_json_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, str(_pure(tmp_path)), "--json", str(blocker / "report.json"))
    assert code == 2
    assert f"{blocker / 'report.json'}: cannot write the JSON report" in err


def test_an_internal_error_is_one_line_unless_debug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: object, **__: object) -> None:
        raise KeyError("unexpected")

    monkeypatch.setattr("audits.core.run", boom)
    assert run(capsys, str(_pure(tmp_path)))[0] == cli.EXIT_INTERNAL
    assert cli.main([str(_pure(tmp_path)), "--debug"]) == cli.EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err


def test_help_lists_the_rules_and_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "payload.part-mismatch:" in out
    assert "wheel.unsafe-path:" in out
    assert str(DEFAULT_POLICY) in out


def test_baseline_from_a_previous_report_flags_growth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _pure(tmp_path)
    size = wheel.stat().st_size
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps({"wheels": [{"name": "demo", "size": size}]}))
    assert run(capsys, str(wheel), "--baseline", str(previous))[0] == 0  # no growth
    previous.write_text(json.dumps({"wheels": [{"name": "demo", "size": int(size / 1.2)}]}))
    code, out, _ = run(capsys, str(wheel), "--baseline", str(previous))
    assert code == 1
    assert "size.growth" in out
    assert f"-> {size} bytes" in out
    (tmp_path / "map.json").write_text(json.dumps({"demo": int(size / 1.05)}))  # a plain {name: bytes} map, 5%
    assert run(capsys, str(wheel), "--baseline", str(tmp_path / "map.json"))[0] == 0
    (tmp_path / "bad.json").write_text("{")
    code, _, err = run(capsys, str(wheel), "--baseline", str(tmp_path / "bad.json"))
    assert code == 2
    assert "bad.json: cannot read the size baseline" in err
    (tmp_path / "shape.json").write_text(json.dumps({"wheels": [{"name": "demo", "size": "big"}]}))
    code, _, err = run(capsys, str(wheel), "--baseline", str(tmp_path / "shape.json"))
    assert code == 2
    assert "shape.json: cannot read the size baseline" in err
    assert "Traceback" not in err


def test_link_scopes_not_had_are_reported_not_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scopes = tmp_path / "scopes.json"
    scopes.write_text(json.dumps([{"name": "serve-cp311", "not_checked": "serve-cp311: NOT CHECKED: offline"}]))
    code, out, _ = run(capsys, str(_pure(tmp_path)), "--link-scopes", str(scopes), "--json", "-")
    report = json.loads(out)
    assert report["links_not_checked"] == {"serve-cp311": "serve-cp311: NOT CHECKED: offline"}
    import jsonschema

    schema = Path(cli.__file__).parent / "schemas" / "audit-report.schema.json"
    jsonschema.validate(report, json.loads(schema.read_text()))
    assert code == 0  # the wheels passed; what the link rules could not check is the verdict's INCOMPLETE
