"""LLaMA-Factory training/resume control, run inside an lf-standard or lf-kt venv by verify_install.

    python lf_control.py WORK [--kt] [--refusals]

A tiny randomly initialised Qwen3-MoE (from a config: no hub download) with a ChatML tokenizer built
here (the `tokenizers` library) is fine-tuned with LoRA by LlamaFactory itself (`run_exp`, as
`llamafactory-cli train` runs it): 4 steps, a checkpoint every 2. A second run resumes from the
step-2 checkpoint in a fresh output directory; its step-4 adapter (PEFT's, and with --kt the
expert LoRA), optimizer and scheduler must be bit-identical to the uninterrupted run's. A callback
counts the MoE blocks whose experts run through kt_kernel.sft: with --kt every block, else none.

--refusals then checks, in the same process after the control, what the profile must refuse: in
lf-kt (with --kt), packing with use_kt and a model off the CPU; in lf-standard, use_kt itself
(upstream's error, which names what to install). One process saves a LlamaFactory start (13 s here).
The JSON result is the last line of output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = "the a cat dog sat on mat ran to park why how what is are you I we they blue red fast slow yes no".split()  # noqa: SIM905
EOS, PAD = "<|im_end|>", "<|endoftext|>"  # ChatML's end of turn; padding and unknown words
STEPS, SAVE = 4, 2
BLOCKS = 2  # num_hidden_layers of the tiny model: every layer is a MoE block


def make_model(root: Path) -> Path:
    """The tiny model and tokenizer directory (same bytes every call)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = root / "model"
    if (out / "config.json").exists():
        return out
    special = [PAD, "<|im_start|>", EOS]
    tok = Tokenizer(models.WordLevel(unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(
        [" ".join([*WORDS, "user", "assistant", "system"])] * 4, trainers.WordLevelTrainer(special_tokens=special)
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=PAD)
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=BLOCKS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    Qwen3MoeForCausalLM(cfg).save_pretrained(out)
    return out


def make_data(root: Path) -> Path:
    """A 32-example ShareGPT dataset and its dataset_info.json."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(32):
        q = " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(4 + i % 5))
        a = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 4))
        rows.append({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]})
    (data / "tiny.json").write_text(json.dumps(rows))
    info = {"tiny": {"file_name": "tiny.json", "formatting": "sharegpt", "columns": {"messages": "conversations"}}}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return data


def arguments(root: Path, out: Path, kt: bool) -> dict[str, Any]:
    """The LlamaFactory training arguments (what a YAML config would hold)."""
    args: dict[str, Any] = {
        "stage": "sft",
        "do_train": True,
        "model_name_or_path": str(make_model(root)),
        "dataset": "tiny",
        "dataset_dir": str(make_data(root)),
        "template": "qwen",
        "cutoff_len": 48,
        "finetuning_type": "lora",
        "lora_target": "q_proj,v_proj",
        "lora_rank": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.1,
        "output_dir": str(out),
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "learning_rate": 5e-3,
        "lr_scheduler_type": "linear",
        "max_steps": STEPS,
        "save_steps": SAVE,
        "logging_steps": 1,
        "seed": 0,
        "report_to": "none",
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "overwrite_cache": True,
    }
    if kt:
        args.update({"use_kt": True, "kt_backend": "kt", "kt_num_threads": 2})
    return args


def tensors(path: Path) -> dict[str, str]:
    """name -> sha256 of every tensor in a safetensors file or a torch pickle (optimizer, scheduler)."""
    import torch

    flat: dict[str, Any]
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        flat = dict(load_file(str(path)))
    else:
        flat = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, torch.Tensor):
                flat[prefix] = obj
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}", v)
            elif isinstance(obj, list | tuple):
                for i, v in enumerate(obj):
                    walk(f"{prefix}.{i}", v)
            else:  # step counts, learning rates, betas: compared by their repr
                flat[prefix] = repr(obj)

        walk("", torch.load(path, map_location="cpu", weights_only=False))
    return {k: _digest(v) for k, v in flat.items()}


def _digest(value: Any) -> str:
    if isinstance(value, str):
        return hashlib.sha256(value.encode()).hexdigest()
    return hashlib.sha256(value.detach().contiguous().view(-1).view(torch_uint8()).numpy().tobytes()).hexdigest()


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def train(root: Path, out: Path, kt: bool, resume: Path | None = None) -> dict[str, Any]:
    """One LlamaFactory run; the number of kt_kernel.sft blocks its model had, and its losses."""
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    seen: dict[str, Any] = {}

    class Count(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            mods = list(kw["model"].modules())
            seen["kt_blocks"] = sum(type(m).__module__.startswith("kt_kernel.") and hasattr(m, "lora") for m in mods)

    args = arguments(root, out, kt)
    if resume is not None:
        args["resume_from_checkpoint"] = str(resume)
    run_exp(args, callbacks=[Count()])
    log = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]
    seen["losses"] = [round(e["loss"], 6) for e in log if "loss" in e]
    return seen


def compare(a: Path, b: Path, kt: bool) -> list[str]:
    """Files of two step-STEPS checkpoints that differ, tensor by tensor."""
    names = ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt"]
    if kt:
        names.append("kt_expert_adapter.safetensors")
    diffs = []
    for name in names:
        fa, fb = a / name, b / name
        if not fa.exists() or not fb.exists():
            diffs.append(f"{name}: missing in {'the uninterrupted run' if not fa.exists() else 'the resumed run'}")
            continue
        ta, tb = tensors(fa), tensors(fb)
        bad = sorted(k for k in ta.keys() | tb.keys() if ta.get(k) != tb.get(k))
        if bad:
            diffs.append(f"{name}: {len(bad)} of {len(ta)} tensors differ, first {bad[0]}")
    return diffs


def refusals(root: Path, kt: bool) -> dict[str, str]:
    """The options this profile must refuse, and the message each got ("" when accepted)."""
    from llamafactory.hparams import get_train_args

    cases = {"packing_with_kt": {"use_kt": True, "packing": True}} if kt else {"use_kt": {"use_kt": True}}
    out = {}
    for name, extra in cases.items():
        args = arguments(root, root / f"refused-{name}", kt=False) | extra
        try:
            get_train_args(args)
            out[name] = ""
        except Exception as exc:  # the message is what is checked
            out[name] = f"{type(exc).__name__}: {exc}"
    if kt:  # a model LlamaFactory placed off the CPU (a GPU host without use_cpu; here the meta device)
        from llamafactory.model.adapter import _setup_kt_experts
        from transformers import AutoModelForCausalLM

        model_args, _, _, finetuning_args, _ = get_train_args(arguments(root, root / "refused-device", kt=True))
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path).to("meta")
        try:
            _setup_kt_experts(model, model_args, finetuning_args, None)
            out["model_off_cpu"] = ""
        except ValueError as exc:
            out["model_off_cpu"] = f"ValueError: {exc}"
    return out


def main() -> int:
    """Run the control; the JSON result is the last output line."""
    p = argparse.ArgumentParser()
    p.add_argument("work", type=Path)
    p.add_argument("--kt", action="store_true", help="use_kt: true (the lf-kt profile)")
    p.add_argument("--refusals", action="store_true", help="after the control, check the refused options")
    args = p.parse_args()
    root = args.work
    root.mkdir(parents=True, exist_ok=True)
    tag = "kt" if args.kt else "plain"
    full, resumed = root / f"{tag}-full", root / f"{tag}-resumed"
    for d in (full, resumed):
        shutil.rmtree(d, ignore_errors=True)
    first = train(root, full, args.kt)
    resumed.mkdir()
    shutil.copytree(full / f"checkpoint-{SAVE}", resumed / f"checkpoint-{SAVE}")
    second = train(root, resumed, args.kt, resume=resumed / f"checkpoint-{SAVE}")
    result = {
        "kt": args.kt,
        "kt_blocks": first["kt_blocks"],
        "blocks": BLOCKS,
        "losses": first["losses"],
        "resumed_losses": second["losses"],
        "resume_diffs": compare(full / f"checkpoint-{STEPS}", resumed / f"checkpoint-{STEPS}", args.kt),
        "expert_adapter_saved": (full / "kt_expert_adapter.safetensors").exists(),
    }
    if args.refusals:  # after the control, so nothing it sets up can touch the training compared above
        result["refused"] = refusals(root, args.kt)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
