"""The engine's own CPU kernels for a compiled decode step (kernels/decode.cpp).

    gemv(x, w)       # x @ w.T for x of 1 or 2 rows: float32 or bfloat16, w plain [N, K]
    scores(q, k)     # q @ k^T in float32: a few query rows [B, H, M, D] over cached keys
    mix(p, v)        # p @ v in float32: attention's weights [B, H, M, S] over cached values
    attend(q, k, v, mask, scale)  # softmax(q . k * scale, masked) @ v and its log-sum-exp
    attend_over(q, stretches, mask, scale)  # the same over a view's stretches, one call
    widen8(words, scale, dtype)   # an INT8 stretch as values (a prompt chunk's fused attention)
    available()      # whether this machine built and runs them (built once, then cached)

A compiled CPU decode step reads each weight once for one row. oneDNN's inner product pays a
fixed ~16 µs a call before it reads a byte and streams short rows at 14-20 GB/s; Inductor's
reduction over a plain weight reads bfloat16 at ~20 GB/s. The GEMV streams a band of rows a
thread with software prefetch, at 23-29 GB/s on machine C. Decode attention through Inductor's
reductions reads each key once per query row and sums across vector lanes for every score; the
attention kernels read each key and value once for the head's query rows.

They are C++ built by torch's extension loader on first use (~10-20 s, once per machine and
source: torch caches the library), with the C++ compiler that Inductor needs anyway. Where they
cannot be built, or the CPU has neither AVX2 nor AVX-512 BF16 (`KERNEL` is None), compiled steps
keep Inductor's reductions. The ops' schemas live here, so graphs can name them before a build.
"""
from __future__ import annotations

import hashlib
import os
import platform
import warnings

import torch
from torch import Tensor

_LIB = torch.library.Library("regionkv", "FRAGMENT")
_LIB.define("gemv(Tensor x, Tensor w, int isa) -> Tensor")
_LIB.define("scores(Tensor q, Tensor k, int isa) -> Tensor")
_LIB.define("mix(Tensor p, Tensor v, int isa) -> Tensor")
_LIB.define("scores8(Tensor q, Tensor words, Tensor scale, int isa) -> Tensor")
_LIB.define("mix8(Tensor p, Tensor words, Tensor scale, int isa) -> Tensor")
_LIB.define("attend(Tensor q, Tensor[] k, Tensor[] v, Tensor?[] k_scale, Tensor?[] v_scale, "
            "Tensor mask, float scale, int isa) -> (Tensor, Tensor)")
torch.library.register_fake(
    "regionkv::attend", lambda q, k, v, k_scale, v_scale, mask, scale, isa: (
        q.new_empty(q.shape, dtype=torch.float32), q.new_empty(q.shape[:-1],
                                                                dtype=torch.float32)), lib=_LIB)
_LIB.define("widen8(Tensor words, Tensor scale, ScalarType dtype, int isa) -> Tensor")
torch.library.register_fake(
    "regionkv::widen8", lambda words, scale, dtype, isa: words.new_empty(
        *words.shape[:-1], 4 * words.shape[-1], dtype=dtype), lib=_LIB)
torch.library.register_fake(
    "regionkv::gemv", lambda x, w, isa: x.new_empty(*x.shape[:-1], w.shape[0]), lib=_LIB)
torch.library.register_fake(
    "regionkv::scores", lambda q, k, isa: q.new_empty(*q.shape[:-1], k.shape[-2],
                                                      dtype=torch.float32), lib=_LIB)
torch.library.register_fake(
    "regionkv::mix", lambda p, v, isa: p.new_empty(*p.shape[:-1], v.shape[-1]), lib=_LIB)
torch.library.register_fake(
    "regionkv::scores8", lambda q, words, scale, isa: q.new_empty(
        *q.shape[:-1], words.shape[-2], dtype=torch.float32), lib=_LIB)
torch.library.register_fake(
    "regionkv::mix8", lambda p, words, scale, isa: p.new_empty(
        *p.shape[:-1], 4 * words.shape[-1]), lib=_LIB)

PORTABLE, AVX2, AVX512_BF16 = 0, 1, 2  # the kernels of decode.cpp
# Which parts of a compiled step call them (False keeps Inductor's reductions: probes, A/B).
LINEARS = True
ATTENTION = True
# Whether attention without probabilities takes `attend` (scores, softmax and mix in one call)
# over the stretches ATTENTION serves; False: scores and mix apart, the softmax Inductor's.
FUSED = True
# Attention takes the kernels over stretches (attend: views) of at least this many slots: below,
# a call's fixed cost (~10 µs) outweighs the faster reads, and Inductor's reductions, fused into
# the block's loops, are as fast (a 256-slot budget: 12.61 against 12.75 ms a step, with an INT8
# middle 13.97 against 14.76).
ATTEND_SLOTS = 512


