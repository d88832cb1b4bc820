import torch, time
torch.set_num_threads(2)
for S in (288, 1024):
    p = torch.rand(1, 3, 96, S); v = torch.randn(1, 3, S, 64, dtype=torch.bfloat16); q=torch.randn(1,3,96,64, dtype=torch.bfloat16)
    for name, fn in [("mix bf16", lambda: (p.to(v.dtype) @ v).float()), ("mix f32", lambda: p @ v.float()),
                     ("scores f32", lambda: q.float() @ v.float().transpose(-1,-2))]:
        fn(); t = time.perf_counter()
        for _ in range(50): fn()
        print(S, name, round((time.perf_counter() - t) / 50 * 1e6), "us")
