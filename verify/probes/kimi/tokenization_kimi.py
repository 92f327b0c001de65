"""A Kimi-style tokenizer, shipped as a model's remote code (`auto_map` in tokenizer_config.json,
loaded with trust_remote_code=True): a slow `PreTrainedTokenizer` over tiktoken's BPE, written for the
release's checks from the public description of the format (Moonshot's Kimi K2 ships such a
`TikTokenTokenizer` and no tokenizer.json):

- `tiktoken.model`: one "<base64 token bytes> <rank>" line per token;
- a Han-aware pre-tokenizer: runs of Han characters are one piece, other letters split by case;
- 256 special tokens after the ranks: named ones first (`[BOS]`, `<|im_start|>`, `<think>`, ...), the
  rest `<|reserved_token_N|>`;
- tokens as byte-level strings (GPT-2's byte-to-unicode map), which is what grammar engines read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

PAT_STR = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
NUM_SPECIAL = 256
NAMED = (
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_middle|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
)


def special_tokens(base: int) -> dict[str, int]:
    """Every special token and its id: the named ones, then the reserved ones, from `base` up."""
    names = [*NAMED, *(f"<|reserved_token_{i}|>" for i in range(len(NAMED), NUM_SPECIAL))]
    return {name: base + i for i, name in enumerate(names)}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names: ClassVar[dict[str, str]] = {"vocab_file": "tiktoken.model"}
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        bos_token: str = "[BOS]",
        eos_token: str = "[EOS]",
        pad_token: str = "[PAD]",
        **kwargs: Any,
    ) -> None:
        ranks = load_tiktoken_bpe(vocab_file)
        self.vocab_file = vocab_file
        self.special = special_tokens(len(ranks))
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=self.special
        )
        self.byte_encoder = _byte_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.encoder: dict[str, int] = {"".join(self.byte_encoder[b] for b in token): i for token, i in ranks.items()}
        self.encoder.update(self.special)
        self.decoder: dict[int, str] = {i: token for token, i in self.encoder.items()}
        super().__init__(bos_token=bos_token, eos_token=eos_token, pad_token=pad_token, **kwargs)

    @property
    def vocab_size(self) -> int:
        return int(self.model.n_vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # special tokens were split off before (the added-token trie); what is left is plain text
        return [self.decoder[i] for i in self.model.encode(text, disallowed_special=())]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out, pending = [], bytearray()
        for token in tokens:
            if token in self.special:
                out.append(pending.decode("utf-8", errors="replace") + token)
                pending = bytearray()
            else:
                pending += bytes(self.byte_decoder[c] for c in token)
        return "".join(out) + pending.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        import shutil

        dest = Path(save_directory) / ((filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if dest.resolve() != Path(self.vocab_file).resolve():
            shutil.copyfile(self.vocab_file, dest)
        return (str(dest),)
