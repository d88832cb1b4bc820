"""The default model's four block linears (wqkv 960x576, wo 576x576, w1+w3 3072x576, w2
576x1536) as F.linear at M rows: the time a block's linears take per prompt row (PERFORMANCE 6o)."""
import torch, time
torch.set_num_threads(2)
shapes=[(960,576),(576,576),(3072,576),(576,1536)]
for dt in (torch.float32,):
  for M in (1,16,32,64,128,256,512):
    tot=0; fl=0
    for (o,i) in shapes:
        w=torch.randn(o,i,dtype=dt); x=torch.randn(M,i,dtype=dt)
        f=torch.nn.functional.linear
        for _ in range(3): f(x,w)
        n=max(5,int(2000/M))
        t=time.perf_counter()
        for _ in range(n): f(x,w)
        dt_=(time.perf_counter()-t)/n
        tot+=dt_; fl+=2*M*o*i
    print(dt, M, f"{tot*1e3:.3f} ms/block-of-linears  {fl/tot/1e9:.1f} GFLOP/s  per-row {tot/M*1e6:.1f} us")
