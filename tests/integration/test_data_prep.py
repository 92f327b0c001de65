"""kt-prepare-data: the project's fixture conversations (ShareGPT, chat messages, instruction pairs,
a NekoQA-shaped JSON array, broken lines) through a tiny byte-level BPE tokenizer with a Kimi-style
chat template, built in the test with the `tokenizers` library, in the installed wheel's venv:
determinism across processes and worker counts, labels on exactly the assistant turns, --verify
passing and catching a wrong mask, and every bad input a clear error that writes nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import Venv
from tests.integration.test_sft import sft_venv  # noqa: F401  (transformers, tokenizers, jinja2)

DATA = ROOT / "tests" / "integration" / "data"
INPUTS = [DATA / "chat_sharegpt.jsonl", DATA / "chat_nekoqa.json", DATA / "chat_pairs.jsonl"]
MAKE_TOKENIZER = ROOT / "tests" / "integration" / "scripts" / "make_chat_tokenizer.py"
DROPPED = {
    "chat_sharegpt.jsonl:10": "not JSON",
    "chat_sharegpt.jsonl:11": "has role 'observation'",
    "chat_sharegpt.jsonl:12": "no assistant turn",
    "chat_sharegpt.jsonl:13": "turn 1 (assistant) is empty",
    "chat_sharegpt.jsonl:14": "no conversation: expected 'conversations', 'messages' or 'instruction'+'output'",
    "chat_pairs.jsonl:7": "'output' is int, not text",
}
OPTS = ("--eval-ratio", "0.2", "--seed", "1")


def prep(venv: Venv, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = venv.run("-m", "kt_kernel.data_prep", *args, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"kt-prepare-data {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def tokenizer(sft_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("tok") / "kimi-style"
    sft_venv.run(str(MAKE_TOKENIZER), str(out))
    return out


@pytest.fixture(scope="module")
def prepared(sft_venv: Venv, tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("prep") / "serial"
    prep(sft_venv, *map(str, INPUTS), "--tokenizer", str(tokenizer), "--out", str(out), *OPTS, "--workers", "1")
    return out


def test_same_bytes_from_another_process_and_any_worker_count(
    sft_venv: Venv,  # noqa: F811
    tokenizer: Path,
    prepared: Path,
    tmp_path: Path,
) -> None:
    before = [digest(p) for p in INPUTS]
    proc = prep(
        sft_venv,
        *map(str, INPUTS),
        "--tokenizer",
        str(tokenizer),
        "--out",
        str(tmp_path / "par"),
        *OPTS,
        "--workers",
        "3",
    )
    assert [digest(p) for p in INPUTS] == before, "an input changed"
    for name in ("train.jsonl", "eval.jsonl", "manifest.json"):
        assert (prepared / name).read_bytes() == (tmp_path / "par" / name).read_bytes(), name
    assert "30 examples -> train " in proc.stdout, proc.stdout
    assert not list(tmp_path.glob(".par*")), "temporary directory left behind"


def test_manifest_counts_hashes_and_dropped_reasons(prepared: Path, tokenizer: Path) -> None:
    m = json.loads((prepared / "manifest.json").read_text())
    c = m["counts"]
    assert c["examples"] == 30
    assert c["dropped"] == len(DROPPED)
    assert c["train"] + c["eval"] == 24
    assert c["train"] > 0
    assert c["eval"] > 0
    assert {d["example"]: d["reason"] for d in m["dropped"]}.keys() == DROPPED.keys()
    for d in m["dropped"]:
        assert DROPPED[d["example"]] in d["reason"], d
    assert [i["name"] for i in m["inputs"]] == [p.name for p in INPUTS]
    assert [i["sha256"] for i in m["inputs"]] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in INPUTS]
    assert (
        m["tokenizer"]["files"]["tokenizer.json"]
        == hashlib.sha256((tokenizer / "tokenizer.json").read_bytes()).hexdigest()
    )
    template = (tokenizer / "chat_template.jinja").read_text()
    assert m["chat_template"]["sha256"] == hashlib.sha256(template.encode()).hexdigest()
    for name in ("train.jsonl", "eval.jsonl"):
        lines = (prepared / name).read_text().splitlines()
        assert m["outputs"][name] == {
            "sha256": hashlib.sha256((prepared / name).read_bytes()).hexdigest(),
            "records": len(lines),
        }
    assert str(prepared.parent) not in (prepared / "manifest.json").read_text(), "a machine's path in the manifest"


TARGETS = """
import json, sys
from transformers import PreTrainedTokenizerFast
tok = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])
out = {}
for name in ("train.jsonl", "eval.jsonl"):
    for line in open(sys.argv[2] + "/" + name, encoding="utf-8"):
        r = json.loads(line)
        runs, cur = [], []
        for i, l in zip(r["input_ids"], r["labels"]):
            if l != -100:
                assert l == i
                cur.append(i)
            elif cur:
                runs.append(cur); cur = []
        if cur:
            runs.append(cur)
        out[r["id"]] = {"runs": [tok.decode(x) for x in runs], "text": tok.decode(r["input_ids"]), "key": r["key"]}
