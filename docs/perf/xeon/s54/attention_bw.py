"""Probe: the attention kernels (kernels.scores, kernels.mix) over one layer's cached stretch of
3 heads x S slots x 64 (SmolLM2-135M's decode shapes), read from DRAM (enough copies read in
turn to pass the caches), against the reduction the compiled step used before (eager here).

    PYTHONPATH=. python docs/perf/xeon/s54/attention_bw.py [float32|bfloat16]
"""
import sys
import time

import torch

import kernels


def main(dtype: torch.dtype) -> None:
    torch.set_num_threads(2)
    assert kernels.available()
    for S in (1024, 4096):
        nbytes = 3 * S * 64 * dtype.itemsize
        ks = [torch.randn(1, 3, S, 64).to(dtype) for _ in range(max(4, int(400e6 / nbytes)))]
        q = torch.randn(1, 3, 3, 64).to(dtype)
        p = torch.softmax(torch.randn(1, 3, 3, S), -1)
        for name, f in (("scores", lambda k: kernels.scores(q, k)),
                        ("mix", lambda k: kernels.mix(p, k)),
                        ("eager reduction scores",
                         lambda k: (q.float().unsqueeze(-2) * k.unsqueeze(-3).float()).sum(-1))):
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                for k in ks:
                    f(k)
                best = min(best, (time.perf_counter() - t) / len(ks))
            print(f"{dtype} S={S} {name}: {best * 1e6:.1f} µs, {nbytes / best / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main(getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16"))
