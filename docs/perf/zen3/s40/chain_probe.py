# a chain of one-row linears (576->1536->576, 30 pairs), compiled as reductions: GB/s
import time, torch, statistics, sys
torch.set_num_threads(2)
L = 30
def bench(fn, nbytes, reps=40):
    for _ in range(3): fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    m = statistics.median(ts)
    return f"{m*1e3:.2f} ms {nbytes/m/1e9:.1f} GB/s"
for dt in (torch.float32, torch.bfloat16):
    ups = [torch.randn(1536, 576).to(dt) for _ in range(L)]
    downs = [torch.randn(576, 1536).to(dt) for _ in range(L)]
    x = torch.randn(1, 576).to(dt)
    nb = 2 * L * 1536 * 576 * ups[0].element_size()
    def lin(w, x):
        return (w.float() * x.float().unsqueeze(-2)).sum(-1).to(x.dtype)
    def chain(x, ups, downs):
        for u, d in zip(ups, downs):
            x = lin(d, torch.tanh(lin(u, x))) * 0.1
        return x
    c = torch.compile(chain, fullgraph=True)
    print(dt, "chain", bench(lambda: c(x, ups, downs), nb), flush=True)
    def lin2(w, x):  # x widened once, stored (a reduction's output is a buffer)
        return (w.float() * x.unsqueeze(-2)).sum(-1)
    def chain2(x, ups, downs):
        x = x.float()
        for u, d in zip(ups, downs):
            x = lin2(d, torch.tanh(lin2(u, x))) * 0.1
        return x
    c2 = torch.compile(chain2, fullgraph=True)
    print(dt, "chain f32 activations", bench(lambda: c2(x, ups, downs), nb), flush=True)
