"""Weight-only INT8 / INT4 quantization of the model's linear layers (torchao-style config + handler).

    config = QuantConfig("int4", groupsize=64)
    qstate = quantize_state_dict(float_state, args, config)   # float checkpoint -> storage format
    swap_linears(model, config)                               # nn.Linear -> Int8Linear / Int4Linear
    model.load_state_dict(qstate, strict=True, assign=True)
    pack_model(model.to(device), dtype)                       # storage -> fastest layout there

Quantized: every block's attention.wqkv, attention.wo, feed_forward.w1/w2/w3, and the output head
(a tied head gets its own quantized copy; tok_embeddings stays float). Biases stay float.

Storage format (device independent, what model.safetensors holds):
  INT8: qweight int8 [N, K], scales float32 [N]; w = q * scale, symmetric per output channel,
        scale = max|w_row| / 127, q in [-127, 127].
  INT4: qweight uint8 [N, K/2] (column 2j in the high nibble, 2j+1 in the low one, the layout
        aten._convert_weight_to_int4pack takes), scales and zeros float32 [N, K/g];
        asymmetric per group of g input columns: w = q * scale + zero, q in [0, 15],
        scale = (max - min) / 15, zero = min (both ends of every group are exact).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from core.tensors import aligned

# regionkv::int4_mm_cpu(x, qweight, groupsize, scales_zeros): aten's CPU INT4 product behind an
# op of the engine's own, which compiled code calls as it is. Lowered by Inductor inside a
# nested compiled region (a decode step's blocks), aten's op took its group size as a tensor
# constant and refused it ("group size must be a scalar").
_LIB = torch.library.Library("regionkv", "FRAGMENT")
_LIB.define("int4_mm_cpu(Tensor x, Tensor qweight, int groupsize, Tensor scales_zeros) -> Tensor")
_LIB.impl("int4_mm_cpu", lambda x, qweight, groupsize, scales_zeros:
          torch.ops.aten._weight_int4pack_mm_for_cpu(x, qweight, groupsize, scales_zeros),
          "CompositeExplicitAutograd")
torch.library.register_fake(
    "regionkv::int4_mm_cpu",
    lambda x, qweight, groupsize, scales_zeros: x.new_empty(x.shape[0], scales_zeros.shape[1]),
    lib=_LIB)

MODES = ("int8", "int4")
GROUPSIZES = (32, 64, 128, 256)
DEFAULT_GROUPSIZE = 32  # finest grid the int4 kernels take: best quality (gpt-fast's default too)
BLOCK_LINEARS = ("attention.wqkv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
                 "feed_forward.w3")
EPS = 1e-10


@dataclass(frozen=True)
class QuantConfig:
    """mode "int8" (per-channel, groupsize must be None) or "int4" (groupsize None = 32)."""
    mode: str
    groupsize: Optional[int] = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown quantization mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.mode == "int8" and self.groupsize is not None:
            raise ValueError("int8 uses one scale per output channel; groupsize applies to int4 only")
        if self.groupsize is not None and self.groupsize not in GROUPSIZES:
            raise ValueError(f"groupsize must be one of {', '.join(map(str, GROUPSIZES))}, "
                             f"got {self.groupsize}")

    def resolve(self, in_features) -> "QuantConfig":
        """The config with its groupsize fixed for layers of these in_features (int4)."""
        if self.mode != "int4":
            return self
        ks = sorted(set(in_features))
        if self.groupsize is None:
            if all(k % DEFAULT_GROUPSIZE == 0 for k in ks):
                return QuantConfig("int4", DEFAULT_GROUPSIZE)
            raise ValueError(f"groupsize {DEFAULT_GROUPSIZE} does not divide the in_features {ks}")
        bad = [k for k in ks if k % self.groupsize]
        if bad:
            fits = [g for g in GROUPSIZES if all(k % g == 0 for k in ks)]
            raise ValueError(f"groupsize {self.groupsize} does not divide in_features {bad[0]}; "
                             f"this model takes {'/'.join(map(str, fits)) or 'none'}")
        return self

    def to_dict(self) -> dict:
        return {"mode": self.mode, "groupsize": self.groupsize}

    @classmethod
    def from_dict(cls, d) -> "QuantConfig":
        if not isinstance(d, dict) or set(d) - {"mode", "groupsize"}:
            raise ValueError(f"invalid quantization section {d!r}")
        return cls(d.get("mode"), d.get("groupsize"))


def target_linears(model: nn.Module) -> list[str]:
    """Names of the linear layers quantization replaces, in module order."""
    names = [f"layers.{i}.{s}" for i in range(len(model.layers)) for s in BLOCK_LINEARS]
    return names + ["output"]


# ----------------------------------------------------------------------------------------------
# Quantize / dequantize (storage format)


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] -> (int8 [N, K], float32 scales [N])."""
    w = w.float()
    scales = w.abs().amax(dim=1).clamp(min=EPS) / 127
    q = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(q: Tensor, scales: Tensor) -> Tensor:
    return q.float() * scales[:, None].float()


