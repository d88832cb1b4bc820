"""Memory is checked before it is taken: an allocation that cannot fit is a one-line error that
gives the estimate and what the machine has, not a failure deep inside the allocator."""
from __future__ import annotations

from collections import Counter

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
# with them faulted and 10 s without, `full`'s 1.49 s against 1.24.
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


# A decode step streams every weight once from DRAM. In 4 KiB pages a 269 MB bfloat16 model is
# 66k pages, each a TLB miss that (in a VM) walks two page tables, and the hardware prefetcher
# stops at every page's end; in 2 MiB pages a step's bfloat16 GEMVs read 8-10% faster on
# machine D. PyTorch's allocator asks for such pages only under
# THP_MEM_ALLOC_ENABLE=1 and only for blocks of 2 MiB or more: a layer's weight is smaller.
ALIGN = 64  # a cache line: each tensor starts on one


def empty_on_huge_pages(specs: list[tuple[torch.Size, torch.dtype]]) -> list[torch.Tensor]:
    """Uninitialized contiguous CPU tensors of these (shape, dtype), packed in one private
    anonymous mapping that asks the kernel for huge pages (madvise MADV_HUGEPAGE, honoured where
    transparent huge pages are "always" or "madvise"); a page is given when first written. The
    tensors keep the mapping alive. Where the platform has no madvise, or the mapping cannot be
    made, they are plain torch.empty tensors."""
    import mmap
    sizes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs]
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    try:
        area = mmap.mmap(-1, max(end, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        return [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
    # A storage of its own for each (each holds a reference to `area`): views of one storage
    # would alias, and a compiled region refuses inputs that alias (a block's weights).
    return [torch.frombuffer(area, dtype=torch.uint8, count=n, offset=o).view(dtype).view(shape)
            if n else torch.empty(shape, dtype=dtype)
            for (shape, dtype), o, n in zip(specs, offsets, sizes)]


def move_to_huge_pages(module: torch.nn.Module) -> int:
    """Move the CPU parameters and buffers of `module` into one mapping of huge pages
    (empty_on_huge_pages), one tensor at a time, so that each old storage is freed as it goes
    where nothing else holds it. Tensors that are the same view of one storage (a tied head's
    weight and the embedding table) keep one home; a storage that holds several different
    views stays where it is, so that they keep sharing it. Returns the bytes moved."""
    def view(t):  # what a tensor is: its storage, where in it, and how it reads it
        return t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype
    holders = {}  # view -> every (store, name) that holds it (not the tensor: it must go)
    for m in module.modules():
        for store in (m._parameters, m._buffers):
            for n, t in store.items():
                if t is not None and t.device.type == "cpu" and t.layout == torch.strided \
                        and t.numel():
                    holders.setdefault(view(t), []).append((store, n))
    views_of = Counter(v[0] for v in holders)
    moving = [(v, held) for v, held in holders.items() if views_of[v[0]] == 1]
    homes = empty_on_huge_pages([(shape, dtype) for (_, _, shape, _, dtype), _ in moving])
    moved = 0
    for (_, held), home in zip(moving, homes):
        store, n = held[0]
        home.copy_(store[n])
        moved += home.numel() * home.element_size()
        for store, n in held:
            if isinstance(store[n], torch.nn.Parameter):
                store[n].data = home
            else:
                store[n] = home
    return moved
