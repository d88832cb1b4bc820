"""Prefill + decode loop with sampling (gpt-fast's split), for any cache policy.

The decode step is one function of (model, token, input_pos); compiled once with fullgraph=True it
serves every step of a generation, because every cache keeps static shapes and is addressed by
index tensors. Prefill pads the prompt to a power-of-two bucket when compiled, so prompt lengths
share a handful of graphs instead of one per length.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from core.errors import UserError
from model import Transformer

MIN_PREFILL_BUCKET = 16


def sample(logits: Tensor, temperature: float, top_k: Optional[int]) -> Tensor:
    """logits [B, V] -> token ids [B, 1]; no host syncs (works inside a CUDA graph)."""
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        pivot = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = torch.where(logits < pivot, float("-inf"), logits)
    probs = torch.softmax(logits, dim=-1)
    # argmax(p / E) with E ~ Exp(1) draws from p (the exponential race), without a multinomial sync.
    noise = torch.empty_like(probs).exponential_(1)
    return (probs / noise).argmax(dim=-1, keepdim=True)


def prefill(model: Transformer, tokens: Tensor, input_pos: Tensor, last: Tensor,
            temperature: float, top_k: Optional[int]) -> Tensor:
    logits = model(tokens, input_pos, out_idx=last)
    return sample(logits[:, -1], temperature, top_k)


def decode_one_token(model: Transformer, token: Tensor, input_pos: Tensor,
                     temperature: float, top_k: Optional[int]) -> Tensor:
    logits = model(token, input_pos)
    return sample(logits[:, -1], temperature, top_k)


def run_block(layer: torch.nn.Module, x: Tensor, input_pos: Tensor) -> Tensor:
    return layer(x, input_pos)


def compile_decode(fn: Callable, model: Transformer, backend="inductor") -> Callable:
    """Compile a single-token step function `fn(model, token, input_pos, ...)` for the model's device.

    CUDA: the whole step in one graph, replayed as a CUDA graph (mode="reduce-overhead"), which
    removes the per-kernel launch cost that dominates small-batch decode.
    CPU: regional compilation. Every block runs through one compiled `run_block`; the blocks
    share its graph (parameters and cache buffers are graph inputs), so compiling costs one
    block (seconds) instead of the whole unrolled model (minutes), and the step is as fast. The
    embedding lookup, head and sampling stay eager: one large matmul each, nothing to fuse.
    """
    if model.device.type == "cuda":
        return torch.compile(fn, mode="reduce-overhead", fullgraph=True, backend=backend)
    model.block_step = torch.compile(run_block, fullgraph=True, dynamic=False, backend=backend)
    # Prompt chunks of compressing caches run eager blocks but compress token by token: compile
    # that step too (one graph per policy, shared by every layer and token).
    from caches.region import RegionCache
    compress = torch.compile(RegionCache.compress_step, fullgraph=True, dynamic=False,
                             backend=backend)
    for cache in model.caches():
        if isinstance(cache, RegionCache):
            cache.compiled_compress = compress
    return fn


def prefill_bucket(n: int, max_seq_length: int) -> int:
    bucket = MIN_PREFILL_BUCKET
    while bucket < n:
        bucket *= 2
    return min(bucket, max_seq_length)


@dataclass
class Generation:
    token_ids: list                 # prompt + new tokens, per sequence
    new_tokens: int                 # new tokens of the first sequence
    prefill_s: float
    decode_s: float
    stopped_at_eos: bool
    new_ids: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens made by decode steps (all but the first) per second."""
        return (self.new_tokens - 1) / self.decode_s if self.new_tokens > 1 and self.decode_s > 0 else 0.0


