"""Probe (PERFORMANCE 6zg): resident memory and page faults of steps that make two big
temporaries of mixed sizes, with glibc's defaults or with mallopt settings:

    python docs/perf/xeon/s57/malloc_probe.py STEPS [-3=1073741824 -1=1073741824]
"""
import resource, sys, ctypes, torch, os
libc = ctypes.CDLL("libc.so.6")
for kv in sys.argv[2:]:
    k, v = map(int, kv.split("="))
    libc.mallopt(k, v)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
n = int(sys.argv[1])
sizes = [40, 38, 41, 20, 50]
for i in range(n):
    a = torch.empty(sizes[i % 5] * 2**20 // 4).fill_(1)
    b = torch.empty(sizes[(i + 2) % 5] * 2**20 // 4).fill_(1)
    del a, b
    if i in (4, n - 1): print(i, round(rss()), resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