def quantize_int4(w: Tensor, groupsize: int) -> tuple[Tensor, Tensor, Tensor]:
    """w [N, K] -> (uint8 [N, K/2] two nibbles a byte, float32 scales [N, K/g], zeros [N, K/g])."""
    N, K = w.shape
    if K % groupsize or K % 2:
        raise ValueError(f"groupsize {groupsize} does not divide in_features {K}")
    wg = w.float().reshape(N, K // groupsize, groupsize)
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp(min=EPS)
    q = torch.clamp(torch.round((wg - lo[..., None]) / scales[..., None]), 0, 15)
    q = q.to(torch.uint8).reshape(N, K)
    return (q[:, ::2] << 4) | q[:, 1::2], scales, lo


def unpack_int4(packed: Tensor) -> Tensor:
    """uint8 [N, K/2] -> uint8 [N, K] with values 0..15."""
    return torch.stack([packed >> 4, packed & 15], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(packed: Tensor, scales: Tensor, zeros: Tensor) -> Tensor:
    N, G = scales.shape
    q = unpack_int4(packed).reshape(N, G, -1).to(scales.dtype)
    return (q * scales[..., None] + zeros[..., None]).reshape(N, -1)


# ----------------------------------------------------------------------------------------------
# Modules
#
# Kernel per (device, activation dtype), chosen by microbenchmarks (docs/DESIGN.md):
#   CPU:  aten._weight_int8pack_mm / _weight_int4pack_mm_for_cpu, always fed bfloat16: on an
#         AVX2 build only their bf16 paths are vectorized (float32/float16 run 4-15x slower), so
#         float32/float16 activations are cast to bf16 for the matmul and back.
#   CUDA: int8 dequantizes in the graph (F.linear(x, q.to(dtype)) * scales, which Inductor fuses
#         into one memory-bound kernel, as gpt-fast does); int4 uses tinygemm
#         (_convert_weight_to_int4pack / _weight_int4pack_mm, bf16).
#   Else, or when a kernel refuses the shape or fails its check at pack time: "dequant", the
#         plain formula in the activation dtype, which works everywhere.


class QuantizedLinear(nn.Module):
    """Common part: shapes, float bias and the kernel name."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.kernel = "dequant"  # a Python constant to dynamo: one branch per compiled graph
        self.act_dtype = torch.float32

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, kernel={self.kernel}")

    def _finish(self, y: Tensor, x: Tensor) -> Tensor:
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def pack(self, dtype: torch.dtype) -> None:
        """Convert the storage tensors (already on their device) to the layout of the fastest
        kernel for activations of `dtype`; one way (the state dict is no longer the storage)."""
        self.act_dtype = dtype
        if self.bias is not None:
            self.bias = self.bias.to(dtype)
        device = self.scales.device
        ref_x = torch.randn(3, self.in_features, generator=torch.Generator().manual_seed(0))
        ref_x = ref_x.to(device=device, dtype=dtype)
        expected = self._dequant_forward(ref_x)
        failures = []
        for kernel in self._candidates(device, dtype):
            try:
                state = self._packed(kernel, dtype)
                got = self._run(kernel, state, ref_x)
                err = (got.float() - expected.float()).norm() / expected.float().norm().clamp(min=EPS)
                if not err < 2e-2:  # bf16 matmul vs the float formula: ~1e-3
                    raise RuntimeError(f"relative error {err:.3g} against the reference")
            except (RuntimeError, AttributeError) as e:  # kernel missing for this device/shape/build
                failures.append(f"{kernel}: {str(e).splitlines()[0][:100]}")
                continue
            self._install(kernel, state)
            return
        if failures:
            warnings.warn(f"{type(self).__name__} [{self.out_features}x{self.in_features}] on "
                          f"{device}: no fast kernel ({'; '.join(failures)}); using the plain formula")
        self._install("dequant", self._packed("dequant", dtype))

    def _packed(self, kernel: str, dtype: torch.dtype) -> dict:
        # Aligned, probe included: the packed CPU kernels crash on AVX-512 when a weight starts
        # off a 64-byte line (core/tensors.py), and a segfault is no exception to catch.
        return {k: aligned(t) for k, t in self._pack_for(kernel, dtype).items()}

    def _install(self, kernel: str, state: dict) -> None:
        self.kernel = kernel
        for name in ("qweight", "scales", "zeros", "scales_zeros"):
            self._buffers.pop(name, None)
        for name, t in state.items():
            # Non-persistent: a packed layout is not the checkpoint format.
            self.register_buffer(name, t, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return self._finish(self._run(self.kernel, self._buffers, x), x)

    def _dequant_forward(self, x: Tensor, rows: int = 4096) -> Tensor:
        # The plain formula, a block of output rows at a time (bounded memory for a big head).
        full = self._pack_for("dequant", x.dtype)
        return torch.cat([self._run("dequant", {k: t[i:i + rows] for k, t in full.items()}, x)
                          for i in range(0, self.out_features, rows)], dim=-1)


class Int8Linear(QuantizedLinear):
    """y = (x @ q^T) * scales (+ bias); q int8 [N, K], per-output-channel symmetric scales."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features, bias)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features))

    def set_weight(self, w: Tensor) -> None:
        self.qweight, self.scales = quantize_int8(w)

    def _candidates(self, device, dtype):
        return ["int8pack_bf16"] if device.type == "cpu" else []

    def _pack_for(self, kernel: str, dtype) -> dict:
        if kernel == "int8pack_bf16":
            return {"qweight": self.qweight, "scales": self.scales.to(torch.bfloat16)}
        return {"qweight": self.qweight, "scales": self.scales.to(dtype)}

    @staticmethod
    def _run(kernel: str, s: dict, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if kernel == "int8pack_bf16":
            return torch.ops.aten._weight_int8pack_mm(
                x2.to(torch.bfloat16), s["qweight"], s["scales"])
        return F.linear(x2, s["qweight"].to(x.dtype)) * s["scales"]


class Int4Linear(QuantizedLinear):
    """y = x @ (q * scales + zeros)^T (+ bias), per group of `groupsize` input columns."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 groupsize: int = DEFAULT_GROUPSIZE):
        super().__init__(in_features, out_features, bias)
        if in_features % groupsize:
            raise ValueError(f"groupsize {groupsize} does not divide in_features {in_features}")
        self.groupsize = groupsize
        n_groups = in_features // groupsize
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2,
                                                    dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, n_groups))
        self.register_buffer("zeros", torch.zeros(out_features, n_groups))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", groupsize={self.groupsize}"

    def set_weight(self, w: Tensor) -> None:
        self.qweight, self.scales, self.zeros = quantize_int4(w, self.groupsize)

    def _candidates(self, device, dtype):
        if device.type == "cpu":
            return ["int4pack_cpu"]
        if device.type == "cuda":
            return [f"int4pack_cuda{t}" for t in (8, 4, 2)]  # inner k tiles, widest first
        return []

    def _scales_and_zeros(self) -> Tensor:
        # tinygemm computes (q - 8) * scale + zero' with a [K/g, N, 2] table: zero' = zero + 8 s.
        s, z = self.scales.float(), self.zeros.float()
        return torch.stack([s, z + 8 * s], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)

    def _pack_for(self, kernel: str, dtype) -> dict:
        if kernel == "int4pack_cpu":
            q = unpack_int4(self.qweight).to(torch.int32)
            return {"qweight": torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
                    "scales_zeros": self._scales_and_zeros()}
        if kernel.startswith("int4pack_cuda"):
            tiles = int(kernel.removeprefix("int4pack_cuda"))
            return {"qweight": torch.ops.aten._convert_weight_to_int4pack(self.qweight, tiles),
                    "scales_zeros": self._scales_and_zeros()}
        return {"qweight": self.qweight, "scales": self.scales.to(dtype),
                "zeros": self.zeros.to(dtype)}

    def _run(self, kernel: str, s: dict, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if kernel.startswith("int4pack"):
            # The group size as the shapes give it: a module's int attribute is symbolic in a
            # compiled step (allow_many_graphs), and the kernels take no symbolic group size.
            groupsize = x2.shape[-1] // s["scales_zeros"].shape[0]
            op = torch.ops.regionkv.int4_mm_cpu if kernel == "int4pack_cpu" \
                else torch.ops.aten._weight_int4pack_mm
            return op(x2.to(torch.bfloat16), s["qweight"], groupsize, s["scales_zeros"])
        w = dequantize_int4(s["qweight"], s["scales"], s["zeros"]).to(x.dtype)
        return F.linear(x2, w)


# ----------------------------------------------------------------------------------------------
# Handler


def _in_features(args) -> list[int]:
    return [args.dim, args.n_head * args.head_dim, args.intermediate_size]


def resolve_config(config: QuantConfig, args) -> QuantConfig:
    """Fix the int4 groupsize for this model; ValueError when it cannot fit."""
    return config.resolve(_in_features(args))


def _make_module(linear: nn.Module, config: QuantConfig) -> QuantizedLinear:
    has_bias = getattr(linear, "bias", None) is not None
    if config.mode == "int8":
        return Int8Linear(linear.in_features, linear.out_features, has_bias)
    return Int4Linear(linear.in_features, linear.out_features, has_bias, config.groupsize)


def swap_linears(model: nn.Module, config: QuantConfig) -> nn.Module:
    """Replace every target nn.Linear by an (empty) quantized module, built on the device of
    the current default (meta inside load_model). A tied head is untied: it gets its own."""
    config = resolve_config(config, model.args)
    for name in target_linears(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        new = _make_module(old, config)
        setattr(parent, child, new)
    return model


def quantize_state_dict(state: dict, args, config: QuantConfig) -> dict:
    """A float engine state dict -> the quantized storage state dict (tensors on CPU)."""
    config = resolve_config(config, args)
    out = {}
    targets = {f"layers.{i}.{s}" for i in range(args.n_layer) for s in BLOCK_LINEARS} | {"output"}
    for key, t in state.items():
        mod, _, leaf = key.rpartition(".")
        if mod in targets and leaf == "weight":
            continue
        out[key] = t
    weights = {m: state.get(f"{m}.weight") for m in targets}
    if weights["output"] is None and args.tie_embeddings:
        weights["output"] = state.get("tok_embeddings.weight")
    for mod in sorted(targets):
        w = weights[mod]
        if w is None:
            raise KeyError(f"missing tensor {mod}.weight")
        if config.mode == "int8":
            q, s = quantize_int8(w)
            out.update({f"{mod}.qweight": q, f"{mod}.scales": s})
        else:
            q, s, z = quantize_int4(w, config.groupsize)
            out.update({f"{mod}.qweight": q, f"{mod}.scales": s, f"{mod}.zeros": z})
    return out


def pack_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Convert every quantized module (on its final device) to its kernel's layout."""
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.pack(dtype)
    return model


def quantize_model(model: nn.Module, config: QuantConfig, pack: Optional[torch.dtype] = None
                   ) -> nn.Module:
    """In place, in memory: quantize a float model's target linears (tests, experiments).
    With `pack` = an activation dtype, also convert to the kernel layout."""
    config = resolve_config(config, model.args)
    for name in target_linears(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        new = _make_module(old, config).to(old.weight.device)
        with torch.no_grad():
            new.set_weight(old.weight.detach())
            if old.bias is not None:
                new.bias = old.bias.detach().float().clone()
        setattr(parent, child, new)
    if pack is not None:
        pack_model(model, pack)
    return model
