"""How the engine runs the model over its caches: the host's hooks around a step, eager
settling of compression, and the compiled functions a model's steps go through.

The model (model.py) only runs its layers, each asking its cache to attend. The engine calls
`forward(model, ...)` instead of `model(...)`: it tells caches whose work falls on some
positions only which step this is (`before_step`), lets an eager step's caches compress
together after the last layer (`settle`), and sends a single token through the compiled step
graph when one was made (engine.runtime.generation.compile_decode). Called directly, the model gives
the same logits, each cache compressing on its own.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from model import Transformer


@dataclass
class Steps:
    """The compiled functions the engine made for one model (compile_decode, compile_prompt)."""
    graph: Optional[Callable] = None   # the CPU single-token step, one graph a step
    blocks: bool = False               # a single-token step runs each block in BLOCK
    chunk: Optional[Callable] = None   # one layer's step through its cache over a prompt chunk
    pieces: Optional[tuple] = None     # a block's parts before and after its cache, any rows


_STEPS: "weakref.WeakKeyDictionary[Transformer, Steps]" = weakref.WeakKeyDictionary()


def steps(model: Transformer) -> Steps:
    """This model's compiled steps (none until the engine compiles some)."""
    s = _STEPS.get(model)
    if s is None:
        s = _STEPS[model] = Steps()
    return s


def reset_steps(model: Transformer) -> Steps:
    """Forget the model's compiled steps (a new session or batcher chooses its own)."""
    _STEPS[model] = Steps()
    return _STEPS[model]


def run_block(layer: torch.nn.Module, x: Tensor, input_pos: Tensor, cache) -> Tensor:
    return layer(x, input_pos, cache)


# In a compiled single-token step every block goes through one nested compiled region:
# compiled once and stamped out per layer, so compiling takes seconds, not the minutes of 30
# unrolled blocks with their compression.
BLOCK = torch.compiler.nested_compile_region(run_block)


def forward(model: Transformer, idx: Tensor, input_pos: Tensor, caches,
            out_idx: Optional[Tensor] = None) -> Tensor:
    """The model's logits [B, T', vocab] for idx [B, T] at input_pos [B, T] (or [T], shared by
    the rows), as the engine runs a step (above)."""
    if input_pos.dim() == 1:
        input_pos = input_pos.view(1, -1).expand(idx.shape[0], -1)
    if torch.compiler.is_compiling():
        return run(model, idx, input_pos, caches, out_idx)
    # Caches whose work falls on some positions only pick the step's variant on the host.
    scheduled = [c for c in caches if c.scheduled]
    if scheduled:
        first, last = input_pos[:, 0].tolist(), input_pos[:, -1].tolist()  # one host read
        for cache in scheduled:
            cache.before_step(first, last)
    try:
        graph = steps(model).graph
        if idx.shape[1] == 1 and graph is not None:
            # One position: out_idx is moot. Fresh strides: a slice of a longer id tensor
            # would fail the graph's stride guards and compile it again.
            idx = idx.clone(memory_format=torch.contiguous_format)
            return graph(model, idx, input_pos, caches)
        return run(model, idx, input_pos, caches, out_idx)
    finally:
        for cache in scheduled:
            cache.after_step()


def run(model: Transformer, idx: Tensor, input_pos: Tensor, caches,
        out_idx: Optional[Tensor] = None, block: Optional[Callable] = None) -> Tensor:
    """forward's work: idx [B, T] at input_pos [B, T] -> logits [B, T', vocab]. block, if
    given, runs each block instead of BLOCK (a compiled step that inlines them)."""
    # The nested block region serves compiled graphs and the compiled single-token step;
    # eager prompt chunks call the blocks directly.
    if block is None and (torch.compiler.is_compiling() or
                          idx.shape[1] == 1 and steps(model).blocks):
        block = BLOCK
    if block is not None:
        return model(idx, input_pos, caches, out_idx, block=block)
    # Eager: a cache may leave its compression for after the last layer (a layer reads only
    # its own cache), so that caches alike compress together (`settle`).
    waiting = []

    def waits(layer, x, input_pos, cache):
        cache.waiting = waiting
        try:
            return layer(x, input_pos, cache)
        finally:
            cache.waiting = None
    logits = model(idx, input_pos, caches, out_idx, block=waits)
    if waiting:
        waiting[0].settle(waiting, input_pos)
    return logits
