"""Build a tiny byte-level BPE tokenizer with a Kimi-style chat template into DIR (no network).

    python make_chat_tokenizer.py DIR [chatml]

Trained with the `tokenizers` library on the project's fixture conversations, saved with
transformers' save_pretrained, so DIR looks like a model's tokenizer directory: tokenizer.json,
tokenizer_config.json and chat_template.jinja. "chatml" writes a ChatML template instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

KIMI = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}{{ raise_exception('unknown role ' + message['role']) }}"
    "{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>", "<|im_start|>", "[UNK]"]


def corpus() -> list[str]:
    here = Path(__file__).resolve().parent.parent / "data"
    texts = []
    for f in sorted(here.glob("chat_*")):
        texts.append(f.read_text(encoding="utf-8"))
    return texts


def main() -> None:
    out = Path(sys.argv[1])
    template = CHATML if sys.argv[2:] == ["chatml"] else KIMI
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))  # noqa: S106  (a token, not a password)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    special = {"unk_token": "[UNK]", "eos_token": "<|im_end|>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.chat_template = template
    fast.save_pretrained(str(out))
    print(json.dumps({"vocab": tok.get_vocab_size(), "files": sorted(p.name for p in out.iterdir())}))


if __name__ == "__main__":
    main()
