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