print(json.dumps(out))
"""


def test_labels_are_the_assistant_turns_and_nothing_else(sft_venv: Venv, tokenizer: Path, prepared: Path) -> None:  # noqa: F811
    got = sft_venv.json("-c", TARGETS, str(tokenizer), str(prepared))
    three = got["chat_sharegpt.jsonl:7"]  # three assistant turns
    assert three["runs"] == [
        "The inner dimension r of the low-rank update B·A added to a frozen weight.<|im_end|>",
        "8 to 64 for most fine-tuning runs.<|im_end|>",
        "You're welcome.<|im_end|>",
    ]
    assert three["text"].startswith("<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>")
    neko = got["chat_nekoqa.json#3"]
    assert neko["runs"] == ["主人辛苦了喵，我给你倒杯热茶吧~<|im_end|>"]  # noqa: RUF001  (Chinese punctuation)
    # instruction + input joined; history becomes earlier turns; a record's own system prompt is used
    assert got["chat_pairs.jsonl:3"]["runs"] == ["bonne nuit<|im_end|>", "guten Morgen<|im_end|>"]
    assert "<|im_user|>user<|im_middle|>And to German?\ngood morning<|im_end|>" in got["chat_pairs.jsonl:3"]["text"]
    assert "<|im_middle|>Answer with numbers only.<|im_end|>" in got["chat_pairs.jsonl:4"]["text"]
    # the same conversation twice: the same key, hence the same split
    assert got["chat_sharegpt.jsonl:8"]["key"] == got["chat_sharegpt.jsonl:9"]["key"]


def test_chatml_targets_include_the_end_of_turn_newline(
    sft_venv: Venv,  # noqa: F811
    tmp_path: Path,
) -> None:
    tok = tmp_path / "chatml"
    sft_venv.run(str(MAKE_TOKENIZER), str(tok), "chatml")
    prep(
        sft_venv,
        str(INPUTS[1]),
        "--tokenizer",
        str(tok),
        "--out",
        str(tmp_path / "o"),
        "--eval-ratio",
        "0",
        "--system",
        "You are a cat.",
    )
    got = sft_venv.json("-c", TARGETS, str(tok), str(tmp_path / "o"))
    assert got["chat_nekoqa.json#1"]["runs"] == ["Of course, master! Show me the problem, nya~<|im_end|>\n"]
    assert got["chat_nekoqa.json#1"]["text"].startswith("<|im_start|>system\nYou are a cat.<|im_end|>\n")
    assert (tmp_path / "o" / "eval.jsonl").read_text() == ""


def test_verify_passes_then_catches_a_wrong_mask(
    sft_venv: Venv,  # noqa: F811
    tokenizer: Path,
    prepared: Path,
    tmp_path: Path,
) -> None:
    args = (*map(str, INPUTS), "--tokenizer", str(tokenizer), "--workers", "2")
    ok = prep(sft_venv, *args, "--verify", str(prepared))
    assert ok.stdout.startswith("verified"), ok.stdout
    # A writer that masked wrongly and hashed its own output: the manifest agrees, the rendering does not.
    bad = tmp_path / "bad"
    shutil.copytree(prepared, bad)
    lines = (bad / "train.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    first_user = rec["labels"].index(-100, 12)  # a token of the user turn, which must stay -100
    rec["labels"][first_user] = rec["input_ids"][first_user]
    lines[0] = json.dumps(rec, separators=(",", ":"), sort_keys=True)
    (bad / "train.jsonl").write_text("\n".join(lines) + "\n")
    m = json.loads((bad / "manifest.json").read_text())
    m["outputs"]["train.jsonl"]["sha256"] = hashlib.sha256((bad / "train.jsonl").read_bytes()).hexdigest()
    (bad / "manifest.json").write_text(json.dumps(m))
    proc = prep(sft_venv, *args, "--verify", str(bad), check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"{rec['id']}: label of token {first_user}" in proc.stderr, proc.stderr
    assert "outside every assistant span" in proc.stderr, proc.stderr
    # An edit the manifest does not know: its sha256 says so.
    (bad / "eval.jsonl").write_text((prepared / "eval.jsonl").read_text() + "\n")
    proc = prep(sft_venv, *args, "--verify", str(bad), check=False)
    assert proc.returncode == 1
    assert "eval.jsonl: sha256" in proc.stderr, proc.stderr
    # Another tokenizer is refused before anything is compared.
    other = tmp_path / "chatml"
    sft_venv.run(str(MAKE_TOKENIZER), str(other), "chatml")
    proc = prep(sft_venv, *map(str, INPUTS), "--tokenizer", str(other), "--verify", str(prepared), check=False)
    assert proc.returncode == 2
    assert "the tokenizer given is not the one" in proc.stderr, proc.stderr


REWRITING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}[earlier answer]{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_rewrites_earlier_turns_drops_those_examples(
    sft_venv: Venv,  # noqa: F811
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    """In this process (--workers 1, where a drop is raised in the same module that catches it) and
    in spawned workers alike."""
    (tmp_path / "t.jinja").write_text(REWRITING)
    for workers in ("1", "2"):
        args = ["--chat-template", str(tmp_path / "t.jinja"), "--workers", workers]
        prep(sft_venv, str(INPUTS[0]), "--tokenizer", str(tokenizer), *args, "--out", str(tmp_path / workers))
    assert (tmp_path / "1" / "manifest.json").read_bytes() == (tmp_path / "2" / "manifest.json").read_bytes()
    m = json.loads((tmp_path / "1" / "manifest.json").read_text())
    reasons = {d["example"]: d["reason"] for d in m["dropped"]}
    assert "rewrites earlier turns" in reasons["chat_sharegpt.jsonl:3"], reasons
    assert "rewrites earlier turns" in reasons["chat_sharegpt.jsonl:7"], reasons
    assert "chat_sharegpt.jsonl:1" not in reasons  # one turn: nothing is rewritten
    assert m["chat_template"]["sha256"] == hashlib.sha256(REWRITING.encode()).hexdigest()


def _bad_cases(tmp: Path, tokenizer: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "latin1.jsonl").write_bytes('{"instruction": "caf\xe9", "output": "ok"}\n'.encode("latin-1"))
    (tmp / "array.json").write_text('[{"instruction": "a", "output": "b"},')
    notok = tmp / "notok"
    notok.mkdir()
    (notok / "README").write_text("weights only")
    notemplate = tmp / "notemplate"
    shutil.copytree(tokenizer, notemplate)
    (notemplate / "chat_template.jinja").unlink()
    broken = tmp / "broken"
    shutil.copytree(tokenizer, broken)
    (broken / "tokenizer.json").write_text('{"model": ')
    (tmp / "exists").mkdir()
    good = [str(INPUTS[1]), "--tokenizer", str(tokenizer)]
    return {
        "missing": ([str(tmp / "nope.jsonl"), "--tokenizer", str(tokenizer)], "nope.jsonl: no such file"),
        "encoding": ([str(tmp / "latin1.jsonl"), "--tokenizer", str(tokenizer)], "not UTF-8 text (byte 20)"),
        "array": ([str(tmp / "array.json"), "--tokenizer", str(tokenizer)], "a JSON array that does not parse"),
        "no_tokenizer_dir": ([str(INPUTS[1]), "--tokenizer", str(tmp / "none")], "no such tokenizer directory"),
        "not_a_tokenizer": ([str(INPUTS[1]), "--tokenizer", str(notok)], "notok: none of tokenizer.json"),
        "broken_tokenizer": ([str(INPUTS[1]), "--tokenizer", str(broken)], "broken: cannot load a tokenizer from it"),
        "no_template": ([str(INPUTS[1]), "--tokenizer", str(notemplate)], "has no chat template"),
        "exists": (good, "exists; remove it or choose another output directory"),
        "ratio": ([*good, "--eval-ratio", "1.5"], "--eval-ratio 1.5: give a fraction in [0, 1)"),
        "same_name": ([str(INPUTS[1]), str(INPUTS[1]), "--tokenizer", str(tokenizer)], "two inputs share a file name"),
        "all_dropped": ([*good, "--max-length", "3"], "examples is left for train.jsonl"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "encoding",
        "array",
        "no_tokenizer_dir",
        "not_a_tokenizer",
        "broken_tokenizer",
        "no_template",
        "exists",
        "ratio",
        "same_name",
        "all_dropped",
    ],
)
def test_bad_input_is_a_clear_error_that_writes_nothing(
    case: str,
    sft_venv: Venv,  # noqa: F811
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    argv, message = _bad_cases(tmp_path, tokenizer)[case]
    out = tmp_path / ("exists" if case == "exists" else "out")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = prep(sft_venv, *argv, "--out", str(out), check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"


def test_the_data_prep_commands_of_the_fine_tuning_doc_run(
    sft_venv: Venv,  # noqa: F811
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    """docs/fine-tuning.md's kt-prepare-data block, run as written with its console script."""
    from tests.unit.test_docs import commands

    (tmp_path / "data").mkdir()
    shutil.copy(INPUTS[1], tmp_path / "data" / "NekoQA-10K.json")
    shutil.copytree(tokenizer, tmp_path / "model")
    script = sft_venv.python.parent / "kt-prepare-data"
    argvs = commands("kt-prepare-data")
    assert argvs
    for argv in argvs:
        proc = subprocess.run([str(script), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, (argv, proc.stderr)
    assert proc.stdout.startswith("verified"), proc.stdout
