"""Memory is checked before it is taken: an allocation that cannot fit is a one-line error that
gives the estimate and what the machine has, not a failure deep inside the allocator."""
from __future__ import annotations

import torch

from core.errors import UserError

# Stated margin over an estimate: allocator overhead, activations, the Python runtime.
MARGIN_FRACTION = 0.25
MARGIN_BYTES = 256 * 2**20


def available_bytes(device: torch.device) -> int:
    """Free device memory on CUDA; MemAvailable (RAM the kernel can give without swapping) on
    CPU; None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check_fits(estimate: int, what: str, device: torch.device, fix: str) -> None:
    """Refuse `estimate` bytes (plus the margin) when the device cannot hold them.

    Raises:
        UserError: naming the estimate, the margin, what is available, and `fix`.
    """
    free = available_bytes(device)
    need = int(estimate * (1 + MARGIN_FRACTION)) + MARGIN_BYTES
    if free is not None and need > free:
        where = "free GPU memory" if device.type == "cuda" else "available RAM"
        raise UserError(f"{what} needs about {gib(estimate)} (with a {MARGIN_FRACTION:.0%} + "
                        f"{gib(MARGIN_BYTES)} margin: {gib(need)}), but {device} has {gib(free)} of "
                        f"{where}; {fix}")


# glibc's malloc hands a block over 32 MiB (its largest dynamic mmap threshold) straight to
# mmap, and munmaps it when freed: every step that makes such a temporary faults its pages in
# again. A prompt chunk's attention over a 4k-slot cache makes several ([layers stacked, KV
# heads, 384 rows, 4,107 slots] float32 is 38 MiB): `quantized`'s first token at 4k took 20 s
# with them faulted and 10 s without, `full`'s 1.49 s against 1.24 (docs/PERFORMANCE.md, 6zg).
KEEP_BYTES = 2**30


def keep_freed_buffers() -> bool:
    """Ask glibc's malloc to serve blocks up to KEEP_BYTES from its heap and to keep up to that
    much freed at the top of it, so that big temporaries are reused instead of mapped and
    faulted in every step. What is freed stays with the process, so resident memory stays near
    its peak (plus some fragmentation where sizes mix: 450 against 340 MiB in a probe that
    alternates five sizes of 20-50 MiB, flat over 600 steps). The CLI entry points call it;
    False where the C library is not glibc or REGIONKV_MALLOC=0 asks to leave it as it is."""
    import ctypes
    import os
    if os.environ.get("REGIONKV_MALLOC", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
        return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
    except (OSError, AttributeError):
        return False