def best_kernel() -> int | None:
    """The fastest kernels of decode.cpp for this CPU as ATen sees it (ATEN_CPU_CAPABILITY=avx2
    acts an AVX2-only machine), or None: the portable ones are for tests, slower than Inductor.
    REGIONKV_KERNELS=0 turns them off (Inductor's reductions, as where they do not build)."""
    if os.environ.get("REGIONKV_KERNELS", "1") == "0" or \
            platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512" and torch.cpu._is_avx512_bf16_supported():
        return AVX512_BF16
    return AVX2 if capability in ("AVX2", "AVX512") else None


KERNEL = best_kernel()
_built: bool | None = None


def available() -> bool:
    """Build (or load the cached build of) decode.cpp once; False, with one warning, if not.
    The engine calls it before it compiles (engine.runtime.generation); a trace that meets it first
    cannot build, and reads reductions (dynamo guards on the outcome: a later build retraces)."""
    global _built
    if _built is None:
        if torch.compiler.is_compiling():
            return False
        _built = KERNEL is not None and _build()
    return _built


def _build() -> bool:
    from torch.utils.cpp_extension import load
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(here, "decode.cpp")
    # torch's loader rebuilds when a source or a flag changes, not a header: the header's
    # digest goes into the flags.
    with open(os.path.join(here, "attention.h"), "rb") as f:
        header = hashlib.sha1(f.read()).hexdigest()[:16]
    clear_stale_lock("regionkv_decode")
    try:
        load("regionkv_decode", [source], extra_cflags=["-O3", "-fopenmp",
                                                        f"-DREGIONKV_HEADER={header}"],
             extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        return True
    except Exception as e:  # no compiler or ninja: the reductions serve, slower
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(": [")[0][:160]
        warnings.warn(f"regionkv: the decode kernels did not build ({first}); compiled steps "
                      f"read their weights and caches as reductions instead, slower (a C++ "
                      f"compiler and `pip install ninja` build them)", stacklevel=2)
        return False


STALE_LOCK_S = 600  # a build takes 10-20 s; a lock this old was left by a process that died


def clear_stale_lock(name: str) -> None:
    """torch's extension loader marks a build in progress with a `lock` file, which a process
    killed mid-build (Ctrl-C during the first compile) leaves behind: every later process
    then waits on it forever. A lock older than any build is removed, with a warning."""
    import time
    from torch.utils.cpp_extension import _get_build_directory
    try:
        lock = os.path.join(_get_build_directory(name, verbose=False), "lock")
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return
    if age > STALE_LOCK_S:
        warnings.warn(f"regionkv: removing a stale build lock {lock} ({age / 60:.0f} minutes "
                      f"old, left by a build that did not finish)", stacklevel=2)
        try:
            os.remove(lock)
        except OSError:
            pass


def serve_linears() -> bool:
    """Whether compiled few-row steps stream their linears through gemv."""
    return LINEARS and available()


def serve_attention(kv: Tensor, slots: int | None = None) -> bool:
    """Whether a compiled few-row CPU step attends over this cached stretch with scores/mix
    (K or V in float32 or bfloat16), or scores8/mix8 (INT8 words: 32-bit, quantize/kv.py), or
    with attend over a view of `slots` slots in all, this stretch one of them: a stretch (or
    view) of at least ATTEND_SLOTS slots."""
    return ATTENTION and kv.device.type == "cpu" and kv.stride(-1) == 1 and \
        (kv.shape[-2] if slots is None else slots) >= ATTEND_SLOTS and \
        kv.dtype in (torch.float32, torch.bfloat16, torch.int32) and available()


def serve_widen(words: Tensor) -> bool:
    """Whether a compiled CPU step widens this INT8 stretch with widen8 (Inductor's loop reads
    float words through the stack where its output is bfloat16, and splits by head only)."""
    return words.device.type == "cpu" and words.stride(-1) == 1 and available()


GEMV_ROWS = 8


def gemv(x: Tensor, w: Tensor, kernel: int | None = None) -> Tensor:
    """x @ w.T in x's dtype (float32 sums), x of 1 to GEMV_ROWS rows, the weight read once for
    all of them; available() must be True."""
    return torch.ops.regionkv.gemv(x, w, KERNEL if kernel is None else kernel)


def scores(q: Tensor, k: Tensor, kernel: int | None = None) -> Tensor:
    """q [B, H, M, D] . k [B, H, S, D] -> [B, H, M, S] float32 (q in k's dtype)."""
    return torch.ops.regionkv.scores(q, k, KERNEL if kernel is None else kernel)


def mix(p: Tensor, v: Tensor, kernel: int | None = None) -> Tensor:
    """p [B, H, M, S] float32 @ v [B, H, S, D] -> [B, H, M, D] float32."""
    return torch.ops.regionkv.mix(p, v, KERNEL if kernel is None else kernel)


def scores8(q: Tensor, words: Tensor, scale: Tensor, kernel: int | None = None) -> Tensor:
    """q [B, H, M, D] . the INT8 keys (words [B, H, S, D/4], scale [B, H, S, 1]) -> [B, H, M, S]
    float32: q . (scale * codes), each slot's scale applied once to its sum."""
    return torch.ops.regionkv.scores8(q, words, bits(scale), KERNEL if kernel is None else kernel)


def mix8(p: Tensor, words: Tensor, scale: Tensor, kernel: int | None = None) -> Tensor:
    """p [B, H, M, S] float32 @ the INT8 values (words, scale as in scores8) -> [B, H, M, D]."""
    return torch.ops.regionkv.mix8(p, words, bits(scale), KERNEL if kernel is None else kernel)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float,
           k_scale: Tensor | None = None, v_scale: Tensor | None = None,
           kernel: int | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q . k * scale where mask, else -inf) @ v in one call, q [B, H, M, D] over one
    stretch k, v [B, H, S, D] (float32 or bfloat16; INT8 words with k_scale / v_scale as in
    scores8), mask bool [B|1, H|1, T, S] (row m of q reads mask row m % T) -> y [B, H, M, D]
    float32 and lse [B, H, M], the log of each row's sum of exp(scaled score) (-inf where the
    mask holds nowhere; y 0 there)."""
    return attend_over(q, [(k, v, k_scale, v_scale)], mask, scale, kernel)


def attend_over(q: Tensor, stretches: list, mask: Tensor, scale: float,
                kernel: int | None = None) -> tuple[Tensor, Tensor]:
    """attend over several stretches as one: stretches a list of (k, v, k_scale, v_scale), each
    as in attend (float, or INT8 with its scales), mask over their S slots in all, in order."""
    k, v, k_scale, v_scale = (list(x) for x in zip(*stretches))
    return torch.ops.regionkv.attend(q, k, v, [bits(s) for s in k_scale],
                                     [bits(s) for s in v_scale], mask, scale,
                                     KERNEL if kernel is None else kernel)


def widen8(words: Tensor, scale: Tensor, dtype: torch.dtype,
           kernel: int | None = None) -> Tensor:
    """An INT8 stretch (words [B, H, S, D/4], scale [B, H, S, 1] as in scores8) -> its values
    [B, H, S, D] in dtype (float32 or bfloat16): quantize.kv.widen, one call."""
    return torch.ops.regionkv.widen8(words, bits(scale), dtype,
                                     KERNEL if kernel is None else kernel)


def bits(scale: Tensor | None) -> Tensor | None:
    """An INT8 stretch's float32 scales as the kernels take them: their bits, int32. A cache's
    scale is the last word of its int32 row viewed as float32 (quantize/kv.py), and viewed back
    a compiled graph passes it as a view of that buffer alone; as float32 its wrapper makes a
    dtype view per stretch and step (~4 µs each: 0.24 ms a 30-layer step of `quantized`).
    Scales of another dtype pass as they are, for the op to refuse by name."""
    return scale if scale is None or scale.dtype != torch.float32 else scale.view(torch.int32)


# Switches: which path attention takes, read when a step is traced (caches/attention.py).
# A compiled CPU step of at most this many query rows per KV head (decode: one token's group of
# query heads) attends through reductions that Inductor fuses into the block's loops, instead
# of the fused SDPA kernel or a matmul: one pass over the keys and one over the values, split
# over the threads, with no per-call setup.
REDUCE_ROWS = 16
# Split-K decode attention (flash-decoding) for a decode step (one token a row) that would go
# to SDPA with a mask, by device type: the slots cut into chunks of this many, each with its
# own max, sum and weighted values, then combined. SDPA's kernels that take a mask split the
# work only by row, head and block of queries; on an H100 the split decodes Llama-3-8B's shapes
# at 74% of the bandwidth against SDPA's 67% at 1k, 69.5% against 47% at 4k
# The CPU's
# compiled step reads through reductions instead (REDUCE_ROWS). Read when a step is traced.
SPLIT_SLOTS = {"cuda": 256}
# A CPU without oneDNN's bfloat16 kernels (AVX2 only: no AVX-512 BF16 or AVX-NE-CONVERT) runs a
# bfloat16 matmul through ATen's fallback, 20-35x slower than float32 for attention's shapes
# there the explicit softmax reads its values in float32.
CPU_BF16_MATMUL = torch.backends.mkldnn.is_available() and \
    torch.ops.mkldnn._is_mkldnn_bf16_supported()


def reduces(q: Tensor, int8: bool) -> bool:
    """Whether attention reads a stretch as a reduction (compiled only): few-row steps, on any
    device for int8 (no float32 copy of the codes), on the CPU otherwise. A prompt chunk's
    many rows read int8 through one copy a chunk (widened for SDPA, or the codes as floats for
    matmuls), where a reduction (or the decode kernels) would read and widen every code once
    per row, 384 of them in a 128-token chunk (a 4k prompt of `quantized`: 33 s)."""
    return torch.compiler.is_compiling() and q.shape[-2] <= REDUCE_ROWS and (
        int8 or q.device.type == "cpu")
