# one-row linears over a stack of 60 distinct 1536x576 weights, compiled, GB/s
import time, torch, statistics
torch.set_num_threads(2)
N, K, L = 1536, 576, 60
def bench(fn, nbytes, reps=30):
    for _ in range(3): fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    m = statistics.median(ts)
    return f"{m*1e3:.2f} ms {nbytes/m/1e9:.1f} GB/s"
for dt in (torch.float32, torch.bfloat16):
    ws = [torch.randn(N, K).to(dt) for _ in range(L)]
    x = torch.randn(1, K).to(dt)
    nb = L * N * K * ws[0].element_size()
    def red(x, ws):
        return [(w.float() * x.float().unsqueeze(-2)).sum(-1).to(x.dtype) for w in ws]
    c = torch.compile(red, fullgraph=True)
    print(dt, "reduction compiled", bench(lambda: c(x, ws), nb))
    print(dt, "F.linear eager", bench(lambda: [torch.nn.functional.linear(x, w) for w in ws], nb))
    if dt == torch.bfloat16:
        def red2(x, ws):  # widen by bits
            xf = x.float().unsqueeze(-2)
            return [((w.view(torch.int16).to(torch.int32) << 16).view(torch.float32) * xf).sum(-1).to(x.dtype) for w in ws]
        c2 = torch.compile(red2, fullgraph=True)
        print(dt, "reduction bits compiled", bench(lambda: c2(x, ws), nb))
        def red3(x, ws):  # bf16 products, f32 sum
            return [(w * x.unsqueeze(-2)).float().sum(-1).to(x.dtype) for w in ws]
        c3 = torch.compile(red3, fullgraph=True)
        print(dt, "reduction bf16-mul compiled", bench(lambda: c3(x, ws), nb))
