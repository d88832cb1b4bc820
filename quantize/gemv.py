"""A decode step's linears as the engine's own matrix-vector kernel (quantize/gemv.cpp).

    gemv(x, w)     # x @ w.T for x of 1 or 2 rows: float32 or bfloat16, w plain [N, K]
    available()    # whether this machine built and runs it (built once, then cached)

A compiled CPU decode step reads each weight once for one row. oneDNN's inner product pays a
fixed ~16 µs a call before it reads a byte and streams short rows at 14-20 GB/s; Inductor's
reduction over a plain weight reads bfloat16 at ~20 GB/s. This kernel streams a band of rows a
thread with software prefetch, at 23-29 GB/s on machine C (docs/PERFORMANCE.md, section 6zd).

It is C++ built by torch's extension loader on first use (~20 s, once per machine and source:
torch caches the library), with the C++ compiler that Inductor needs anyway. Where it cannot be
built or the CPU has neither AVX2 nor AVX-512 BF16 (`KERNEL` is None), compiled steps keep
Inductor's reductions. The op's schema lives here, so compiled graphs can name it before it is
built.
"""
from __future__ import annotations

import os
import platform
import sys
import warnings

import torch
from torch import Tensor

_LIB = torch.library.Library("regionkv", "FRAGMENT")
_LIB.define("gemv(Tensor x, Tensor w, int isa) -> Tensor")
torch.library.register_fake(
    "regionkv::gemv", lambda x, w, isa: x.new_empty(*x.shape[:-1], w.shape[0]), lib=_LIB)

PORTABLE, AVX2, AVX512_BF16 = 0, 1, 2  # the kernels of gemv.cpp


def best_kernel() -> int | None:
    """The fastest kernel of gemv.cpp for this CPU as ATen sees it (ATEN_CPU_CAPABILITY=avx2
    acts an AVX2-only machine), or None: the portable one is for tests, slower than Inductor."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512" and torch.cpu._is_avx512_bf16_supported():
        return AVX512_BF16
    return AVX2 if capability in ("AVX2", "AVX512") else None


KERNEL = best_kernel()
_built: bool | None = None


def available() -> bool:
    """Build (or load the cached build of) gemv.cpp once; False, with one warning, if it fails."""
    global _built
    if _built is None:
        _built = KERNEL is not None and _build()
    return _built


def _build() -> bool:
    from torch.utils.cpp_extension import load
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv.cpp")
    try:
        load("regionkv_gemv", [source], extra_cflags=["-O3", "-fopenmp"],
             extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        return True
    except Exception as e:  # no compiler or ninja: the reductions serve, slower
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(f"regionkv: the decode GEMV kernel did not build ({first}); compiled "
                      f"steps read their weights as reductions instead", stacklevel=2)
        print(f"regionkv: gemv.cpp build failed: {e}", file=sys.stderr) if os.environ.get(
            "REGIONKV_VERBOSE") else None
        return False


def gemv(x: Tensor, w: Tensor, kernel: int | None = None) -> Tensor:
    """x @ w.T in x's dtype (float32 sums), x of 1 or 2 rows; available() must be True."""
    return torch.ops.regionkv.gemv(x, w, KERNEL if kernel is None else kernel)
