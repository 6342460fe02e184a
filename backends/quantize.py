"""A more aggressive quantization of a GGUF model, made here and cached, never downloaded.

The quantization lever is measured against a build of the same weights that is cheaper to run:
llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`, `allow_requantize` so an
already quantized GGUF such as the shipped SmolLM2-135M Q4_1 can be requantized) writes it in
about half a second. The result is cached under the user's cache folder
(`$XDG_CACHE_HOME/cost-router/quantized`, default `~/.cache/cost-router/quantized`), keyed by
the source file's SHA-256 and the target type, so a changed source makes a new file and reruns
reuse the old one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

from backends.launch import resolve_model_path

CACHE_ENV = "XDG_CACHE_HOME"
# The types worth measuring as "more aggressive than Q4": llama.cpp's names (llama_ftype).
TYPES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_0", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q8_0")


class QuantizeError(RuntimeError):
    """The quantizer could not run or failed; the message names the source and the type."""


def cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache")
    return Path(base) / "cost-router" / "quantized"


def file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def quantized(
    source: str | Path, qtype: str = "Q2_K", cache: Path | None = None, threads: int = 1
) -> Path:
    """The GGUF of `source` (a path or `package:PKG/FILE`) quantized to `qtype`, made on first
    use and cached (module docstring)."""
    if qtype not in TYPES:
        raise QuantizeError(f"quantization type {qtype!r}: expected one of {', '.join(TYPES)}")
    src = Path(resolve_model_path(str(source)))
    if not src.is_file():
        raise QuantizeError(f"{src}: no such model file")
    folder = cache or cache_dir()
    out = folder / f"{src.stem}.{file_digest(src)[:16]}.{qtype}.gguf"
    if out.is_file():
        return out
    try:
        # Optional heavy library (the `demo` extra): imported only when a file must be made.
        import llama_cpp
    except ImportError:
        raise QuantizeError(
            "llama-cpp-python is not installed (pip install 'cost-router[demo]')"
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    # A temporary name in the same folder, renamed when complete: a crash or a second process
    # never leaves a half-written file under the cached name.
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    params.allow_requantize = True
    params.nthread = threads
    code = llama_cpp.llama_model_quantize(
        str(src).encode(), str(tmp).encode(), ctypes.byref(params)
    )
    if code != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise QuantizeError(f"{src}: llama_model_quantize to {qtype} failed (code {code})")
    os.replace(tmp, out)
    return out
