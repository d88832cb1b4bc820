"""The attend op alone at a decode step's shapes: a step's 30 layers, each its own stretch of S
slots (so the step streams them from memory, as decode does), bfloat16 or float32 rows against
INT8 words, by kernel (1 AVX2, 2 AVX-512). Prints ms a step (median of rounds) and the GB/s of
the stretch bytes read.

    python docs/perf/machine-b/s69/attend_probe.py [S] [rounds]
"""
import os
import statistics
import sys
import time

import torch

import kernels
from core.memory import empty_on_huge_pages
from quantize import kv

HUGE = os.environ.get("HUGE", "0") == "1"  # the stretches in 2 MiB pages (core.memory)


def placed(*ts):
    """The tensors as they are, or copies in huge pages (HUGE=1)."""
    if not HUGE:
        return ts
    homes = empty_on_huge_pages([(t.shape, t.dtype) for t in ts])
    return tuple(h.copy_(t) for h, t in zip(homes, ts))

assert kernels.available()
S = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
LAYERS, H, M, D = 30, 3, 3, 64
torch.manual_seed(0)
mask = torch.ones(1, 1, 1, S, dtype=torch.bool)


def stretches(dtype):
    out = []
    for _ in range(LAYERS):
        k = torch.randn(1, H, S, D).to(dtype)
        v = torch.randn(1, H, S, D).to(dtype)
        out.append(placed(k, v))
    return out


def quantized():
    out = []
    for _ in range(LAYERS):
        # a slot's row as the cache stores it: D/4 words, then its scale (68 bytes at D 64)
        k, v = placed(kv.quantize_words(torch.randn(1, H, S, D)),
                      kv.quantize_words(torch.randn(1, H, S, D)))
        (k, ks), (v, vs) = kv.split_words(k), kv.split_words(v)
        out.append((k, v, ks, vs))
    return out


def step_ms(layers, q, kernel):
    t = time.perf_counter()
    for lay in layers:
        k, v = lay[0], lay[1]
        ks, vs = (lay[2], lay[3]) if len(lay) == 4 else (None, None)
        kernels.attend(q, k, v, mask, 0.125, ks, vs, kernel=kernel)
    return (time.perf_counter() - t) * 1e3


def bytes_of(layers):  # an INT8 row's words and scale: 4 (D/4 + 1) bytes
    return sum(t.numel() * t.element_size() for lay in layers for t in lay[:2]) * \
        (D // 4 + 1) / (D // 4 if len(layers[0]) == 4 else D // 4 + 1)


print(f"S={S}, huge pages {HUGE}, {LAYERS} layers, H={H}, M={M}, D={D}, threads {torch.get_num_threads()}, "
      f"kernel available {kernels.KERNEL}")
rows = []
for name, layers, qd in [("bfloat16", stretches(torch.bfloat16), torch.bfloat16),
                         ("float32", stretches(torch.float32), torch.float32),
                         ("int8", quantized(), torch.bfloat16)]:
    q = torch.randn(1, H, M, D).to(qd)
    for kernel in (1, 2):
        if kernel > kernels.KERNEL:
            continue
        for _ in range(3):
            step_ms(layers, q, kernel)
        ms = statistics.median(step_ms(layers, q, kernel) for _ in range(ROUNDS * 5))
        gb = bytes_of(layers) / ms / 1e6
        print(f"{name:9s} kernel {kernel}: {ms:7.3f} ms a step, {bytes_of(layers) / 1e6:6.1f} MB, "
              f"{gb:5.1f} GB/s", flush=True)
        # the loops apart: scores over the keys, mix over the values
        p = torch.softmax(torch.randn(1, H, M, S), -1)

        def part_ms(f):
            t = time.perf_counter()
            for lay in layers:
                f(*lay)
            return (time.perf_counter() - t) * 1e3
        parts = [("scores8", lambda k, v, ks, vs: kernels.scores8(q, k, ks, kernel)),
                 ("mix8", lambda k, v, ks, vs: kernels.mix8(p, v, vs, kernel))] \
            if name == "int8" else \
            [("scores", lambda k, v, *_: kernels.scores(q, k, kernel)),
             ("mix", lambda k, v, *_: kernels.mix(p, v, kernel))]
        for what, f in parts:
            for _ in range(3):
                part_ms(f)
            ms = statistics.median(part_ms(f) for _ in range(ROUNDS * 5))
            print(f"  {what} kernel {kernel}: {ms:7.3f} ms a step", flush=True)
