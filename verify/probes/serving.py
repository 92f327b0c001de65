"""Serving on CPU through SGLang's own code, in an installed serve environment (one JSON line):

1. a Kimi-style tokenizer (verify/probes/kimi/tokenization_kimi.py as a model's remote code, its BPE
   ranks trained here with tiktoken's own trainer) loaded by SGLang's `get_tokenizer(path,
   trust_remote_code=True)`: its ids against tiktoken's on a mixed corpus, every special and
   reserved token, the chat template against the manual construction;
2. JSON-schema grammars through SGLang's xgrammar backend with that tokenizer: a valid document
   accepted token by token, invalid ones rejected, the token bitmask applied to CPU logits by the
   same `GrammarMask.apply` SGLang's sampler calls (and the backend's own `apply_vocab_mask`, which
   the reasoning-parser path calls).

    python serving.py WORK_DIR
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REMOTE_CODE = HERE / "kimi" / "tokenization_kimi.py"
VOCAB_SIZE = 256 + 160  # the byte tokens and 160 merges: small, and every text still encodes
TRAIN = (
    "KTransformers runs large MoE models on CPUs and GPUs together. 大模型在CPU和GPU上协同运行，专家权重留在内存里。"
    "def forward(self, x):\n    return self.experts(x) + self.shared(x)\n"
    "The quick brown fox jumps over the lazy dog; 敏捷的棕色狐狸跳过了懒狗。 1234567890 "
    '{"name": "Kimi", "age": 3, "tags": ["moe", "cpu"]} 今日は良い天気ですね。 emoji 🙂👍🏽 done.\n'
) * 4
CORPUS = [
    "Hello, world! 你好，世界。",
    "KTransformers让万亿参数的MoE模型在单机上运行",
    "混合 mixed 中文and English 文本 text",
    "今日は良い天気ですね。한국어도 있습니다.",
    "emoji: 🙂👍🏽🚀 and flags 🇨🇳🇺🇸",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "spaces    and\ttabs\t\t and\n\n\nnewlines   \n  trailing   ",
    "numbers 3.14159 1234567890 and 1,000,000",
    '{"name": "Kimi", "age": 3, "nested": {"a": [1, 2, 3]}}',
    "<|im_start|>user<|im_middle|>Say hi<|im_end|>",
    "<think>The user wants JSON.</think>Here it is.",
    "before <|reserved_token_100|> after [BOS] [EOS]",
    "",
    " ",
    "\n",
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
VALID = '{"name": "Kimi", "age": 3}'
INVALID = {
    "wrong type": '{"name": "Kimi", "age": "3"}',
    "missing required key": '{"name": "Kimi"}',
    "trailing garbage": '{"name": "Kimi", "age": 3} extra',
}


def _module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("kt_kimi_tokenizer", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_tokenizer_dir(work: Path) -> tuple[Path, Any]:
    """A model directory holding only the tokenizer: ranks, remote code, tokenizer_config.json."""
    import base64

    from tiktoken._educational import bpe_train

    kimi = _module(REMOTE_CODE)
    simple = r"[\p{Han}]+| ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+(?!\S)|\s+"  # the trainer's split
    ranks = bpe_train(data=TRAIN, vocab_size=VOCAB_SIZE, pat_str=simple, visualise=None)
    model = work / "kimi-tokenizer"
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir(parents=True)
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    (model / "tiktoken.model").write_text("\n".join(lines) + "\n")
    shutil.copyfile(REMOTE_CODE, model / "tokenization_kimi.py")
    specials = kimi.special_tokens(len(ranks))
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant<|im_middle|>{% endif %}"
    )
    config = {
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "model_max_length": 8192,
        "chat_template": template,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for t, i in specials.items()
        },
    }
    (model / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    import tiktoken

    reference = tiktoken.Encoding(
        name="reference", pat_str=kimi.PAT_STR, mergeable_ranks=ranks, special_tokens=specials
    )
    return model, reference


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def check_tokenizer(tok: Any, ref: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"class": type(tok).__name__, "mismatches": []}
    compared = 0
    for text in CORPUS:
        for split, want in (
            (False, ref.encode(text, allowed_special="all")),
            (True, ref.encode(text, disallowed_special=())),
        ):
            got = tok.encode(text, add_special_tokens=False, split_special_tokens=split)
            compared += len(want)
            if got != want:
                i = _first_difference(got, want)
                out["mismatches"].append(
                    {
                        "text": text,
                        "split_special_tokens": split,
                        "at": i,
                        "got": got[i : i + 8],
                        "want": want[i : i + 8],
                    }
                )
            elif not split and tok.decode(got) != text:
                out["mismatches"].append({"text": text, "decoded": tok.decode(got)})
    specials = ref._special_tokens
    wrong = [t for t, i in specials.items() if tok.convert_tokens_to_ids(t) != i or tok.decode([i]) != t]
    out["special_wrong"] = wrong[:10]
    messages = [{"role": "system", "content": "You are Kimi."}, {"role": "user", "content": "用JSON回答 please"}]
    chat = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    manual = "".join(f"<|im_start|>{m['role']}<|im_middle|>{m['content']}<|im_end|>" for m in messages)
    want_chat = ref.encode(manual + "<|im_start|>assistant<|im_middle|>", allowed_special="all")
    out.update(
        corpus_texts=len(CORPUS),
        ids_compared=compared,
        special_tokens=len(specials),
        chat_template_equal=chat == want_chat,
        native_equal=not out["mismatches"] and not wrong and chat == want_chat,
    )
    if chat != want_chat:
        i = _first_difference(chat, want_chat)
        out["chat_template_difference"] = {"at": i, "got": chat[i : i + 8], "want": want_chat[i : i + 8]}
    return out


def _walk(backend: Any, tok: Any, doc: str, vocab: int) -> dict[str, Any]:
    """Feed `doc`'s tokens through a fresh grammar; at each step the bitmask goes onto CPU logits the way
    SGLang's sampler applies it. The first token the mask forbids (or the matcher refuses) rejects."""
    import torch
    from sglang.srt.constrained.base_grammar_backend import GrammarMask

    grammar = backend.dispatch_json(json.dumps(SCHEMA))
    ids = [*tok.encode(doc, add_special_tokens=False), tok.eos_token_id]
    mask = grammar.allocate_vocab_mask(vocab, 1, "cpu")
    for step, token in enumerate(ids):
        grammar.fill_vocab_mask(mask, 0)
        logits = torch.zeros(1, vocab)
        GrammarMask(grammar, mask).apply(logits)
        if not torch.isfinite(logits[0, token]):
            return {
                "accepted": False,
                "step": step,
                "token": token,
                "why": "masked",
                "allowed": int(torch.isfinite(logits).sum()),
            }
        try:
            grammar.accept_token(token)
        except ValueError:
            return {"accepted": False, "step": step, "token": token, "why": "matcher refused"}
    return {"accepted": True, "tokens": len(ids), "terminated": bool(grammar.is_terminated())}


