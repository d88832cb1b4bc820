"""Probe (PERFORMANCE 6zu): this stop's attend op against the last stop's, in turns in one
process: the kernel source as it was (`git show 0cd304f:kernels/decode.cpp`, its attention.h
unchanged) built as a second library, `regionkv_old`, and a step compiled against each (the
old op takes float32 scales: the wrapper's dtype views come back with it). `full` beside.

    git show 0cd304f:kernels/decode.cpp > /tmp/old_decode.cpp
    ROUNDS=10 PYTHONPATH=. python docs/perf/zen4/s71/ab_attend_old.py /tmp/old_decode.cpp DTYPE CTX [POLICY]
"""
import os, statistics, sys
import torch
from torch.utils.cpp_extension import load
sys.path.insert(0, "docs/perf/zen3/s46")
import kernels  # noqa: E402
from single_session import warm_session  # noqa: E402

src, dtype, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
policy = sys.argv[4] if len(sys.argv) > 4 else "quantized"
here = os.path.join(os.path.dirname(kernels.__file__))
text = open(src).read().replace("TORCH_LIBRARY_IMPL(regionkv,", "TORCH_LIBRARY_IMPL(regionkv_old,")
copy = "/tmp/regionkv_old/decode_old.cpp"
os.makedirs(os.path.dirname(copy), exist_ok=True)
with open(copy, "w") as f:
    f.write(text)
lib = torch.library.Library("regionkv_old", "DEF")
for name, schema in (("gemv", "gemv(Tensor x, Tensor w, int isa) -> Tensor"),
                     ("scores", "scores(Tensor q, Tensor k, int isa) -> Tensor"),
                     ("mix", "mix(Tensor p, Tensor v, int isa) -> Tensor"),
                     ("scores8", "scores8(Tensor q, Tensor words, Tensor scale, int isa) -> Tensor"),
                     ("mix8", "mix8(Tensor p, Tensor words, Tensor scale, int isa) -> Tensor"),
                     ("widen8", "widen8(Tensor words, Tensor scale, ScalarType dtype, int isa) -> Tensor")):
    lib.define(schema)
lib.define("attend(Tensor q, Tensor[] k, Tensor[] v, Tensor?[] k_scale, Tensor?[] v_scale, "
           "Tensor mask, float scale, int isa) -> (Tensor, Tensor)")
torch.library.register_fake(
    "regionkv_old::attend", lambda q, k, v, k_scale, v_scale, mask, scale, isa: (
        q.new_empty(q.shape, dtype=torch.float32), q.new_empty(q.shape[:-1], dtype=torch.float32)),
    lib=lib)
load("regionkv_old", [copy], extra_cflags=["-O3", "-fopenmp", f"-I{here}"],
     extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)

engine_over = kernels.attend_over
kernels.PROBE_OLD = False


def attend_over(q, stretches, mask, scale, kernel=None):
    if not kernels.PROBE_OLD:
        return engine_over(q, stretches, mask, scale, kernel)
    k, v, ks, vs = (list(x) for x in zip(*stretches))
    return torch.ops.regionkv_old.attend(q, k, v, ks, vs, mask, scale,
                                         kernels.KERNEL if kernel is None else kernel)


kernels.attend_over = attend_over
rounds = int(os.environ.get("ROUNDS", "8"))
full = warm_session("full", dtype, ctx, rounds * 4 * 24 + 50)
q = warm_session(policy, dtype, ctx, rounds * 4 * 24 + 50)
kernels.PROBE_OLD = True
q.generate(4)  # compiles the variants
full.generate(4)
res = {}
for r in range(rounds):
    order = [("full", False), ("q", True), ("full", True), ("q", False)]
    for name, old in (order if r % 2 == 0 else order[::-1]):
        kernels.PROBE_OLD = old
        g = (full if name == "full" else q).generate(24)
        res.setdefault((name, old), []).append(1000 * g.decode_s / (g.new_tokens - 1))
f = statistics.median(res[("full", False)])
for key, xs in sorted(res.items()):
    m = statistics.median(xs)
    label = f"{'full' if key[0] == 'full' else policy} {'before' if key[1] else 'now'}"
    print(f"{label:17s} {dtype} {ctx}: {m:6.2f} ms a step, full now/it {f / m:.3f}  "
          f"{[round(x, 2) for x in xs]}")
