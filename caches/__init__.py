"""KV caches: the shared interface, the region cache and one small file per policy.

Adding a policy: one file with a RegionCache subclass, plus one line in POLICIES.
"""
from __future__ import annotations

import re
from typing import Optional

import torch
import torch.nn as nn

from caches.a2sf import A2SFCache
from caches.base import KVCache
from caches.cam import CaMCache
from caches.full import FullCache
from caches.h2o import H2OCache
from caches.keydiff import KeyDiffCache
from caches.knorm import KnormCache
from caches.lagkv import LagKVCache
from caches.quantized import QuantizedCache
from caches.region import RegionCache
from caches.streaming import StreamingCache
from caches.tova import TOVACache
from caches.weightedkv import WeightedKVCache, WeightedKVEvictCache
from core.errors import UserError
from core.memory import check_fits

POLICIES = {
    "full": FullCache,
    "streaming": StreamingCache,
    "quantized": QuantizedCache,
    "h2o": H2OCache,
    "tova": TOVACache,
    "a2sf": A2SFCache,
    "weightedkv": WeightedKVCache,
    "weightedkv-evict": WeightedKVEvictCache,
    "cam": CaMCache,
    "lagkv": LagKVCache,
    "knorm": KnormCache,
    "keydiff": KeyDiffCache,
}

DEFAULT_CACHE_SIZE = 256
DEFAULT_SINK = 4
DEFAULT_CHUNK = 32
# How a prompt chunk compresses: token by token (exact order) or in one pass (caches/region.py).
PROMPT_COMPRESSION = ("chunked", "bulk", "snapkv")  # snapkv: one shot, caches/snapkv.py
DEFAULT_OBSERVATION_WINDOW = 32


def describe(name: str) -> str:
    return POLICIES[name].description


def policy_options(name: str) -> dict:
    """The options policy `name` declares (caches.base.Option), by name."""
    return {o.name: o for o in POLICIES[name].options}


def all_options() -> dict:
    """Every option some policy declares: name -> (the Option, the policies that take it).
    Two policies may share an option only if they declare it alike."""
    out = {}
    for policy, cls in POLICIES.items():
        for o in cls.options:
            if o.name in out and out[o.name][0] != o:
                raise TypeError(f"option {o.name!r} of {policy} differs from "
                                f"{out[o.name][1][0]}'s")
            out.setdefault(o.name, (o, []))[1].append(policy)
    return out


def region_sizes(name: str, cache_size: int, sink=None, window=None) -> tuple[int, int, int]:
    """(sink, window, middle) for a policy: the WeightedKV paper's split by default (sink 4,
    window N//2 - 4, middle N - N//2); middle-less policies give the middle to the window."""
    cls = POLICIES[name]
    sink = DEFAULT_SINK if sink is None else sink
    if sink < 0:
        raise UserError(f"`sink` must be >= 0, got {sink}")
    if window is None:
        window = cache_size - sink if not cls.has_middle else cache_size // 2 - sink
    if window < 1:
        raise UserError(f"`window` must be at least 1 (got {window}); raise `cache_size` or "
                        f"lower `sink`")
    middle = cache_size - sink - window if cls.has_middle else 0
    if cls.has_middle and middle < 1:
        raise UserError(f"`cache_size` {cache_size} leaves no middle for {name} with sink {sink} "
                        f"and window {window}; it needs cache_size >= sink + window + 1 = "
                        f"{sink + window + 1}")
    if not cls.has_middle and sink + window != cache_size:
        raise UserError(f"{name} keeps sink + window tokens: `cache_size` {cache_size} must equal "
                        f"sink {sink} + window {window}")
    return sink, window, middle


# ---- per-layer plans: which policy and budget each layer gets ------------------------------
# A budget pattern maps (layers, mean budget) to one budget per layer summing to layers * mean
# (the uniform total). Budgets step in BUDGET_LEVELS contiguous groups of layers, so a plan has
# few distinct layer shapes (each is one compiled graph); rounding's remainder goes to layer 0.
BUDGET_LEVELS = 4


