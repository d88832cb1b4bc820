import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
w = torch.randn(1536, 576)
for M in (1, 32, 1024):
    x = torch.randn(M, 576)
    for name, fn in [("f32", lambda: F.linear(x, w)),
                     ("bf16", lambda: F.linear(x.bfloat16(), w.bfloat16())),
                     ("bf16 w pre", (lambda wb, xb: (lambda: F.linear(xb, wb)))(w.bfloat16(), x.bfloat16())),
                     ("bf16->f32", (lambda wb, xb: (lambda: F.linear(xb.float(), wb.float())))(w.bfloat16(), x.bfloat16()))]:
        fn()
        t = time.perf_counter(); n = 20
        for _ in range(n): fn()
        print(M, name, round((time.perf_counter() - t) / n * 1e3, 3), "ms")
