"""base.stagecache: a stage is reused only when every ingredient of its key and every output it wrote
are the bytes of its last success; a corrupted, edited or foreign record is refused, named, and re-run;
one run of a stage at a time per build tree; a result from an outside service expires; what the stage's
process read beyond its key is recorded and re-checked. (Which stage reads what:
test_stage_ingredients.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from base import paths, stagecache


def test_a_stage_is_reused_until_an_ingredient_or_an_output_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.txt"
    out.write_text("result")
    stage = stagecache.Stage("s", {"a": "1", "b": "2"}, outputs=[out], cache=tmp_path / "c")
    assert stage.reuse() is None
    assert "s: running (no record of a previous run)" in capsys.readouterr().out
    stage.done({"n": 3})
    hit = stagecache.Stage("s", {"b": "2", "a": "1"}, cache=tmp_path / "c").reuse()
    assert hit is not None
    assert hit.result == {"n": 3}
    assert hit.key == stage.key
    assert "s: reused, key " in capsys.readouterr().out
    assert stagecache.Stage("s", {"a": "1", "b": "3"}, cache=tmp_path / "c").why_not() == "changed: b"
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "c").why_not() == "changed: b (gone)"
    assert stagecache.Stage("s", {"a": "1", "b": "2"}, cache=tmp_path / "c", fresh=True).reuse() is None
    out.write_text("edited")
    assert stagecache.Stage("s", {"a": "1", "b": "2"}, cache=tmp_path / "c").why_not() == (
        f"output {out} changed since it was produced"
    )
    out.unlink()
    assert stagecache.Stage("s", {"a": "1", "b": "2"}, cache=tmp_path / "c").why_not() == f"output {out} is missing"


def test_kt_fresh_runs_every_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done()
    monkeypatch.setenv("KT_FRESH", "1")
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).why_not() == "--fresh: every stage runs"
    monkeypatch.setenv("KT_FRESH", "0")
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).why_not() is None


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda text: text.replace('"n": 3', '"n": 4'),  # a result edited by hand: the seal no longer holds
        lambda text: text[: len(text) // 2],  # truncated
        lambda text: "[]",  # valid JSON, not a record
    ],
)
def test_a_corrupted_record_is_detected_and_re_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: object
) -> None:
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done({"n": 3})
    record = tmp_path / "s.json"
    record.write_text(corrupt(record.read_text()))  # type: ignore[operator]
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse() is None
    assert "the record" in capsys.readouterr().out
    assert "s" not in stagecache.last_outcomes(tmp_path)
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done({"n": 3})  # re-run: recorded afresh
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse() is not None


def test_the_release_bench_reads_the_lines_the_stage_cache_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.release import outcomes

    stagecache.Stage("assemble", {"a": "1"}, cache=tmp_path).done()
    stagecache.Stage("assemble", {"a": "1"}, cache=tmp_path).reuse()
    stagecache.Stage("audit", {"a": "1"}, cache=tmp_path).reuse()
    kernel = "kt-kernel: /x/kt_kernel-0.6.1.whl was built from these inputs (key 1, produced t): reused, not rebuilt\n"
    out = capsys.readouterr().out
    assert outcomes(out, builds_kernel=False) == (["audit"], ["assemble"])
    assert outcomes(kernel + out, builds_kernel=True) == (["audit"], ["kt-kernel", "assemble"])
    assert outcomes(out, builds_kernel=True) == (["kt-kernel", "audit"], ["assemble"])


def test_an_edited_record_is_refused_even_with_its_checksum_recomputed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import hashlib

    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done({"passed": False})
    record_path = tmp_path / "s.json"
    record = json.loads(record_path.read_text())
    record["result"] = {"passed": True}
    body = {k: v for k, v in record.items() if k != "record_hmac"}
    # what anyone could recompute: a plain sha256 of the body (the old seal) is no seal
    record["record_hmac"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    record_path.write_text(json.dumps(record))
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse() is None
    out = capsys.readouterr().out
    assert f"s: the record {record_path} is refused: its seal does not hold" in out
    assert "re-running the stage" in out


def test_a_record_from_another_checkout_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "one").done()
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "s.json").write_bytes((tmp_path / "one" / "s.json").read_bytes())
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "two").why_not() == "refused record"
    assert "written by another checkout" in capsys.readouterr().out
    secret = tmp_path / "one" / stagecache.KEY_FILE
    assert secret.stat().st_mode & 0o777 == 0o600


def test_a_record_without_a_seal_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"key": "k", "record_sha256": "x"}))
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse() is None
    assert "it carries no seal" in capsys.readouterr().out


def test_a_result_from_an_outside_service_expires(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stagecache.Stage("r", {"a": "1"}, cache=tmp_path, max_age_s=3600).done({"ok": True})
    assert stagecache.Stage("r", {"a": "1"}, cache=tmp_path, max_age_s=3600).why_not() is None
    import time

    later = time.time() + 2 * 3600
    monkeypatch.setattr(time, "time", lambda: later)
    why = stagecache.Stage("r", {"a": "1"}, cache=tmp_path, max_age_s=3600).why_not()
    assert why is not None
    assert why.startswith("expired: produced ")
    assert "2.0 h ago" in why
    assert stagecache.Stage("r", {"a": "1"}, cache=tmp_path).why_not() is None  # no max age: kept


def test_a_second_run_of_a_stage_waits_naming_the_first_ones_pid(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap
    import time

    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(paths.ROOT)!r})
        from pathlib import Path
        from base import stagecache
        s = stagecache.Stage("s", {{"a": "1"}}, cache=Path({str(tmp_path)!r}))
        if s.reuse() is None:
            print("holding", flush=True)
            time.sleep(float(sys.argv[1]))
            s.done({{"by": sys.argv[2]}})
        print("done", flush=True)
        """
    )
    with subprocess.Popen([sys.executable, "-c", script, "3", "first"], stdout=subprocess.PIPE, text=True) as first:
        assert first.stdout is not None
        while (line := first.stdout.readline()) and line.strip() != "holding":
            pass
        assert line.strip() == "holding"
        t0 = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-c", script, "0", "second"], capture_output=True, text=True, check=True, timeout=60
        )
        waited = time.monotonic() - t0
        first.wait(timeout=60)
    assert f"another run of this stage holds {tmp_path / 's.lock'} (pid {first.pid}:" in second.stdout
    assert waited > 1.0
    # the second saw the first's record once it could look: reused, not run again
    assert "s: reused" in second.stdout
    assert json.loads((tmp_path / "s.json").read_text())["result"] == {"by": "first"}


