"""Tensors the engine hands to kernels start on a 64-byte boundary.

Some CPU kernels assume it: on AVX-512 machines `aten._weight_int8pack_mm` reads a weight that
starts off a 64-byte line with aligned vector loads and dies with a segmentation fault once the
input has about 16 rows, while AVX2 machines run the same call fine. A safetensors file holds its
tensors back to back at 8-byte alignment, so tensors read from one are views at any offset.
Every loader goes through `read_safetensors`, which returns tensors that own aligned storage.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

# The dtypes a model runs in, by the names the command-line tools and configs use.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

from core.errors import UserError

ALIGNMENT = 64  # bytes: one cache line, the widest vector load (AVX-512)


def is_aligned(t: Tensor) -> bool:
    return t.numel() == 0 or t.data_ptr() % ALIGNMENT == 0


def aligned(t: Tensor) -> Tensor:
    """`t` itself when it starts on the boundary and owns its storage, else a contiguous
    copy that does (so a view never keeps a whole file's buffer alive, either)."""
    if t.numel() == 0 or (is_aligned(t) and t.is_contiguous()
                          and t.untyped_storage().nbytes() == t.nbytes):
        return t
    out = t.clone(memory_format=torch.contiguous_format)
    if not is_aligned(out):  # an allocator with a smaller guarantee: over-allocate and offset
        raw = torch.empty(t.nbytes + ALIGNMENT, dtype=torch.uint8, device=t.device)
        skip = -raw.data_ptr() % ALIGNMENT
        out = raw[skip:skip + t.nbytes].view(t.dtype).view(t.shape)
        out.copy_(t)
    return out


def read_safetensors(path) -> dict[str, Tensor]:
    """All tensors of a safetensors file, on the CPU, each aligned and owning its storage.

    Raises:
        UserError: the file is missing, truncated or not a safetensors file.
    """
    from safetensors.torch import load_file

    path = Path(path)
    try:
        state = load_file(str(path), device="cpu")
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise UserError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                        f" (a damaged or truncated file? write it again)") from None
    return {k: aligned(t) for k, t in state.items()}


def misaligned(module: torch.nn.Module) -> list[str]:
    """Names of the module's parameters and buffers that do not start on the boundary. Only
    strided tensors count: oneDNN's packed weights (an opaque layout, on CPUs with its bfloat16
    kernel) have no data pointer, and oneDNN aligns the memory it allocates for them itself."""
    named = list(module.named_parameters()) + list(module.named_buffers())
    return [n for n, t in named
            if t is not None and t.layout == torch.strided and not is_aligned(t)]