def check_grammar(tok: Any) -> dict[str, Any]:
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    vocab = tok.vocab_size
    backend = XGrammarGrammarBackend(tok, vocab_size=vocab, model_eos_token_ids=[tok.eos_token_id])
    out: dict[str, Any] = {"valid": _walk(backend, tok, VALID, vocab)}
    out["invalid"] = {name: _walk(backend, tok, doc, vocab) for name, doc in INVALID.items()}
    out["accepted"] = 1 if out["valid"]["accepted"] else 0
    out["rejected"] = sum(1 for r in out["invalid"].values() if not r["accepted"])
    out["strict_thinking"] = check_strict_thinking(tok, backend, vocab)
    return out


def check_strict_thinking(tok: Any, backend: Any, vocab: int) -> str:
    """A reasoning request without a schema of its own under strict thinking (a Kimi reasoning parser):
    SGLang masks it through the backend's apply_vocab_mask, not a grammar object's."""
    import torch
    from sglang.srt.constrained.base_grammar_backend import GrammarMask
    from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarBackend
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    reasoner = ReasonerGrammarBackend(backend, ReasoningParser("kimi_k2"), tok, enable_strict_thinking=True)
    grammar = reasoner.init_strict_reasoning_grammar(reasoning=True)
    mask = grammar.allocate_vocab_mask(vocab, 1, "cpu")
    grammar.fill_vocab_mask(mask, 0)
    logits = torch.zeros(1, vocab)
    try:
        GrammarMask(grammar, mask).apply(logits)
    except RuntimeError as exc:
        return f"RuntimeError: {exc}"
    return "ok"


def main() -> None:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model directory: nothing here needs a network
    work = Path(sys.argv[1])
    t0 = time.perf_counter()
    model, ref = make_tokenizer_dir(work)
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    tok = get_tokenizer(str(model), trust_remote_code=True)
    result: dict[str, Any] = {"tokenizer": check_tokenizer(tok, ref)}
    result["json_schema"] = check_grammar(tok)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
