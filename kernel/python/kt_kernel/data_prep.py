"""Prepare chat datasets for supervised fine-tuning: token ids, and labels on the assistant turns only.

    kt-prepare-data DATA... --tokenizer DIR --out OUT      (also: python -m kt_kernel.data_prep ...)
    kt-prepare-data DATA... --tokenizer DIR --verify OUT

DATA is JSONL (one example per line) or a JSON array (the NekoQA-10K file's shape). An example is
ShareGPT-style (``conversations``: ``from``/``value``), chat-style (``messages``: ``role``/``content``)
or an instruction pair (``instruction``, optional ``input``/``history``/``system``, ``output``).
The conversation is rendered with the model's own chat template, read from the local tokenizer
directory (``chat_template.jinja`` or ``tokenizer_config.json``; never the network), and tokenized
as one text. A token is a target (its label is its id) when its first character lies in an
assistant span: what the template adds for assistant turn i, i.e. render(turns[:i+1]) minus
render(turns[:i], add_generation_prompt=True), end-of-turn marker included. Every other label is
-100. Each example goes to eval when sha256(seed, its canonical conversation) falls below
--eval-ratio, else to train: identical conversations always land in the same split.

OUT receives train.jsonl, eval.jsonl and manifest.json (input, tokenizer and template sha256,
options, counts, every dropped example with its reason, each output's sha256), written under a
temporary name and renamed. The bytes depend only on the inputs and options: not on the worker
count, the process or the machine. --verify re-renders every example in fresh processes and checks
the stored ids and labels against the rendering, and that each assistant turn's text is a target.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

IGNORE = -100
BATCH = 128  # examples per work item handed to a worker
ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
}
# The files a tokenizer directory's behaviour depends on (a model directory's weights are not hashed).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)
PROG = "kt-prepare-data"


class PrepError(Exception):
    """Bad input or options: the message names the file, the problem and the fix."""


class Drop(Exception):
    """This example is left out; the message is the reason recorded in the manifest."""


@dataclass(frozen=True)
class Options:
    """What, besides the inputs, decides the output bytes (recorded in the manifest)."""

    seed: int = 0
    eval_ratio: float = 0.05
    max_length: int | None = None
    system: str | None = None
    chat_template: str | None = None  # a template text that replaces the tokenizer's own
    trust_remote_code: bool = False


# --------------------------------------------------------------------------- examples


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise Drop(f"{where} is {type(value).__name__}, not text")
    return value


def conversation(record: object, default_system: str | None = None) -> list[dict[str, str]]:
    """The example as chat messages ``[{"role", "content"}]``, or Drop with the reason."""
    if not isinstance(record, dict):
        raise Drop(f"not a JSON object ({type(record).__name__})")
    msgs: list[dict[str, str]] = []
    turns = record.get("conversations", record.get("messages"))
    if turns is not None:
        key = "conversations" if "conversations" in record else "messages"
        if not isinstance(turns, list) or not turns:
            raise Drop(f"'{key}' is not a non-empty list")
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise Drop(f"{key}[{i}] is not an object")
            role = turn.get("from", turn.get("role"))
            if role not in ROLES:
                raise Drop(f"{key}[{i}] has role {role!r}; known: {', '.join(sorted(ROLES))}")
            content = _text(turn.get("value", turn.get("content")), f"{key}[{i}] content")
            msgs.append({"role": ROLES[role], "content": content})
    elif "instruction" in record and "output" in record:
        history = record.get("history") or []
        if not isinstance(history, list):
            raise Drop("'history' is not a list of [prompt, response] pairs")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise Drop(f"history[{i}] is not a [prompt, response] pair")
            msgs.append({"role": "user", "content": _text(pair[0], f"history[{i}][0]")})
            msgs.append({"role": "assistant", "content": _text(pair[1], f"history[{i}][1]")})
        prompt = _text(record["instruction"], "'instruction'")
        extra = record.get("input")
        if extra:
            prompt = f"{prompt}\n{_text(extra, 'input')}"
        msgs.append({"role": "user", "content": prompt})
        msgs.append({"role": "assistant", "content": _text(record["output"], "'output'")})
    else:
        keys = ", ".join(sorted(map(str, record))) or "none"
        raise Drop(f"no conversation: expected 'conversations', 'messages' or 'instruction'+'output' (keys: {keys})")
    system = record.get("system", default_system)
    if system and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": _text(system, "'system'")})
    for i, m in enumerate(msgs):
        if m["role"] == "system" and i:
            raise Drop(f"turn {i} is a system turn after the first")
        if not m["content"].strip():
            raise Drop(f"turn {i} ({m['role']}) is empty")
    if not any(m["role"] == "assistant" for m in msgs):
        raise Drop("no assistant turn: nothing to train on")
    if msgs[-1]["role"] != "assistant":
        raise Drop(f"ends with a {msgs[-1]['role']} turn that has no answer")
    return msgs


def canonical(msgs: Sequence[dict[str, str]]) -> bytes:
    """The conversation as canonical JSON bytes (what the split hash and the example key read)."""
    return json.dumps(list(msgs), ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def split_of(msgs: Sequence[dict[str, str]], seed: int, eval_ratio: float) -> tuple[str, str]:
    """("train" | "eval", key): by sha256(seed, conversation); the key is its first 16 hex digits."""
    digest = hashlib.sha256(seed.to_bytes(8, "little", signed=True) + canonical(msgs)).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return ("eval" if u < eval_ratio else "train"), digest.hex()[:16]


# --------------------------------------------------------------------------- rendering


class Renderer:
    """The tokenizer of one directory and its chat template; renders, tokenizes and labels."""

    def __init__(self, tokenizer_dir: Path, opts: Options) -> None:
        try:
            import transformers
        except ImportError as exc:
            raise PrepError(
                f"{PROG} needs transformers (and jinja2) to read the tokenizer and its chat template: "
                "install the fine-tuning profile (pip install 'ktransformers[sft]')"
            ) from exc
        # A tokenizer.json without remote code loads as the fast tokenizer directly (2 s); AutoTokenizer
        # imports every model's configuration first (13 s here, paid again by each worker).
        try:
            config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
        direct = (tokenizer_dir / "tokenizer.json").is_file() and "auto_map" not in config
        loader = transformers.PreTrainedTokenizerFast if direct else transformers.AutoTokenizer
        try:
            self.tok = loader.from_pretrained(
                str(tokenizer_dir), local_files_only=True, trust_remote_code=opts.trust_remote_code
            )
        except Exception as exc:  # tokenizers' parse errors are plain Exceptions
            raise PrepError(f"{tokenizer_dir}: cannot load a tokenizer from it ({type(exc).__name__}: {exc})") from exc
        self.template = opts.chat_template or self.tok.chat_template
        if isinstance(self.template, dict):
            self.template = self.template.get("default")
        if not self.template:
            raise PrepError(
                f"{tokenizer_dir}: the tokenizer has no chat template (chat_template.jinja, or 'chat_template' "
                "in tokenizer_config.json); add the model's template there or pass --chat-template FILE"
            )
        self.fast = bool(getattr(self.tok, "is_fast", False))
        self.opts = opts

    def render(self, msgs: Sequence[dict[str, str]], generation_prompt: bool = False) -> str:
        """The template's text for `msgs`."""
        text = self.tok.apply_chat_template(
            list(msgs), chat_template=self.template, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def spans(self, msgs: Sequence[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The whole conversation's text and the character spans of its assistant turns."""
        try:
            full = self.render(msgs)
            spans = []
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                before = self.render(msgs[:i], generation_prompt=True) if i else ""
                upto = self.render(msgs[: i + 1])
                if not (upto.startswith(before) and full.startswith(upto)):
                    raise Drop(
                        f"the chat template renders turn {i} differently once later turns follow "
                        "(it rewrites earlier turns), so its assistant span is not defined"
                    )
                if len(upto) > len(before):
                    spans.append((len(before), len(upto)))
        except Drop:
            raise
        except Exception as exc:  # a template's raise_exception and Jinja errors
            raise Drop(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
        return full, spans

    def encode(self, full: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """Token ids, labels and each token's character span in `full`."""
        import numpy as np

        if self.fast:
            enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(enc["input_ids"])
            offsets = [tuple(o) for o in enc["offset_mapping"]]
        else:  # no offsets from a slow tokenizer: encode the pieces between span boundaries apart
            cuts = sorted({0, len(full), *(c for s in spans for c in s)})
            ids, offsets = [], []
            for a, b in itertools.pairwise(cuts):
                piece = self.tok.encode(full[a:b], add_special_tokens=False)
                ids += piece
                offsets += [(a, b)] * len(piece)
        # a token is a target when its first character lies in a span (spans are sorted, disjoint)
        first = np.fromiter((a for a, _ in offsets), dtype=np.int64, count=len(offsets))
        bounds = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        k = np.searchsorted(bounds[:, 0], first, side="right") - 1
        inside = (k >= 0) & (first < bounds[np.maximum(k, 0), 1]) if len(bounds) else np.zeros(len(first), bool)
        labels = np.where(inside, np.asarray(ids, dtype=np.int64), IGNORE).tolist()
        return ids, labels, offsets


@dataclass(frozen=True)
class Result:
    """One example's outcome: a record line for a split, or the reason it was dropped."""

    loc: str
    split: str | None = None
    line: str = ""
    tokens: int = 0
    targets: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Built:
    """One example, rendered and tokenized."""

    msgs: list[dict[str, str]]
    text: str
    ids: list[int]
    labels: list[int]
    offsets: list[tuple[int, int]]
    spans: list[tuple[int, int]]


def build(r: Renderer, raw: object) -> Built:
    """Parse, render, tokenize and label one raw example (a JSONL line or a parsed element), or Drop."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise Drop(f"not JSON ({exc.msg} at column {exc.colno})") from exc
    msgs = conversation(raw, r.opts.system)
    full, spans = r.spans(msgs)
    ids, labels, offsets = r.encode(full, spans)
    if r.opts.max_length and len(ids) > r.opts.max_length:
        raise Drop(f"{len(ids)} tokens, more than --max-length {r.opts.max_length}")
    if all(x == IGNORE for x in labels):
        raise Drop("no token falls in an assistant span")
    return Built(msgs, full, ids, labels, offsets, spans)


def prepare_one(r: Renderer, loc: str, raw: object) -> Result:
    """One example's record line and split, or why it is dropped."""
    try:
        b = build(r, raw)
    except Drop as d:
        return Result(loc, reason=str(d))
    split, key = split_of(b.msgs, r.opts.seed, r.opts.eval_ratio)
    rec = {"id": loc, "key": key, "input_ids": b.ids, "labels": b.labels}
    targets = sum(1 for x in b.labels if x != IGNORE)
    return Result(loc, split, json.dumps(rec, separators=(",", ":"), sort_keys=True), len(b.ids), targets)


def verify_one(r: Renderer, loc: str, raw: object, stored: str | None) -> str | None:  # noqa: PLR0911
    """None when `stored` (a record line; None for an example the manifest lists as dropped) is what
    a fresh rendering gives, else the first difference in words."""
    try:
        b = build(r, raw)
    except Drop as d:
        return None if stored is None else f"{loc}: stored, but the rendering drops it ({d})"
    if not stored:
        return f"{loc}: the rendering keeps it, but the output has no record for it"
    try:
        rec = json.loads(stored)
    except json.JSONDecodeError:
        return f"{loc}: its record is not JSON"
    if not isinstance(rec, dict) or rec.get("id") != loc:
        return f"{loc}: the record in its place is {rec.get('id') if isinstance(rec, dict) else rec!r}"
    if rec.get("input_ids") != b.ids:
        return f"{loc}: input_ids differ from the tokenized rendering"
    labels = rec.get("labels")
    if not isinstance(labels, list) or len(labels) != len(b.ids):
        return f"{loc}: {len(labels) if isinstance(labels, list) else 'no'} labels for {len(b.ids)} tokens"
    for j, (got, exp) in enumerate(zip(labels, b.labels, strict=True)):
        if got != exp:
            a, e = b.offsets[j]
            where = "inside an assistant span" if exp != IGNORE else "outside every assistant span"
            return f"{loc}: label of token {j} ({b.text[a:e]!r}, chars {a}-{e}, {where}) is {got}, expected {exp}"
    # Independently of the rule: every character of each assistant turn's text is covered by targets.
    covered = bytearray(len(b.text))
    for j, x in enumerate(labels):
        if x != IGNORE:
            a, e = b.offsets[j]
            covered[a:e] = b"\x01" * (e - a)
    turns = [m for m in b.msgs if m["role"] == "assistant"]
    for n, ((s, e), m) in enumerate(zip(b.spans, turns, strict=False)):
        text = m["content"].strip()  # a template may trim it
        at = b.text.find(text, s, e)
        if at < 0 or not all(covered[at : at + len(text)]):
            return f"{loc}: assistant turn {n + 1}'s text is not all among the targets"
    return None


# --------------------------------------------------------------------------- inputs


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PrepError(f"{path}: no such file") from exc
    except UnicodeDecodeError as exc:
        raise PrepError(f"{path}: not UTF-8 text (byte {exc.start}); convert it to UTF-8") from exc
    except OSError as exc:
        raise PrepError(f"{path}: cannot read it ({exc.strerror})") from exc


def examples(paths: Sequence[Path]) -> Iterator[tuple[str, object]]:
    """(location, raw example) of every input, in order: "name:LINE" for JSONL (the line, unparsed),
    "name#INDEX" for a JSON array (the parsed element)."""
    for path in paths:
        text = _read_text(path)
        if text.lstrip().startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as exc:
                raise PrepError(f"{path}: a JSON array that does not parse ({exc.msg}, line {exc.lineno})") from exc
            for i, item in enumerate(items):
                yield f"{path.name}#{i}", item
        else:
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    yield f"{path.name}:{n}", line


def sha256_file(path: Path) -> str:
    """The file's sha256, hex."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tokenizer_files(tokenizer_dir: Path) -> dict[str, str]:
    """sha256 of each file the tokenizer's behaviour depends on; an error when there is none."""
    if not tokenizer_dir.is_dir():
        raise PrepError(f"{tokenizer_dir}: no such tokenizer directory")
    files = {n: sha256_file(tokenizer_dir / n) for n in TOKENIZER_FILES if (tokenizer_dir / n).is_file()}
    if not files:
        raise PrepError(
            f"{tokenizer_dir}: none of {', '.join(TOKENIZER_FILES[:3])}, ... is there; give the directory that "
            "holds the model's tokenizer"
        )
    return files


def fingerprint(data: Sequence[Path], files: dict[str, str], r: Renderer) -> dict[str, Any]:
    """What the manifest records about the inputs (`files`: tokenizer_files): names and sha256,
    never absolute paths."""
    whole = hashlib.sha256("".join(f"{n}\0{h}\n" for n, h in sorted(files.items())).encode()).hexdigest()
    names = [p.name for p in data]
    if len(set(names)) != len(names):
        raise PrepError("two inputs share a file name; examples are identified by name:line, so rename one")
    return {
        "inputs": [{"name": p.name, "sha256": sha256_file(p), "bytes": p.stat().st_size} for p in data],
        "tokenizer": {"class": type(r.tok).__name__, "files": files, "sha256": whole, "fast": r.fast},
        "chat_template": {
            "sha256": hashlib.sha256(str(r.template).encode()).hexdigest(),
            # an override is kept whole, so --verify renders with it too
            **({"source": "--chat-template", "text": r.template} if r.opts.chat_template else {"source": "tokenizer"}),
        },
    }


# --------------------------------------------------------------------------- workers

_WORKER: dict[str, Renderer] = {}  # this process's renderer, made once by _init


def _init(tokenizer_dir: str, opts: dict[str, Any]) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER["r"] = Renderer(Path(tokenizer_dir), Options(**opts))


def _prepare_batch(batch: list[tuple[str, object]]) -> list[Result]:
    return [prepare_one(_WORKER["r"], loc, raw) for loc, raw in batch]


def _verify_batch(batch: list[tuple[str, object, str | None]]) -> list[str | None]:
    return [verify_one(_WORKER["r"], loc, raw, stored) for loc, raw, stored in batch]


def _batch_size(total: int, workers: int) -> int:
    """Examples per work item: up to BATCH, small enough that every worker gets a share (the bytes
    written do not depend on it)."""
    return max(1, min(BATCH, total // (4 * workers)))


def _batches(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _mapped(fn: Any, batches: Iterable[list[Any]], r: Renderer, tokenizer_dir: Path, workers: int) -> Iterator[Any]:
    """fn over the batches, results in input order: in this process with `r`, or in `workers`
    spawned ones, each loading its own renderer of `tokenizer_dir` with r's options."""
    opts = r.opts
    if workers <= 1:
        _WORKER["r"] = r  # the tokenizer loaded once, not again for the work
        for b in batches:
            yield from fn(b)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork under tokenizers' threads
    with ctx.Pool(workers, initializer=_init, initargs=(str(tokenizer_dir), asdict(opts))) as pool:
        for out in pool.imap(fn, batches, chunksize=1):
            yield from out


class Progress:
    """A tqdm bar on a terminal; elsewhere a line every 10 s and one at the end."""

    def __init__(self, total: int, what: str) -> None:
        self.total, self.what, self.done, self.t0, self.last = total, what, 0, time.monotonic(), time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="ex", desc=what, file=sys.stderr)
            except ImportError:
                pass

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.last >= 10:
            self.last = time.monotonic()
            print(f"{PROG}: {self.what} {self.done}/{self.total} ...", file=sys.stderr, flush=True)

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
        return time.monotonic() - self.t0


# --------------------------------------------------------------------------- commands


def _workers(n: int | None) -> int:
    return max(1, n if n is not None else min(os.cpu_count() or 1, 8))


def prepare(
    data: Sequence[Path], tokenizer_dir: Path, out: Path, opts: Options, workers: int | None = None
) -> dict[str, Any]:
    """Write train.jsonl, eval.jsonl and manifest.json into `out` (atomically); returns the manifest."""
    if not 0 <= opts.eval_ratio < 1:
        raise PrepError(f"--eval-ratio {opts.eval_ratio}: give a fraction in [0, 1)")
    if out.exists():
        raise PrepError(f"{out} exists; remove it or choose another output directory")
    items = list(examples(data))  # reads (and checks) every input before anything is written
    files = tokenizer_files(tokenizer_dir)
    r = Renderer(tokenizer_dir, opts)
    meta = fingerprint(data, files, r)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        counts = {"examples": len(items), "train": 0, "eval": 0, "dropped": 0, "tokens": 0, "targets": 0}
        dropped = []
        progress = Progress(len(items), "preparing")
        with (
            (tmp / "train.jsonl").open("w", encoding="utf-8", newline="\n") as train,
            (tmp / "eval.jsonl").open("w", encoding="utf-8", newline="\n") as ev,
        ):
            n = _workers(workers)
            for res in _mapped(_prepare_batch, _batches(items, _batch_size(len(items), n)), r, tokenizer_dir, n):
                progress.update()
                if res.split is None:
                    counts["dropped"] += 1
                    dropped.append({"example": res.loc, "reason": res.reason})
                    continue
                (train if res.split == "train" else ev).write(res.line + "\n")
                counts[res.split] += 1
                counts["tokens"] += res.tokens
                counts["targets"] += res.targets
        seconds = progress.close()
        if counts["train"] == 0:
            reasons = Counter(d["reason"] for d in dropped).most_common(3)
            why = "; ".join(f"{n} x {reason}" for reason, n in reasons) or "every example went to eval"
            raise PrepError(
                f"none of the {len(items)} examples is left for train.jsonl ({counts['dropped']} dropped: {why}); "
                f"nothing written to {out}"
            )
        from ._version import __version__

        manifest = {
            "tool": PROG,
            "kt_kernel": __version__,
            **meta,
            "options": {k: v for k, v in asdict(opts).items() if k not in ("chat_template",)},
            "labels": {
                "ignore_index": IGNORE,
                "rule": "a token is a target when its first character is in an assistant span",
            },
            "counts": counts,
            "dropped": dropped,
            "outputs": {
                n: {"sha256": sha256_file(tmp / n), "records": counts[n.split(".")[0]]}
                for n in ("train.jsonl", "eval.jsonl")
            },
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    manifest["seconds"] = seconds  # reported, never written: the bytes do not depend on the clock
    return manifest


def verify(
    data: Sequence[Path], tokenizer_dir: Path, out: Path, workers: int | None = None, trust: bool = False
) -> list[str]:
    """Every problem found in `out` against a fresh rendering of `data` (empty: all verified)."""
    try:
        manifest = json.loads(_read_text(out / "manifest.json"))
    except json.JSONDecodeError as exc:
        raise PrepError(f"{out / 'manifest.json'}: not JSON ({exc.msg}); was {out} written by {PROG}?") from exc
    try:
        o = manifest["options"]
        opts = Options(
            seed=o["seed"],
            eval_ratio=o["eval_ratio"],
            max_length=o["max_length"],
            system=o["system"],
            chat_template=manifest["chat_template"].get("text"),
            trust_remote_code=trust,
        )
        outputs, dropped = manifest["outputs"], {d["example"] for d in manifest["dropped"]}
    except (KeyError, TypeError, AttributeError) as exc:
        raise PrepError(f"{out / 'manifest.json'}: not a {PROG} manifest ({exc!r} missing or malformed)") from exc
    problems = []
    for name, want in outputs.items():
        if not (out / name).is_file():
            problems.append(f"{out / name}: missing")
        elif (got := sha256_file(out / name)) != want["sha256"]:
            problems.append(
                f"{out / name}: sha256 {got[:16]}... is not the manifest's {want['sha256'][:16]}... (edited?)"
            )
    items = list(examples(data))
    files = tokenizer_files(tokenizer_dir)
    r = Renderer(tokenizer_dir, opts)
    meta = fingerprint(data, files, r)
    if meta["inputs"] != manifest["inputs"]:
        names = ", ".join(i["name"] for i in manifest["inputs"])
        raise PrepError(f"the DATA files given are not the ones {out} was prepared from ({names}, by sha256)")
    if meta["tokenizer"] != manifest["tokenizer"]:
        raise PrepError(f"the tokenizer given is not the one {out} was prepared from (its files' sha256 differ)")
    if meta["chat_template"] != manifest["chat_template"]:
        raise PrepError(f"the tokenizer's chat template is not the one {out} was prepared from")
    if problems and any(p.endswith(": missing") for p in problems):
        return problems
    lines = {n: iter((out / f"{n}.jsonl").read_text(encoding="utf-8").splitlines()) for n in ("train", "eval")}

    def jobs() -> Iterator[tuple[str, object, str | None]]:
        for loc, raw in items:
            if loc in dropped:
                yield loc, raw, None
                continue
            msgs_split = _split_for(raw, opts)
            yield loc, raw, next(lines[msgs_split], "") if msgs_split else ""

    progress = Progress(len(items), "verifying")
    n = _workers(workers)
    for problem in _mapped(_verify_batch, _batches(jobs(), _batch_size(len(items), n)), r, tokenizer_dir, n):
        progress.update()
        if problem:
            problems.append(problem)
    progress.close()
    for split, rest in lines.items():
        if (extra := sum(1 for _ in rest)) and not problems:
            problems.append(f"{out / (split + '.jsonl')}: {extra} records more than the inputs give")
    return problems


def _split_for(raw: object, opts: Options) -> str | None:
    """The split an example belongs to by its content alone (None when it is not a conversation)."""
    try:
        msgs = conversation(json.loads(raw) if isinstance(raw, str) else raw, opts.system)
    except (Drop, json.JSONDecodeError):
        return None
    return split_of(msgs, opts.seed, opts.eval_ratio)[0]


def main(argv: list[str] | None = None) -> int:
    """The kt-prepare-data command; returns the exit status (2: bad input, 1: --verify found problems)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="+", type=Path, help="JSONL or JSON-array files of examples")
    p.add_argument("--tokenizer", type=Path, required=True, help="local tokenizer (or model) directory")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--out", type=Path, help="output directory (must not exist)")
    dest.add_argument("--verify", type=Path, metavar="OUT", help="check OUT against a fresh rendering of DATA")
    p.add_argument("--eval-ratio", type=float, help=f"fraction held out (default {Options.eval_ratio})")
    p.add_argument("--seed", type=int, help=f"seed of the train/eval split (default {Options.seed})")
    p.add_argument("--max-length", type=int, help="drop examples longer than this many tokens")
    p.add_argument("--system", help="system prompt for examples that have none")
    p.add_argument("--chat-template", type=Path, help="a Jinja template file to use instead of the tokenizer's")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the tokenizer directory's own code")
    p.add_argument("--workers", type=int, help="processes (default: cores, at most 8); output is the same for any")
    args = p.parse_args(argv)
    prep_only = ("eval_ratio", "seed", "max_length", "system", "chat_template")
    if args.verify and (given := [n for n in prep_only if getattr(args, n) is not None]):
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        p.error(f"--verify reads the options from OUT/manifest.json; drop {flags}")
    try:
        if args.verify:
            problems = verify(args.data, args.tokenizer, args.verify, args.workers, args.trust_remote_code)
            for problem in problems[:20]:
                print(f"{PROG}: {problem}", file=sys.stderr)
            if problems:
                print(f"{PROG}: {len(problems)} problem(s) in {args.verify}", file=sys.stderr)
                return 1
            print(f"verified {args.verify}: every record's ids and labels match the template's rendering")
            return 0
        template = _read_text(args.chat_template) if args.chat_template else None
        opts = Options(
            seed=Options.seed if args.seed is None else args.seed,
            eval_ratio=Options.eval_ratio if args.eval_ratio is None else args.eval_ratio,
            max_length=args.max_length,
            system=args.system,
            chat_template=template,
            trust_remote_code=args.trust_remote_code,
        )
        m = prepare(args.data, args.tokenizer, args.out, opts, args.workers)
    except PrepError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    c = m["counts"]
    rate = c["examples"] / m["seconds"] if m["seconds"] else 0.0
    print(
        f"{c['examples']} examples -> train {c['train']}, eval {c['eval']}, dropped {c['dropped']} "
        f"({c['tokens']} tokens, {c['targets']} targets) in {m['seconds']:.1f} s ({rate:.0f} ex/s): {args.out}"
    )
    for d in m["dropped"][:5]:
        print(f"  dropped {d['example']}: {d['reason']}")
    if len(m["dropped"]) > 5:
        print(f"  ... {len(m['dropped']) - 5} more in {args.out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    # The package's module, not this __main__ copy: spawned workers import kt_kernel.data_prep, and
    # its classes (Drop, Renderer) must be the ones the work uses.
    from kt_kernel.data_prep import main as _main

    raise SystemExit(_main())