class Generator:
    """Owns the model's caches and the (optionally compiled) prefill/decode steps."""

    def __init__(self, model: Transformer, max_seq_length: int, batch_size: int = 1,
                 make_cache=None, compile: bool = False, compile_prefill: bool = False):
        self.model = model
        self.device = model.device
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        with torch.device(self.device):
            model.setup_caches(batch_size, max_seq_length, make_cache)
        self.compiled_prefill = compile_prefill
        # Caches that rotate keys by rank (--positions cache) never run out of positions.
        self.unbounded = all(getattr(c, "positions", "original") == "cache"
                             for c in model.caches())
        self.decode_fn = decode_one_token
        self.prefill_fn = prefill
        model.block_step = None
        if compile:
            self.decode_fn = compile_decode(decode_one_token, model)
        if compile_prefill:
            self.prefill_fn = torch.compile(prefill, fullgraph=True, dynamic=False)

    @torch.inference_mode()
    def warmup(self, temperature: float = 0.0, top_k: Optional[int] = None) -> float:
        """Compile (or just run) the decode step, and a prompt chunk of compressing caches, so
        timings exclude compilation; returns the seconds it took. The caches are reset
        afterwards."""
        t0 = time.perf_counter()
        token = torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.device)
        for t in range(2):  # the second call confirms the graph is reused
            self.decode_fn(self.model, token, torch.tensor([t], device=self.device),
                           temperature, top_k)
        chunk = self.model.caches()[0].prefill_chunk
        if chunk is not None and chunk < self.max_seq_length:  # compiles chunk compression
            self.model.reset_caches()
            self.prefill_prompt(token.new_zeros(self.batch_size, chunk), temperature, top_k)
        sync(self.device)
        self.model.reset_caches()
        return time.perf_counter() - t0

    @property
    def cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.model.caches())

    def check_prompt(self, n_prompt: int) -> None:
        if n_prompt == 0:
            raise UserError("the prompt is empty after tokenization; pass a non-empty --prompt")
        if n_prompt >= self.max_seq_length and not self.unbounded:
            raise UserError(f"the prompt is {n_prompt} tokens but --max_seq_length is "
                            f"{self.max_seq_length}; raise --max_seq_length above {n_prompt} "
                            f"or shorten the prompt")

    def prefill_prompt(self, tokens: Tensor, temperature: float, top_k: Optional[int]) -> Tensor:
        """Run the prompt [B, T] through the caches; return the first sampled token [B, 1]."""
        B, T = tokens.shape
        dev = tokens.device
        chunk = self.model.caches()[0].prefill_chunk
        if chunk is None:
            T_in = prefill_bucket(T, self.max_seq_length) if self.compiled_prefill else T
            # Padding sits at positions >= T: masked from every real query, and overwritten by
            # the decode steps that reach those positions.
            padded = torch.zeros(B, T_in, dtype=torch.long, device=dev)
            padded[:, :T] = tokens
            return self.prefill_fn(self.model, padded, torch.arange(T_in, device=dev),
                                   torch.tensor([T - 1], device=dev), temperature, top_k)
        # Compressing caches take fixed-size chunks (compressing after each), then the remainder
        # one token at a time through the decode step: two graphs for every prompt length.
        n_chunks = T // chunk
        last = torch.tensor([chunk - 1], device=dev)
        token = None
        for c in range(n_chunks):
            span = torch.arange(c * chunk, (c + 1) * chunk, device=dev)
            token = self.prefill_fn(self.model, tokens[:, c * chunk:(c + 1) * chunk], span, last,
                                    temperature, top_k)
        for t in range(n_chunks * chunk, T):
            # contiguous like the decode loop's own tokens, so the graph's stride guards hold
            step = tokens[:, t:t + 1].clone(memory_format=torch.contiguous_format)
            token = self.decode_fn(self.model, step, torch.tensor([t], device=dev), temperature,
                                   top_k)
        return token

    @torch.inference_mode()
    def generate(self, prompt: list, max_new_tokens: int, temperature: float = 0.0,
                 top_k: Optional[int] = None, eos_ids=(),
                 callback: Optional[Callable[[list], None]] = None) -> Generation:
        """prompt: token ids (one sequence, repeated over the batch) or a list of equal-length
        lists. callback(token_id) receives every new token of the first sequence."""
        rows = prompt if prompt and isinstance(prompt[0], (list, tuple)) else [prompt]
        if len(rows) == 1 and self.batch_size > 1:
            rows = rows * self.batch_size
        if len(rows) != self.batch_size or len({len(r) for r in rows}) != 1:
            raise UserError(f"expected {self.batch_size} prompts of equal length")
        T = len(rows[0])
        self.check_prompt(T)
        if not self.unbounded:
            max_new_tokens = min(max_new_tokens, self.max_seq_length - T)
        eos = torch.tensor(sorted(set(eos_ids)) or [-1], device=self.device)
        self.model.reset_caches()

        dev = self.device
        sync(dev)
        t0 = time.perf_counter()
        token = self.prefill_prompt(torch.tensor(rows, dtype=torch.long, device=dev),
                                    temperature, top_k).clone()
        out = [token]
        finished = torch.isin(token.view(-1), eos)
        # Reading the new token (to stream it and stop at EOS) is the loop's only host sync.
        first = token[0, 0].item()
        if callback:
            callback(first)
        sync(dev)
        t1 = time.perf_counter()

        pos = torch.tensor([T], device=dev)
        while len(out) < max_new_tokens and not bool(finished.all()):
            token = self.decode_fn(self.model, token, pos, temperature, top_k).clone()
            pos = pos + 1
            out.append(token)
            finished |= torch.isin(token.view(-1), eos)
            if callback:
                callback(token[0, 0].item())
        sync(dev)
        t2 = time.perf_counter()

        new = torch.cat(out, 1).tolist()
        new = [cut_at_eos(r, set(eos_ids)) for r in new]
        return Generation(token_ids=[r + n for r, n in zip(rows, new)], new_tokens=len(new[0]),
                          prefill_s=t1 - t0, decode_s=t2 - t1, stopped_at_eos=bool(finished.all()),
                          new_ids=new)


def cut_at_eos(ids: list, eos: set) -> list:
    """Keep tokens up to and including the first EOS."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