def _sloped(n_layers: int, size: int, first: float, last: float) -> list:
    levels = min(BUDGET_LEVELS, n_layers)
    group = [layer * levels // n_layers for layer in range(n_layers)]  # each layer's step
    scale = [first + (last - first) * g / max(levels - 1, 1) for g in range(levels)]
    # Groups differ in size by one layer: rescale so that the total is (nearly) exact before
    # rounding, leaving layer 0 a remainder of a few tokens.
    norm = n_layers / sum(scale[g] for g in group)
    budgets = [max(1, round(size * scale[g] * norm)) for g in group]
    budgets[0] += n_layers * size - sum(budgets)
    return budgets


BUDGET_PATTERNS = {
    "uniform": lambda n_layers, size: [size] * n_layers,
    # PyramidKV: lower layers attend broadly and get more (1.5x the mean down to 0.5x).
    "pyramid": lambda n_layers, size: _sloped(n_layers, size, 1.5, 0.5),
    "funnel": lambda n_layers, size: _sloped(n_layers, size, 0.5, 1.5),
}
# A layer pattern maps (layers, policies) to the index of the policy each layer runs.
LAYER_PATTERNS = {
    "repeat": lambda n_layers, n: [i % n for i in range(n_layers)],   # local-global alternation
    "tile": lambda n_layers, n: [i * n // n_layers for i in range(n_layers)],  # halves (n = 2)
}


def layer_policies(name: str) -> list:
    """'weightedkv,full' (or 'weightedkv/full', the spelling inside comma lists) -> names."""
    return [p.strip() for p in re.split(r"[,/]", name)]


def keeps_every_token(name: str) -> bool:
    """No token budget to size: every policy of `name` (one, or one per layer) keeps all."""
    return all(POLICIES[p].keeps_every_token for p in layer_policies(name))


def make_cache_factory(name: str, *, cache_size: int = DEFAULT_CACHE_SIZE, sink=None,
                       window=None, kv_middle: str = "model", positions: str = "original",
                       chunk: int = DEFAULT_CHUNK, prompt_compression: str = "chunked",
                       seed: int = 0, budget_pattern: str = "uniform",
                       layer_pattern: Optional[str] = None, observation_window=None,
                       compression_interval: int = 1, **options) -> "CacheFactory":
    """The builder of each layer's cache of policy `name` (see CacheFactory); UserError names
    a bad setting. `name` may list policies ('weightedkv,full') that `layer_pattern` assigns to
    layers; `budget_pattern` spreads cache_size * layers over the layers."""
    names = layer_policies(name)
    if len(names) > 1 or layer_pattern is not None or budget_pattern != "uniform":
        return LayeredFactory.make(names, dict(
            cache_size=cache_size, sink=sink, window=window, kv_middle=kv_middle,
            positions=positions, chunk=chunk, prompt_compression=prompt_compression, seed=seed,
            **({} if observation_window is None else {"observation_window": observation_window}),
            **({} if compression_interval == 1 else {"compression_interval": compression_interval}),
            **options), budget_pattern, layer_pattern)
    if name not in POLICIES:
        raise UserError(f"unknown cache policy {name!r}; choose one of {', '.join(POLICIES)}")
    cls = POLICIES[name]
    allowed = policy_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        valid = ", ".join(f"`{o}`" for o in allowed) or "none"
        raise UserError(f"{name} has no option {', '.join(f'`{u}`' for u in unknown)} "
                        f"(its options: {valid})")
    if kv_middle not in ("model", "int8"):
        raise UserError(f"`kv_middle` must be 'model' or 'int8', got {kv_middle!r}")
    if positions not in ("original", "cache"):
        raise UserError(f"`positions` must be 'original' or 'cache', got {positions!r}")
    if prompt_compression not in PROMPT_COMPRESSION:
        raise UserError(f"`prompt_compression` must be one of {', '.join(PROMPT_COMPRESSION)}, "
                        f"got {prompt_compression!r}")
    if observation_window is not None and prompt_compression != "snapkv":
        raise UserError("`observation_window` sets snapkv's prompt compression; add "
                        "`prompt_compression` snapkv")
    if observation_window is not None and observation_window < 1:
        raise UserError(f"`observation_window` must be at least 1, got {observation_window}")
    if cls is FullCache:
        if kv_middle == "int8":
            raise UserError("`kv_middle` int8 needs a policy with a middle region; full has none "
                            "(use `cache` quantized)")
        if positions == "cache":
            raise UserError("`positions` cache needs a compressing policy; full keeps every "
                            "position")
        if prompt_compression != "chunked":
            raise UserError(f"`prompt_compression` {prompt_compression} needs a compressing "
                            f"policy; full keeps every token")
        if compression_interval != 1:
            raise UserError("`compression_interval` needs a compressing policy; full keeps "
                            "every token")
        return CacheFactory(FullCache, {}, {"policy": name})
    if kv_middle == "int8" and not cls.has_middle:
        raise UserError(f"`kv_middle` int8 needs a policy with a middle region; {name} has none")
    if cache_size < 2:
        raise UserError(f"`cache_size` must be at least 2, got {cache_size}")
    sink, window, middle = region_sizes(name, cache_size, sink, window)
    if not isinstance(compression_interval, int) or not 1 <= compression_interval <= chunk:
        raise UserError(f"`compression_interval` must be an integer between 1 and the prefill "
                        f"chunk ({chunk}): the tokens waiting for a pass stay in its staging "
                        f"slots; got {compression_interval!r}")
    for key, value in options.items():
        allowed[key].check(value)
    cls.check_options(window, **options)
    int8 = kv_middle == "int8" or getattr(cls, "always_int8", False)
    spec = dict(policy=name, cache_size=cache_size, sink=sink, window=window, kv_middle=kv_middle,
                positions=positions, chunk=chunk, seed=seed, **options)
    one_shot = {}
    if prompt_compression != "chunked":  # the default stays out: older saved specs match
        spec["prompt_compression"] = prompt_compression
    if compression_interval != 1:  # likewise
        spec["compression_interval"] = compression_interval
    if prompt_compression == "snapkv":
        one_shot["observation_window"] = observation_window or DEFAULT_OBSERVATION_WINDOW
        spec.update(one_shot)
    return CacheFactory(cls, dict(sink=sink, window=window, middle=middle, chunk=chunk,
                                  middle_int8=int8, positions=positions, seed=seed,
                                  prompt_compression=prompt_compression, **one_shot,
                                  compression_interval=compression_interval, **options), spec)


class CacheFactory:
    """Builds one layer's cache: factory(batch_size, n_kv_heads, head_dim, max_seq_length,
    dtype, rope, layer_id). `spec` is the keyword form of make_cache_factory that made it (what
    a saved session records, and what make_cache_factory(**spec) rebuilds)."""

    def __init__(self, cls, kwargs: dict, spec: dict):
        self.cls, self.kwargs, self.spec = cls, kwargs, spec

    def __call__(self, batch_size, n_kv_heads, head_dim, max_seq_length, dtype, rope,
                 layer_id: int = 0) -> KVCache:
        return self.cls(batch_size, n_kv_heads, head_dim, max_seq_length, dtype, rope,
                        layer_id=layer_id, **self.kwargs)

    @classmethod
    def from_spec(cls, spec: dict) -> "CacheFactory":
        spec = dict(spec)
        return make_cache_factory(spec.pop("policy"), **spec)

    def layers(self, n_layers: int) -> list:
        """The factory of each layer (one policy, one budget: this one, n_layers times)."""
        return [self] * n_layers


class LayeredFactory(CacheFactory):
    """Caches that differ by layer: a plan (one single-policy CacheFactory per layer), made from
    the policies, the layer pattern that assigns them and the budget pattern, once the layer
    count is known. Each layer's cache is built by its own factory; the rest is unchanged."""

    def __init__(self, names: list, settings: dict, budget_pattern: str,
                 layer_pattern: Optional[str]):
        self.names, self.settings = names, settings
        self.budget_pattern, self.layer_pattern = budget_pattern, layer_pattern
        self._plans = {}
        spec = {k: v for k, v in settings.items() if not (k == "prompt_compression"
                                                          and v == "chunked")}
        self.spec = dict(spec, policy=",".join(names), budget_pattern=budget_pattern,
                         layer_pattern=layer_pattern)
        self.cls = None  # no single class

    @classmethod
    def make(cls, names, settings, budget_pattern, layer_pattern) -> "LayeredFactory":
        unknown = [n for n in names if n not in POLICIES]
        if unknown:
            raise UserError(f"unknown cache policy {unknown[0]!r}; choose one of "
                            f"{', '.join(POLICIES)}")
        if budget_pattern not in BUDGET_PATTERNS:
            raise UserError(f"unknown `budget_pattern` {budget_pattern!r}; choose one of "
                            f"{', '.join(BUDGET_PATTERNS)}")
        if layer_pattern is not None and layer_pattern not in LAYER_PATTERNS:
            raise UserError(f"unknown `layer_pattern` {layer_pattern!r}; choose one of "
                            f"{', '.join(LAYER_PATTERNS)}")
        if len(names) > 1 and layer_pattern is None:
            raise UserError(f"`cache` {','.join(names)} lists {len(names)} policies: give a "
                            f"`layer_pattern` ({' or '.join(LAYER_PATTERNS)}) to assign them")
        if len(names) == 1 and layer_pattern is not None:
            raise UserError(f"`layer_pattern` assigns two or more policies to layers; list "
                            f"them in `cache` (e.g. {names[0]},full)")
        if budget_pattern != "uniform" and all(POLICIES[n].keeps_every_token for n in names):
            raise UserError(f"`budget_pattern` {budget_pattern} spreads a token budget; "
                            f"{','.join(names)} keeps every token")
        factory = cls(names, settings, budget_pattern, layer_pattern)
        factory.plan(2 * len(names))  # settings no layer count makes valid fail now
        return factory

    def plan(self, n_layers: int) -> list:
        """[(policy, budget, factory)] for each of n_layers layers (UserError if they do not
        fit: more policies than layers, a budget below a layer's sink + window + 1)."""
        if n_layers in self._plans:
            return self._plans[n_layers]
        if len(self.names) > n_layers:
            raise UserError(f"`layer_pattern` {self.layer_pattern} assigns {len(self.names)} "
                            f"policies to {n_layers} layers; list at most {n_layers}")
        which = LAYER_PATTERNS[self.layer_pattern](n_layers, len(self.names)) \
            if self.layer_pattern else [0] * n_layers
        s = self.settings
        budgets = BUDGET_PATTERNS[self.budget_pattern](n_layers, s["cache_size"])
        plan = []
        for layer, (i, budget) in enumerate(zip(which, budgets)):
            name = self.names[i]
            cls = POLICIES[name]
            if cls is FullCache:
                factory = make_cache_factory(name, positions=s["positions"])
            else:
                opts = {k: v for k, v in s.items() if k not in (
                    "cache_size", "kv_middle") and (k in _REGION_KEYS or k in policy_options(name))}
                kv = s["kv_middle"] if cls.has_middle else "model"
                try:
                    factory = make_cache_factory(name, cache_size=budget, kv_middle=kv, **opts)
                except UserError as e:
                    raise UserError(f"`budget_pattern` {self.budget_pattern} gives layer {layer} "
                                    f"({name}) {budget} tokens, too few: {e}") from None
            plan.append((name, None if cls.keeps_every_token else budget, factory))
        used = {k for _, _, f in plan for k in f.spec}
        extra = sorted(k for k in s if k not in _REGION_KEYS and k not in used
                       and k not in ("cache_size", "kv_middle"))
        if extra:
            raise UserError(f"no policy of {','.join(self.names)} has option "
                            f"{', '.join(f'`{k}`' for k in extra)}")
        if s["kv_middle"] == "int8" and not any(POLICIES[n].has_middle for n in self.names):
            raise UserError(f"`kv_middle` int8 needs a policy with a middle region; "
                            f"{','.join(self.names)} has none")
        self._plans[n_layers] = plan
        return plan

    def layers(self, n_layers: int) -> list:
        return [f for _, _, f in self.plan(n_layers)]

    def budgets(self, n_layers: int) -> list:
        """Each layer's policy and token budget (None: keeps every token), for --json."""
        return [{"policy": n, "cache_size": b} for n, b, _ in self.plan(n_layers)]

    def describe(self, n_layers: int) -> str:
        """'layers 0-7 weightedkv 384, 8-14 weightedkv 299, ...' (runs of equal layers)."""
        runs = []
        for layer, (name, budget, _) in enumerate(self.plan(n_layers)):
            what = name if budget is None else f"{name} {budget}"
            if runs and runs[-1][2] == what:
                runs[-1][1] = layer
            else:
                runs.append([layer, layer, what])
        return "layers " + ", ".join(f"{a}" + (f"-{b}" if b > a else "") + f" {w}"
                                     for a, b, w in runs)

    def __call__(self, *args, **kw) -> KVCache:
        raise TypeError("a layered plan builds each layer by its own factory: use "
                        "layers(n_layers), as build_caches does")


# Settings of make_cache_factory every region policy takes (the rest are policy options).
_REGION_KEYS = ("sink", "window", "positions", "chunk", "prompt_compression", "seed",
                "observation_window", "compression_interval")


def cache_nbytes(args, batch_size: int, max_seq_length: int, dtype: torch.dtype,
                 make_cache=None) -> int:
    """Bytes build_caches would allocate (every layer's buffers and the RoPE table), counted by
    building the caches on the meta device: no memory is taken, whatever the sizes."""
    make_cache = make_cache or make_cache_factory("full")
    caches, rope = _meta_caches(make_cache, args, batch_size, max_seq_length, dtype)
    return sum(c.nbytes for c in caches) + rope.numel() * rope.element_size()


def _meta_caches(make_cache, args, batch_size: int, max_seq_length: int, dtype: torch.dtype):
    """Every layer's cache and the RoPE table, built on the meta device (no memory taken)."""
    with torch.device("meta"):
        rope = torch.empty(max_seq_length, args.head_dim // 2, 2)
        return [make(batch_size, args.n_kv_heads, args.head_dim, max_seq_length, dtype, rope,
                     layer_id=i) for i, make in enumerate(layer_makers(make_cache, args))], rope


def layer_makers(make_cache, args) -> list:
    """The builder of each layer's cache: a plan's own per layer, else make_cache for all."""
    if hasattr(make_cache, "layers"):
        return make_cache.layers(args.n_layer)
    return [make_cache] * args.n_layer


def row_nbytes(make_cache, args, dtype: torch.dtype) -> int:
    """One stream's cache bytes, as `cache_bytes` reports them: every layer's buffers (K/V,
    statistics, index maps, INT8 scales), the shared RoPE table excluded."""
    return sum(c.nbytes for c in _meta_caches(make_cache, args, 1, 1, dtype)[0])


def fit_to_bytes(name: str, budget: int, args, dtype: torch.dtype, *, sink=None, window=None,
                 **settings) -> tuple[int, int, int]:
    """(sink, window, middle) of the largest cache of policy `name` whose row_nbytes fit in
    `budget` bytes for a model of shape `args` in `dtype` (settings: kv_middle, chunk and the
    policy's options, as make_cache_factory takes them).

    The default split's proportions scale until one more token would not fit; then the middle
    alone takes what is left, so one more middle token would not fit either (an INT8 middle,
    cheaper per token, ends up longer). A given `window` (and sink) stays fixed and the middle
    takes the whole budget. UserError when even the smallest cache does not fit."""
    if len(layer_policies(name)) > 1 or settings.get("budget_pattern", "uniform") != "uniform":
        raise UserError("`cache_mib` sizes one policy with a uniform budget; give a budget in "
                        "tokens to a layer or budget pattern")
    if POLICIES[name].keeps_every_token:
        raise UserError(f"`cache_mib` sizes a policy with a token budget; {name} keeps every "
                        f"token, so its bytes follow the stream's length (`max_seq_length`)")
    settings = dict(settings, positions="original")  # rank positions change no buffer
    if window is None:  # settings that no size makes valid fail here, with their own message
        make_cache_factory(name, cache_size=DEFAULT_CACHE_SIZE, sink=sink, **settings)

    def nbytes(size, s, w):
        try:
            factory = make_cache_factory(name, cache_size=size, sink=s, window=w, **settings)
        except UserError:
            return None  # no valid split at this size
        return row_nbytes(factory, args, dtype)

    def largest(lo: int, fits) -> int:
        """The largest n >= lo with fits(n), given fits(lo) and a monotone fits."""
        hi = lo + 1
        while fits(hi):
            lo, hi = hi, 2 * hi
            if hi > 1 << 24:
                raise UserError(f"`cache_mib` {budget / 2**20:.4g} is more than any {name} "
                                f"cache needs (over {1 << 24} tokens); give a smaller budget")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    has_middle = POLICIES[name].has_middle
    if window is None:
        smallest = next((n for n in range(2, 4097) if nbytes(n, sink, None) is not None), None)
        if smallest is None:
            region_sizes(name, 2, sink, None)  # raises the reason
        need = nbytes(smallest, sink, None)
        if need > budget:
            raise UserError(f"`cache_mib` {budget / 2**20:.4g} is too small for {name}: its "
                            f"smallest cache ({smallest} tokens) takes {need / 2**20:.3f} MiB; "
                            f"give at least that")
        size = largest(smallest, lambda n: (b := nbytes(n, sink, None)) is not None
                       and b <= budget)
        sink, window, middle = region_sizes(name, size, sink, None)
        if not has_middle:
            return sink, window, 0
    elif not has_middle:
        raise UserError(f"`cache_mib` sizes {name}'s window; drop `window`")
    else:
        sink = DEFAULT_SINK if sink is None else sink
        need = nbytes(sink + window + 1, sink, window)
        if need is None or need > budget:
            region_sizes(name, sink + window + 1, sink, window)  # a bad split names itself
            raise UserError(f"`cache_mib` {budget / 2**20:.4g} is too small for {name} with sink "
                            f"{sink} and window {window}: a middle of 1 takes "
                            f"{need / 2**20:.3f} MiB; give at least that or a smaller window")
        middle = 1
    middle = largest(middle, lambda m: (b := nbytes(sink + window + m, sink, window)) is not None
                     and b <= budget)
    return sink, window, middle


def build_caches(model, batch_size: int, max_seq_length: int, make_cache=None) -> nn.ModuleList:
    """One cache per layer of `model`, on its device and in its dtype, for batch_size streams of
    up to max_seq_length positions (the RoPE table's length). Allocated once, here, after
    checking that they fit (core/memory.py)."""
    make_cache = make_cache or make_cache_factory("full")
    args = model.args
    policy = getattr(make_cache, "spec", {}).get("policy", "cache")
    check_fits(cache_nbytes(args, batch_size, max_seq_length, model.dtype, make_cache),
               f"the KV cache ({policy}, {batch_size} row(s), {max_seq_length} positions)",
               model.device, "lower `cache_size`, `max_seq_length` or the batch size")
    rope = model.rope(max_seq_length)
    with torch.device(model.device):
        caches = nn.ModuleList(make(batch_size, args.n_kv_heads, args.head_dim, max_seq_length,
                                    model.dtype, rope, layer_id=i)
                               for i, make in enumerate(layer_makers(make_cache, args)))
    for cache in caches:  # a tensor-parallel model's caches hold its rank's KV heads
        cache.shard = getattr(model, "kv_shard", None)
    return caches


__all__ = ["KVCache", "RegionCache", "FullCache", "POLICIES", "make_cache_factory", "describe",
           "policy_options", "region_sizes", "build_caches", "cache_nbytes", "CacheFactory",
           "row_nbytes", "fit_to_bytes", "LayeredFactory", "BUDGET_PATTERNS", "LAYER_PATTERNS",
           "layer_policies", "keeps_every_token"]
