"""Write a fine-tuned model as a GGUF that llama.cpp serves, with the `gguf` package.

The student keeps its base's architecture and tokenizer, so the base GGUF already holds
everything but the weights: its metadata (hyperparameters, tokenizer, chat template) is copied
as is and each of its tensors is replaced by the trained one, named by gguf's own HF-to-GGUF
name map. Two things llama.cpp's converter does are done here too: the attention query and key
rows of llama models are permuted back to llama.cpp's rotary layout (transformers' GGUF loader
undid that permutation when it read the base), and norms stay F32 while matrices are written
F16 (or F32). A model whose architecture gguf's map does not know is refused, never written
half right.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

# Architectures whose HF q/k rows transformers un-permuted on load (and llama.cpp expects
# permuted): the llama family, as in llama.cpp's convert_hf_to_gguf.py LlamaModel.
PERMUTED_QK = frozenset({"llama"})
SKIP_FIELDS = ("general.architecture", "general.file_type", "GGUF.")
FILE_TYPES = {"F32": 0, "F16": 1}  # llama_ftype ALL_F32, MOSTLY_F16


class GgufWriteError(RuntimeError):
    """The model cannot be written as a GGUF of its base's layout; the message says why."""


def _permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def architecture(path: Path, reader: Any = None) -> str:
    """The `general.architecture` of a GGUF file (read with `reader` if one is open)."""
    import gguf

    reader = reader or gguf.GGUFReader(str(path))
    field = reader.get_field("general.architecture")
    if field is None:
        raise GgufWriteError(f"{path}: no general.architecture in its metadata")
    return str(field.contents())


def write_like(
    base_gguf: Path,
    state: Mapping[str, Any],
    config: Any,
    out: Path,
    dtype: str = "F16",
    name: str | None = None,
) -> Path:
    """Write `state` (an HF state dict of torch tensors, merged: no LoRA) as a GGUF laid out as
    `base_gguf`, to `out` (renamed into place when complete)."""
    import gguf

    if dtype not in FILE_TYPES:
        raise GgufWriteError(f"dtype {dtype!r}: expected one of {', '.join(FILE_TYPES)}")
    reader = gguf.GGUFReader(str(base_gguf))
    arch = architecture(base_gguf, reader)
    arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_id is None:
        raise GgufWriteError(f"{base_gguf}: architecture {arch!r} is unknown to gguf")
    n_layers = int(config.num_hidden_layers)
    names = gguf.get_tensor_name_map(arch_id, n_layers)
    mapped: dict[str, tuple[str, Any]] = {}
    for hf_name, tensor in state.items():
        gg = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg is not None:
            mapped[gg] = (hf_name, tensor)
    missing = [t.name for t in reader.tensors if t.name not in mapped]
    if missing:
        raise GgufWriteError(
            f"{base_gguf}: no trained tensor for {len(missing)} of its tensors "
            f"({', '.join(missing[:3])}, ...): architecture {arch!r} maps differently"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for field in reader.fields.values():
        if field.name.startswith(SKIP_FIELDS):
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "general.name" and name:
            value = name
        writer.add_key_value(field.name, value, val_type, sub_type=sub_type)
    writer.add_file_type(FILE_TYPES[dtype])
    n_head = int(config.num_attention_heads)
    n_kv = getattr(config, "num_key_value_heads", None)
    for t in reader.tensors:
        hf_name, tensor = mapped[t.name]
        data = tensor.detach().to("cpu").float().numpy()
        if arch in PERMUTED_QK and hf_name.endswith("q_proj.weight"):
            data = _permute(data, n_head, n_head)
        elif arch in PERMUTED_QK and hf_name.endswith("k_proj.weight"):
            data = _permute(data, n_head, n_kv)
        if data.ndim == 1 or dtype == "F32":
            data = data.astype(np.float32)
        else:
            data = data.astype(np.float16)
        writer.add_tensor(t.name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out
