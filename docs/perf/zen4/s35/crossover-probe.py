import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
ws = [torch.randn(1536, 576).bfloat16() for _ in range(60)]
for M in (1, 2, 4, 8, 16, 32):
    x = torch.randn(M, 576).bfloat16()
    for name, fn in [("bf16", lambda w: F.linear(x, w)), ("widen", lambda w: F.linear(x.float(), w.float()).bfloat16())]:
        for w in ws: fn(w)
        t = time.perf_counter()
        for _ in range(3):
            for w in ws: fn(w)
        print(M, name, round((time.perf_counter() - t) / 180 * 1e3, 3), "ms")