def test_a_file_the_stage_read_beyond_its_key_is_recorded_and_re_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    (root / "pkg").mkdir(parents=True)
    (root / "data.txt").write_text("one")
    (root / "pkg" / "inside.txt").write_text("covered")
    monkeypatch.setattr(paths, "ROOT", root)
    monkeypatch.setattr(paths, "BUILD", root / "build")
    monkeypatch.setattr(paths, "DIST", root / "dist")
    stage = stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "c", covers=[root / "pkg"])
    assert stage.reuse() is None
    (root / "data.txt").read_text()  # read by the stage, named by no ingredient
    (root / "pkg" / "inside.txt").read_text()  # read, but its tree is an ingredient
    stage.done()
    record = json.loads((tmp_path / "c" / "s.json").read_text())
    assert list(record["reads"]["files"]) == ["data.txt"]
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "c").why_not() is None
    (root / "data.txt").write_text("two")
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "c").why_not() == "changed: read:data.txt"


def test_the_environment_allowlist_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from base import keys

    monkeypatch.setenv("CXXFLAGS", "-O3")
    env = keys.environment("kernel")
    assert env["CXXFLAGS"] == "-O3"
    assert "KT_KERNEL_CPU_VARIANT" not in env
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path, environment=env).done()
    assert json.loads((tmp_path / "s.json").read_text())["environment"]["CXXFLAGS"] == "-O3"
    monkeypatch.setenv("CXXFLAGS", "-O2")
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path, environment=keys.environment("kernel")).why_not() == (
        "changed: env:CXXFLAGS"
    )


def test_a_lock_held_past_the_timeout_names_its_holder_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys,time;f=open(sys.argv[1],'a+');fcntl.flock(f,fcntl.LOCK_EX);"
            "f.write('pid 4242: nox -s verify_install');f.flush();print('held',flush=True);time.sleep(60)",
            str(tmp_path / "s.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    with holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            monkeypatch.setenv(stagecache.LOCK_TIMEOUT_ENV, "0.5")
            with pytest.raises(stagecache.LockTimeout) as exc:
                stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse()
        finally:
            holder.kill()
    message = str(exc.value)
    assert f"{tmp_path / 's.lock'} is still held by pid 4242: nox -s verify_install after" in message
    assert "kill its pid" in message
    assert "KT_LOCK_TIMEOUT_S (now 0.5)" in message


def test_resolution_takes_its_records_in_one_order_whatever_the_pythons_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--python 3.12 --python 3.11` beside `--python 3.11 --python 3.12`: both take resolve-*-cp311 first."""
    from tests import distkit
    from verify import cached, resolution

    taken: list[str] = []

    class Looked:
        hit: tuple[dict[str, object], dict[str, object]]

        def __init__(self, name: str, *args: object, **kwargs: object) -> None:
            taken.append(name)
            self.hit = (
                {
                    "profile": name,
                    "python": "",
                    "problems": [],
                    "drift": [],
                    "not_verified": "",
                    "packages": 0,
                    "seconds": 0.0,
                },
                {"outcome": "reused"},
            )

    dist = tmp_path / "dist"
    distkit.make_release(dist, {}, pythons=("3.11", "3.12"))
    monkeypatch.setattr(cached, "Lookup", Looked)
    resolution.run(dist, [("sft", "3.12"), ("sft", "3.11"), ("serve", "3.12")], {})
    assert taken == sorted(taken) == ["resolve-serve-cp312", "resolve-sft-cp311", "resolve-sft-cp312"]
