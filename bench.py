"""Benchmark decode speed against the machine's memory bandwidth: python bench.py [--json].

For a checkpoint, dtype and one or more cache policies, at several contexts (tokens already in
the cache when decoding is timed), eager and/or compiled: decode tokens/s (median of --repeats),
prefill tokens/s, time to first token, compile time, peak memory, cache bytes, bytes read per
decode token (weights + the K/V attention reads) and the bandwidth that implies, as a fraction of
the machine's own streaming-read bandwidth (the median of BANDWIDTH_PROBES probes, some before
the engine's rows and some after, with their spread: a shared machine's bandwidth moves, and
one probe taken in a slow or a fast phase would put every fraction off by that phase). `--peer transformers` runs
the same weights, prompt ids, dtype and token count through `transformers` in the same process;
`--peer llama.cpp` writes the same weights to a GGUF (F32, F16 or BF16 as the run's dtype; Q8_0
for an INT8 checkpoint) and runs it through llama-cpp-python on the same threads.

With --batch_size B, B copies of the prompt decode together: tok/s counts all B sequences, while
ms/tok and MB/tok are per decode step (each sequence's latency, and the bytes the step reads: the
weights once, the K/V of all B sequences).

    python bench.py --contexts 256,1024,4096 --cache full,weightedkv --compile both
    python bench.py --contexts 1024 --compile off --peer transformers --json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.cli import (CHECKPOINT_HELP, DTYPES, REGION_FLAGS, Parser,
                        add_bake_argument, add_cache_arguments, cache_factory_from_args,
                        comma_list, layer_report, list_caches, positive_float, positive_int,
                        resolve_device, policy_option_names, resolve_dtype, run,
                        size_cache_from_mib)
from core.errors import UserError
from core.memory import empty_on_huge_pages

ROOT = Path(__file__).resolve().parent
TEXT_FILES = (ROOT / "data" / "corpora" / "wiki.txt", ROOT / "tests" / "data" / "kjv_genesis_1_2.txt")
PEER_INSTALL = {"transformers": "pip install transformers==5.23.0 (requirements-dev.txt)",
                "llama.cpp": "pip install llama-cpp-python==0.3.36 (it builds llama.cpp: many "
                             "minutes on 2 cores)"}


# ---- arguments ---------------------------------------------------------------------------------

def policy_list(text: str) -> list:
    """Comma-separated policies; a policy by layer (with --layer_pattern) is slash-separated:
    full,weightedkv/full."""
    from caches import POLICIES, layer_policies
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [p for n in names for p in layer_policies(n) if p not in POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown cache policy {', '.join(map(repr, unknown))}; "
                                         f"choose from {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def int_list(what: str):
    """Comma-separated positive integers, duplicates dropped; `what` names them in errors."""
    parse = comma_list(positive_int, what)
    return lambda text: list(dict.fromkeys(parse(text)))


def build_parser() -> Parser:
    # "resolve" lets --cache be re-declared to take a comma-separated list of policies.
    p = Parser(description=__doc__.splitlines()[0], conflict_handler="resolve")
    p.add_argument("--checkpoint_path", default=None, help=CHECKPOINT_HELP)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    add_cache_arguments(p)
    p.add_argument("--cache", type=policy_list, default=["full"],
                   help="comma-separated cache policies, e.g. full,streaming,weightedkv")
    p.add_argument("--contexts", type=int_list("positive token counts"), default=[256, 1024, 4096],
                   help="comma-separated tokens in the cache when decoding is timed")
    p.add_argument("--batch_size", type=int_list("positive batch sizes"), default=[1],
                   help="comma-separated batch sizes, e.g. 1,2,4 (the peer runs at 1 only)")
    p.add_argument("--memory_gib", type=positive_float, default=None,
                   help="throughput at equal memory: each policy runs as many streams as its "
                        "caches fit in this many GiB at each context (instead of --batch_size), "
                        "all holding one prompt read once and copied row to row")
    p.add_argument("--read_once", action="store_true",
                   help="rows of a batch read their shared prompt once, copied row to row (a "
                        "long prompt's prefill paid once, not per stream; --memory_gib does so)")
    p.add_argument("--new_tokens", type=positive_int, default=32, help="decode steps timed")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs; medians reported")
    p.add_argument("--compile", choices=["on", "off", "both"], default="both",
                   help="time the compiled decode step, the eager one, or both")
    p.add_argument("--compile_prefill", action="store_true",
                   help="compiled rows also compile the prompt (as generate.py's flag; mode "
                        "'compiled+', its compile time in comp s)")
    add_bake_argument(p)
    p.add_argument("--peer", choices=["transformers", "llama.cpp"], default=None,
                   help="also run the same weights through this library and report the ratio "
                        "(llama.cpp: the full cache only)")
    p.add_argument("--text_file", default=None,
                   help="text of the context prompt (default: data/corpora/wiki.txt if prepared, "
                        "else tests/data/kjv_genesis_1_2.txt; repeated when too short)")
    p.add_argument("--speculate", type=comma_list(str, "drafts"), default=[],
                   help="also time speculative decoding, a row per draft beside the plain one "
                        "(its speedup): ngram (prompt lookup), cache (the target's weights over "
                        "--draft_cache), or a draft checkpoint (a directory or embedded name); "
                        "a compressing cache then compresses every chunk - k positions, plain "
                        "rows too (the lossless reference)")
    p.add_argument("--speculate_k", type=positive_int, default=4,
                   help="tokens a draft guesses a step (default 4)")
    p.add_argument("--ngram", type=positive_int, default=3, help="prompt lookup's longest n-gram")
    p.add_argument("--draft_cache", default="streaming",
                   help="the cache of --speculate cache (default streaming)")
    p.add_argument("--draft_cache_size", type=positive_int, default=256,
                   help="its retained tokens (default 256)")
    p.add_argument("--task", choices=["continue", "copy"], default="continue",
                   help="continue: the context is text that the model continues; copy: half "
                        "the context is the text, the rest its beginning again (a copy-heavy "
                        "continuation, where prompt lookup pays)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p


def policy_factories(args, notes: list, cfg: dict = None, dtype=None) -> dict:
    """policy -> (cache factory, settings): each cache flag goes to the policies it fits; a flag
    that fits none of the listed policies is an error (the factory's own message). With the
    model's config and dtype, --cache_mib sizes each policy."""
    from caches import POLICIES, layer_policies, policy_options
    if args.positions == "auto":  # every timed stream fits the model's context (main checks)
        args.positions = "original"
    parts = layer_policies  # a policy by layer fits a flag that one of its policies takes
    fits = {
        "kv_middle": lambda c: args.kv_middle == "model" or any(POLICIES[p].has_middle
                                                                for p in parts(c)),
        "positions": lambda c: args.positions == "original" or c != "full",
        **{o: (lambda c, o=o: getattr(args, o) is None or any(o in policy_options(p)
                                                               for p in parts(c)))
           for o in policy_option_names()},
        **{o: (lambda c, o=o: getattr(args, o) is None or c != "full")
           for o in (*REGION_FLAGS, "budget_pattern")},
        "layer_pattern": lambda c: args.layer_pattern is None or len(parts(c)) > 1,
    }
    for flag, ok in fits.items():
        if not any(ok(c) for c in args.cache):
            ns = argparse.Namespace(**vars(args))
            ns.cache = args.cache[0]
            cache_factory_from_args(ns)  # raises the one-line error naming the mismatch
    out = {}
    for c in args.cache:
        ns = argparse.Namespace(**vars(args))
        ns.cache = c
        defaults = {"kv_middle": "model", "positions": "original"}
        for flag, ok in fits.items():
            if not ok(c):
                setattr(ns, flag, defaults.get(flag))
        if cfg is not None and c != "full":
            size_cache_from_mib(ns, cfg, dtype)
        factory = cache_factory_from_args(ns)
        layers = {}
        if cfg is not None:
            from engine.loading.checkpoint import model_args
            layers = layer_report(factory, model_args(cfg).n_layer, quiet=True)
        out[c] = (factory, prompt_settings(factory, {
            "cache_size": None if c == "full" else ns.cache_size, "kv_middle": ns.kv_middle,
            "positions": ns.positions, **layers}))
    if "streaming" not in out and any(c not in ("full", "streaming") for c in out):
        # The bookkeeping baseline: sink + window with the same budget, nothing scored or merged.
        ns = argparse.Namespace(**vars(args))
        ns.cache, ns.window, ns.kv_middle = "streaming", None, "model"
        ns.layer_pattern = ns.budget_pattern = None  # uniform: the plain baseline
        for o in policy_option_names():
            setattr(ns, o, None)
        if cfg is not None:
            size_cache_from_mib(ns, cfg, dtype)
        factory = cache_factory_from_args(ns)
        out["streaming"] = (factory, prompt_settings(factory, {
            "cache_size": ns.cache_size, "kv_middle": "model", "positions": ns.positions}))
        notes.append("streaming added as the baseline of the per-policy bookkeeping cost "
                     "(overhead_ms_per_token)")
    return out


def prompt_settings(factory, settings: dict) -> dict:
    """settings + how the cache reads a prompt (chunk and compression) and how often decode
    compresses (None for full)."""
    spec = factory.spec
    region = "chunk" in spec
    return dict(settings, prefill_chunk=spec.get("chunk"),
                prompt_compression=spec.get("prompt_compression", "chunked") if region else None,
                compression_interval=spec.get("compression_interval", 1) if region else None)


# ---- measurements --------------------------------------------------------------------------------

def last_level_cache_bytes() -> int:
    """Largest CPU cache from sysfs (Linux); 32 MiB when unknown."""
    best = 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        best = max(best, int(size.rstrip("KMG")) * mult)
    return best or 32 * 2**20


BANDWIDTH_PROBES = (3, 2)  # probes before and after the engine's rows


def probe_bytes(device: torch.device) -> int:
    """The buffer a bandwidth probe reads: far larger than the last-level cache, so that every
    pass streams from memory (CPU: 8x that cache, at least 256 MiB; CUDA: 1 GiB)."""
    return 2**30 if device.type == "cuda" else max(8 * last_level_cache_bytes(), 256 * 2**20)


def bandwidth_summary(probes: list) -> dict:
    """The figure the fractions are taken against (the median probe) and the probes' spread."""
    return {"machine_bandwidth_gbs": statistics.median(probes), "bandwidth_probes_gbs": probes,
            "bandwidth_spread_gbs": [min(probes), max(probes)]}


def machine_bandwidth_gbs(device: torch.device, trials: int = 20) -> float:
    """Streaming-read bandwidth: best of `trials` full reductions of a buffer of probe_bytes
    (on the CPU with the decode threads)."""
    if device.type == "cuda":
        x = torch.ones(probe_bytes(device) // 4, device=device)  # float32
        best = float("inf")
        for _ in range(trials + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            x.sum()
            end.record()
            torch.cuda.synchronize(device)
            best = min(best, start.elapsed_time(end) / 1e3)
        nbytes = x.numel() * x.element_size()
        del x
        return nbytes / best / 1e9
    nbytes = probe_bytes(device)
    # written once: every page is resident before timing; in the huge pages that the weights
    # are in (core.memory: the same read in 4 KiB pages is 10-30% slower on machine D)
    x = empty_on_huge_pages([((nbytes // 4,), torch.float32)])[0].fill_(1)
    best = float("inf")
    for _ in range(trials + 1):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the process's peak RSS (VmHWM), so each row has its own peak
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory(device: torch.device) -> int:
    """generate.py's figure (max_memory_allocated on CUDA, peak RSS on CPU), per row on Linux."""
    if device.type != "cuda":
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
    from generate import peak_memory_bytes
    return peak_memory_bytes(device)


def weight_bytes_per_token(model) -> int:
    """Weight bytes one decode step reads: every parameter and buffer of the model outside its
    caches (so quantized layers count their packed codes and scales, whatever the layout), except
    the embedding table, of which one row is read. A tied output head is its own module holding
    the same table, so the full table is still counted once. A linear that holds its weight in
    two layouts (quantize/dense.py) reads one of them a step."""
    from caches.base import KVCache
    total = 0
    for module in model.modules():
        if isinstance(module, KVCache):
            continue
        for name, t in [*module.named_parameters(recurse=False),
                        *module.named_buffers(recurse=False)]:
            if name == "plain" and getattr(module, "packed", None) is not None:
                continue  # oneDNN's layout is the one counted
            nbytes = t.numel() * t.element_size()
            total += nbytes // t.shape[0] if isinstance(module, torch.nn.Embedding) else nbytes
    return total


def kv_bytes_per_token(caches, filled: int) -> int:
    """K/V bytes attention reads per decode step: the full cache's `filled` positions (its static
    buffer's empty tail, masked, is not counted), or every K/V buffer (and int8 scales) of a
    compressing cache, which attends over all its slots. Index maps and statistics are not
    counted."""
    from caches import FullCache
    total = 0
    for cache in caches:
        kv = sum(b.numel() * b.element_size() for n, b in cache.named_buffers()
                 if n.split("_")[0] in ("k", "v"))
        total += kv * filled // cache.k.shape[2] if isinstance(cache, FullCache) else kv
    return total


def task_prompt(ids: list, context: int, task: str) -> list:
    """The context's ids: the text (continue), or half of it followed by its beginning again
    (copy: the model's continuation repeats what it has read)."""
    if task == "continue":
        return ids[:context]
    half = context // 2
    return ids[:half] + ids[:context - half]


def context_ids(tokenizer, n: int, text_file) -> list:
    path = Path(text_file) if text_file else next((p for p in TEXT_FILES if p.is_file()), None)
    if path is None or not path.is_file():
        raise UserError(f"--text_file {str(path)!r} does not exist")
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    chars = 8 * n + 1024  # encode only what is needed of a large corpus
    ids = tokenizer.encode(text[:chars])
    while len(ids) < n and chars < len(text):
        chars *= 2
        ids = tokenizer.encode(text[:chars])
    if not ids:
        raise UserError(f"{path} holds no text")
    while len(ids) < n:  # a short text is repeated (without a second BOS)
        ids = ids + tokenizer.encode(text, bos=False)
    return ids[:n]


def speculation_for(draft: str, model, max_seq_length: int, args):
    """The Speculation of a --speculate draft name, on the target `model`."""
    from caches import make_cache_factory
    from engine.runtime.speculative import ModelDraft, NgramDraft, Speculation
    if draft == "ngram":
        return Speculation(NgramDraft(args.ngram), args.speculate_k)
    if draft == "cache":
        cache = make_cache_factory(args.draft_cache, cache_size=args.draft_cache_size)
        return Speculation(ModelDraft(model, cache, max_seq_length,
                                      f"target over {args.draft_cache} {args.draft_cache_size}"),
                           args.speculate_k)
    from engine.loading.checkpoint import load_model
    from engine.loading.default_model import resolve_checkpoint
    ckpt = resolve_checkpoint(draft)
    small = load_model(ckpt, device=model.device, dtype=model.dtype)
    return Speculation(ModelDraft(small, make_cache_factory("full"), max_seq_length, ckpt.name),
                       args.speculate_k)


def streams_in(memory_gib: float, model, factory, length: int, dtype) -> int:
    """The most streams of `length` positions whose caches (every layer, what the rows share
    and the RoPE table included) fit in memory_gib."""
    from caches import cache_nbytes
    one, two = (cache_nbytes(model.args, b, length, dtype, factory) for b in (1, 2))
    per_stream = two - one
    return max(0, int((memory_gib * 2**30 - (one - per_stream)) // per_stream))


def bench_engine(model, policy, factory, settings, context, prompt, args, compiled, device,
                 batch=1, draft=None):
    from engine.runtime.generation import Generator, Session
    from engine.runtime.kernel_count import generated_code, step_launches
    if compiled:
        torch.compiler.reset()  # every row compiles from scratch: compile_s is its own
    reset_peak_memory(device)
    # +1: prefill makes the first token, then new_tokens decode steps are timed.
    compile_prefill = compiled and args.compile_prefill
    length = context + args.new_tokens + 1
    speculation = speculation_for(draft, model, length, args) if draft else None
    gen = Generator(model, length, batch_size=batch, make_cache=factory,
                    compile=compiled, compile_prefill=compile_prefill,
                    bake_weights=compiled and args.bake_weights, speculation=speculation)
    with generated_code() as codes:
        warm = gen.warmup(0.0, None)
    shared = batch > 1 and (args.read_once or args.memory_gib is not None)

    def run_once(ids, n):
        if not shared:
            return gen.generate(ids, n, temperature=0.0)
        gen.reset()
        gen.append_shared(ids)
        return Session.generate(gen, n, temperature=0.0)
    # A short untimed run warms the loop, the chunked-prefill graph and anything the warm-up
    # step did not reach, without paying for a long prefill (median of repeats absorbs the rest).
    # A compiled prompt that is not chunked (the full cache's, or one read in one shot) has a
    # graph per length bucket: the whole prompt.
    t = time.perf_counter()
    whole = gen.prefill_chunk is None or any(getattr(c, "one_shot", False) for c in gen.caches)
    run_once(prompt if compile_prefill and whole else prompt[:48], 3)
    if compile_prefill:  # that run compiled the prompt's graph
        warm += time.perf_counter() - t
    runs = [run_once(prompt, args.new_tokens + 1) for _ in range(args.repeats)]
    steps = statistics.median(g.tokens_per_s for g in runs)  # decode steps per second
    ttft = statistics.median(g.prefill_s for g in runs)
    w, kv = weight_bytes_per_token(model), kv_bytes_per_token(gen.caches, context)
    row = dict(engine="regionkv", policy=policy, **settings, context=context, batch_size=batch,
               compiled=compiled, compiled_prefill=compile_prefill,
               baked_weights=compiled and args.bake_weights, new_tokens=args.new_tokens,
               decode_tokens_per_s=batch * steps,
               decode_ms_per_token=1e3 / steps if steps else None,
               prefill_tokens_per_s=(1 if shared else batch) * context / ttft, ttft_s=ttft,
               compile_s=warm if compiled else None,
               kernels_per_step=step_launches(codes) if compiled else None,
               peak_memory_bytes=peak_memory(device), cache_bytes=gen.cache_bytes,
               weight_bytes_per_token=w, kv_bytes_per_token=kv, bytes_per_token=w + kv,
               bandwidth_gbs=(w + kv) * steps / 1e9, new_ids=runs[0].new_ids[0])
    if speculation is not None:
        stats = gen.spec_stats  # the last run's
        row.update(engine="speculative", draft=speculation.draft.describe(),
                   speculate_k=speculation.k, acceptance=stats.acceptance,
                   mean_accepted=stats.mean_accepted, verify_steps=stats.steps)
    del gen
    return row


def add_speedups(rows) -> None:
    """A speculative row's speedup over the plain row of the same settings (same process),
    and whether its greedy tokens are the plain row's."""
    key = ("policy", "context", "batch_size", "compiled")
    plain = {tuple(r[k] for k in key): r for r in rows if r["engine"] == "regionkv"}
    for r in rows:
        base = plain.get(tuple(r[k] for k in key))
        if r["engine"] == "speculative" and base:
            r["speedup"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            r["same_tokens"] = r["new_ids"] == base["new_ids"]


def add_equal_memory(rows) -> None:
    """--memory_gib: each row's streams and their tokens/s over `full`'s at the same context."""
    key = ("context", "compiled", "memory_gib")
    full = {tuple(r.get(k) for k in key): r for r in rows
            if r["policy"] == "full" and r["engine"] == "regionkv"}
    for r in rows:
        base = full.get(tuple(r.get(k) for k in key))
        if r.get("memory_gib") is not None and base and base["batch_size"]:
            r["streams_over_full"] = r["batch_size"] / base["batch_size"]
            r["throughput_over_full"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]


def add_overheads(rows) -> None:
    """Bookkeeping cost per step: ms/token minus that of streaming (sink + window, same budget)
    at the same context, or else of full at a context equal to the budget (same retained size),
    at the same batch size."""
    ms = {(r["policy"], r["cache_size"], r["context"], r["compiled"], r["batch_size"]):
          r["decode_ms_per_token"] for r in rows if r["engine"] == "regionkv"}
    for r in rows:
        r["overhead_ms_per_token"] = r["overhead_vs"] = None
        if r["policy"] == "full" or r["decode_ms_per_token"] is None:
            continue
        same = (r["compiled"], r["batch_size"])
        for base, key in (("streaming", ("streaming", r["cache_size"], r["context"], *same)),
                          ("full", ("full", None, r["cache_size"], *same))):
            if base != r["policy"] and ms.get(key):
                r["overhead_ms_per_token"] = r["decode_ms_per_token"] - ms[key]
                r["overhead_vs"] = f"{base}@{key[2]}"
                break


# ---- the transformers peer ----------------------------------------------------------------------

def peer_float_model(model, cfg, ckpt, dtype, device):
    """The engine's float weights (for a quantized checkpoint: those of its float source)."""
    if not cfg.get("quantization"):
        return model
    from engine.loading.checkpoint import load_model, read_config
    source = str(cfg.get("float_checkpoint") or cfg.get("source") or "")
    path = Path(source.split(":", 1)[1] if ":" in source and not Path(source).exists() else source)
    try:
        ok = path.is_dir() and not read_config(path).get("quantization")
    except UserError:
        ok = False
    if not ok:
        raise UserError(f"--peer needs float weights: {ckpt} is quantized and its float "
                        f"checkpoint {source!r} is not a float engine checkpoint here; quantize "
                        f"it again with quantize.py, or run --peer on the float checkpoint")
    return load_model(path, device=device, dtype=dtype)


def hf_llama(model, dtype, device):
    """transformers' LlamaForCausalLM holding exactly the engine's weights (RoPE layouts agree:
    the engine stores Q/K half-split, as Hugging Face does)."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    a = model.args
    rope = {"rope_type": "default", "rope_theta": a.rope_base}
    if a.rope_scaling:
        rope = dict(a.rope_scaling, rope_type="llama3", rope_theta=a.rope_base)
    hcfg = transformers.LlamaConfig(
        vocab_size=a.vocab_size, hidden_size=a.dim, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.n_layer, num_attention_heads=a.n_head, num_key_value_heads=a.n_kv_heads,
        head_dim=a.head_dim, rms_norm_eps=a.norm_eps, rope_parameters=rope,
        max_position_embeddings=a.max_position_embeddings, tie_word_embeddings=a.tie_embeddings,
        attention_bias=a.attention_bias, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    H, Hkv = a.n_head * a.head_dim, a.n_kv_heads * a.head_dim
    s = model.state_dict()
    state = {"model.embed_tokens.weight": s["tok_embeddings.weight"],
             "model.norm.weight": s["norm.weight"], "lm_head.weight": s["output.weight"]}
    for i in range(a.n_layer):
        e, h = f"layers.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias") if a.attention_bias else ("weight",):
            q, k, v = s[e + f"attention.wqkv.{kind}"].split([H, Hkv, Hkv], dim=0)
            state.update({h + f"self_attn.q_proj.{kind}": q, h + f"self_attn.k_proj.{kind}": k,
                          h + f"self_attn.v_proj.{kind}": v})
        if a.attention_bias:  # HF's Llama gives o_proj a bias too; the engine's wo has none
            state[h + "self_attn.o_proj.bias"] = torch.zeros(a.dim, dtype=dtype, device=device)
        state.update({
            h + "self_attn.o_proj.weight": s[e + "attention.wo.weight"],
            h + "mlp.gate_proj.weight": s[e + "feed_forward.w1.weight"],
            h + "mlp.up_proj.weight": s[e + "feed_forward.w3.weight"],
            h + "mlp.down_proj.weight": s[e + "feed_forward.w2.weight"],
            h + "input_layernorm.weight": s[e + "attention_norm.weight"],
            h + "post_attention_layernorm.weight": s[e + "ffn_norm.weight"]})
    with torch.device("meta"):  # no random init of weights that are replaced anyway
        hf = transformers.LlamaForCausalLM(hcfg)
    hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True, assign=True)
    hf.model.rotary_emb = LlamaRotaryEmbedding(hcfg).to(device)  # its buffers were on meta
    hf.generation_config.pad_token_id = 0
    hf.generation_config.eos_token_id = None
    return hf.to(device=device, dtype=dtype).eval()


def peer_caches(hf, policy: str, cache_size):
    """(label, factory of a fresh cache or None for transformers' default) for our policy, or
    (note, None) when transformers has no counterpart."""
    from transformers.cache_utils import Cache, DynamicSlidingWindowLayer, QuantizedCache
    n = hf.config.num_hidden_layers
    if policy == "full":
        return "dynamic", lambda: None
    if policy == "streaming":
        # transformers dropped SinkCache; its sliding-window layer keeps the last tokens only.
        return (f"sliding_window({cache_size}, no sink)",
                lambda: Cache(layers=[DynamicSlidingWindowLayer(sliding_window=cache_size)
                                      for _ in range(n)]))
    if policy == "quantized":
        if importlib.util.find_spec("hqq"):
            return "quantized(hqq, 8 bit)", lambda: QuantizedCache("hqq", hf.config, nbits=8)
        if importlib.util.find_spec("optimum") and importlib.util.find_spec("optimum.quanto"):
            return "quantized(quanto, 4 bit)", lambda: QuantizedCache("quanto", hf.config, nbits=4)
        return ("quantized(fp8; quanto and hqq backends not installed)",
                lambda: QuantizedCache("fp8", hf.config))
    return f"{policy}: transformers has no counterpart", None


def bench_peer(hf, policy, settings, context, prompt, args, device):
    from engine.runtime.generation import sync
    label, make = peer_caches(hf, policy, settings["cache_size"])
    if make is None:
        return None, label
    ids = torch.tensor([prompt], device=device)

    def generate(n):
        sync(device)
        t = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=make(),
                              do_sample=False, min_new_tokens=n, max_new_tokens=n)
        sync(device)
        return time.perf_counter() - t, out[0, ids.shape[1]:].tolist()

    reset_peak_memory(device)
    generate(2)  # warm-up
    n = args.new_tokens + 1
    t1, tn, new_ids = [], [], None
    for _ in range(args.repeats):
        t1.append(generate(1)[0])
        t, new_ids = generate(n)
        tn.append(t)
    ttft, decode_s = statistics.median(t1), statistics.median(tn) - statistics.median(t1)
    tps = (n - 1) / decode_s if decode_s > 0 else None
    return dict(engine="transformers", policy=policy, peer_cache=label, **settings,
                context=context, compiled=False, new_tokens=args.new_tokens,
                decode_tokens_per_s=tps, decode_ms_per_token=1e3 / tps if tps else None,
                prefill_tokens_per_s=context / ttft, ttft_s=ttft,
                peak_memory_bytes=peak_memory(device), new_ids=new_ids), None


# ---- the llama.cpp peer --------------------------------------------------------------------------

def gguf_weight_type(cfg: dict, dtype) -> str:
    """llama.cpp's weight format closest to what the engine runs."""
    quant = cfg.get("quantization")
    if quant:
        if quant.get("mode") != "int8":
            raise UserError(f"--peer llama.cpp compares float and int8 checkpoints; this one is "
                            f"{quant.get('mode')}")
        return "Q8_0"
    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[dtype]


def llama_cpp_gguf(model, cfg, ckpt, dtype, device, out_dir: Path):
    """(path, weight type) of the engine's weights written as a GGUF for llama.cpp."""
    from engine.loading.export import export_gguf
    source = str(cfg.get("source") or "")
    gguf_source = Path(source.removeprefix("gguf:"))
    if not source.startswith("gguf:") or not gguf_source.is_file():
        raise UserError(f"--peer llama.cpp takes its vocabulary and metadata from the GGUF a "
                        f"checkpoint was converted from; {ckpt} came from {source!r}")
    weight_type = gguf_weight_type(cfg, dtype)
    state = peer_float_model(model, cfg, ckpt, torch.float32, device).state_dict()
    name = f"{Path(ckpt).name}-{weight_type}.gguf"
    return export_gguf(state, model.args, gguf_source, out_dir / name, weight_type), weight_type


def bench_llama_cpp(llm, label, context, prompt, args):
    """Prefill the prompt, then new_tokens greedy decode steps, through llama.cpp's own eval;
    medians of --repeats, after a warm-up."""
    import llama_cpp
    import numpy as np

    def greedy() -> int:  # the last position's logits, read in place
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),))))

    def generate(ids, n):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        out = [greedy()]
        t1 = time.perf_counter()
        for _ in range(n):
            llm.eval(out[-1:])
            out.append(greedy())
        return t1 - t0, time.perf_counter() - t1, out

    reset_peak_memory(torch.device("cpu"))
    generate(prompt[:48], 3)
    runs = [generate(prompt, args.new_tokens) for _ in range(args.repeats)]
    ttft = statistics.median(r[0] for r in runs)
    decode_s = statistics.median(r[1] for r in runs)
    tps = args.new_tokens / decode_s
    return dict(engine="llama.cpp", policy="full", peer_cache=label, cache_size=None,
                kv_middle="model", positions="original", context=context, compiled=False,
                new_tokens=args.new_tokens, decode_tokens_per_s=tps,
                decode_ms_per_token=1e3 / tps, prefill_tokens_per_s=context / ttft,
                ttft_s=ttft, peak_memory_bytes=peak_memory(torch.device("cpu")),
                new_ids=runs[0][2])


def run_llama_cpp(model, cfg, ckpt, dtype, device, factories, prompt, args, notes) -> list:
    import tempfile

    import llama_cpp
    if device.type != "cpu":
        raise UserError("--peer llama.cpp runs on the CPU here; use --device cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="regionkv-peer-") as tmp:
        path, weight_type = llama_cpp_gguf(model, cfg, ckpt, dtype, device, Path(tmp))
        threads = torch.get_num_threads()
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(args.contexts) + args.new_tokens + 8,
                              n_threads=threads, n_threads_batch=threads, logits_all=False,
                              verbose=False)
        label = f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, GGUF {weight_type}"
        notes.append(f"peer: {label} (the engine's weights, written by engine/loading/export.py), "
                     f"{threads} threads; prefill = eval of the prompt ids, decode = "
                     f"{args.new_tokens} single-token evals with a greedy argmax, medians of "
                     f"{args.repeats}")
        for policy in factories:
            if policy != "full":
                notes.append(f"{policy}: llama.cpp has no counterpart (full cache only)")
                continue
            for ctx in args.contexts:
                rows.append(bench_llama_cpp(llm, label, ctx, prompt[:ctx], args))
        del llm
    return rows


def add_peer_ratios(rows, peer_rows) -> None:
    for p in peer_rows:
        p["engine_over_peer"], p["tokens_match"] = {}, None
        for r in (r for r in rows if r["engine"] == "regionkv"):
            if (r["policy"], r["context"], r["cache_size"], r["batch_size"]) != \
                    (p["policy"], p["context"], p["cache_size"], 1):
                continue
            mode = "compiled" if r["compiled"] else "eager"
            if r["decode_tokens_per_s"] and p["decode_tokens_per_s"]:
                p["engine_over_peer"][mode] = r["decode_tokens_per_s"] / p["decode_tokens_per_s"]
            if p["policy"] == "full":  # other policies keep different tokens by design
                p["tokens_match"] = bool(p["tokens_match"] in (None, True)
                                         and r["new_ids"] == p["new_ids"])


# ---- report ---------------------------------------------------------------------------------------

# The instruction sets that decide which CPU kernels run and how fast (and which crash: the
# machine pool mixes AVX2-only and AVX-512 CPUs).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_identity() -> dict:
    """Vendor, model name, family/model and the ISA flags that matter, from /proc/cpuinfo."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if key.strip() == "flags":
                break
    except OSError:
        return {}
    flags = set(fields.get("flags", "").split())
    out = {"cpu": fields.get("model name", platform.processor() or platform.machine()),
           "cpu_vendor": fields.get("vendor_id"),
           "cpu_family_model": f"{fields.get('cpu family')}/{fields.get('model')}",
           "isa": [f for f in ISA_FLAGS if f in flags]}
    return {k: v for k, v in out.items() if v is not None}


def machine_info(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "device": str(device), "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "cpu": platform.processor() or platform.machine()}
    info.update(cpu_identity())
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):  # other work on the machine shows up in the timings
        info["load_average_1min"] = os.getloadavg()[0]
    return info


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(result) -> None:
    m, mo = result["machine"], result["model"]
    print(f"{mo['checkpoint']} ({mo['dtype']}, quantization {mo['quantization']}) on "
          f"{m.get('gpu') or m['cpu']} ({', '.join(m.get('isa', [])) or 'ISA unknown'}), "
          f"{m['threads']} threads, torch {m['torch']}"
          + (f", load average {m['load_average_1min']:.1f} at start" if "load_average_1min" in m
             else ""))
    lo, hi = result["bandwidth_spread_gbs"]
    print(f"machine streaming-read bandwidth: {result['machine_bandwidth_gbs']:.1f} GB/s (the "
          f"median of {len(result['bandwidth_probes_gbs'])} probes, {lo:.1f} to {hi:.1f}; each "
          f"the best of 20 reads of {result['bandwidth_probe_bytes'] / 2**20:.0f} MiB, against "
          f"a last-level cache of {result['last_level_cache_bytes'] / 2**20:.0f} MiB)")
    head = (f"{'engine':<13}{'mode':<10}{'policy':<18}{'ctx':>6}{'B':>3}{'tok/s':>9}{'ms/tok':>8}"
            f"{'ovh ms':>8}{'prefill/s':>10}{'ttft s':>8}{'comp s':>8}{'MB/tok':>8}{'GB/s':>7}"
            f"{'%bw':>5}{'cacheMiB':>9}{'peakMiB':>8}{'kern':>6}")
    print(head)
    for r in result["rows"]:
        mode = ("compiled" + "+" * r["compiled_prefill"]) if r["compiled"] else "eager"
        print(f"{r['engine']:<13}{mode:<10}{r['policy']:<18}{r['context']:>6}{r['batch_size']:>3}"
              f"{fmt(r['decode_tokens_per_s'], '.1f'):>9}{fmt(r['decode_ms_per_token'], '.2f'):>8}"
              f"{fmt(r['overhead_ms_per_token'], '+.2f'):>8}{r['prefill_tokens_per_s']:>10.0f}"
              f"{r['ttft_s']:>8.3f}{fmt(r['compile_s'], '.1f'):>8}"
              f"{r['bytes_per_token'] / 1e6:>8.1f}{r['bandwidth_gbs']:>7.1f}"
              f"{100 * r['bandwidth_fraction']:>5.0f}{r['cache_bytes'] / 2**20:>9.1f}"
              f"{r['peak_memory_bytes'] / 2**20:>8.0f}{fmt(r['kernels_per_step'], 'd'):>6}")
        if r.get("memory_gib") is not None:
            versus = (f": {r['streams_over_full']:.1f}x full's streams, "
                      f"{r['throughput_over_full']:.2f}x its tokens/s"
                      if "streams_over_full" in r else "")
            print(f"{'':<13}  [{r['batch_size']} streams fit {r['memory_gib']:g} GiB{versus}]")
        if "draft" in r:
            same = {True: "greedy tokens match", False: "greedy tokens DIFFER"}.get(
                r.get("same_tokens"), "")
            print(f"{'':<13}  [{r['draft']}, k {r['speculate_k']}: {r.get('speedup', 0):.2f}x "
                  f"the plain row, {r['acceptance']:.0%} accepted, {r['mean_accepted']:.2f} "
                  f"tokens a step; {same}]")
    for p in result["peer_rows"]:
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in p["engine_over_peer"].items()) or "-"
        match = {None: "", True: ", greedy tokens match", False: ", greedy tokens DIFFER"}
        print(f"{p['engine']:<13}{'eager':<10}{p['policy']:<18}{p['context']:>6}{1:>3}"
              f"{fmt(p['decode_tokens_per_s'], '.1f'):>9}{fmt(p['decode_ms_per_token'], '.2f'):>8}"
              f"{'':>8}{p['prefill_tokens_per_s']:>10.0f}{p['ttft_s']:>8.3f}   "
              f"[{p['peer_cache']}; engine/peer {ratios}{match[p['tokens_match']]}]")
    for note in result["notes"]:
        print(f"note: {note}")


# ---- main ---------------------------------------------------------------------------------------

def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.list_caches:
        print(list_caches())
        return
    notes = []
    if args.bake_weights and args.compile == "off":
        raise UserError("--bake_weights bakes the weights into compiled rows' decode step: give "
                        "--compile on or both with it")
    if args.compile_prefill and args.compile == "off":
        raise UserError("--compile_prefill compiles the prompt of compiled rows: give --compile "
                        "on or both with it")
    if args.memory_gib is not None and args.batch_size != [1]:
        raise UserError("--memory_gib sets each policy's batch (the streams that fit); drop "
                        "--batch_size")
    if args.speculate:
        if args.batch_size != [1] or args.memory_gib is not None:
            raise UserError("--speculate times one stream: use --batch_size 1, without "
                            "--memory_gib")
        if any(c != "full" for c in args.cache) and args.compression_interval is None:
            from caches import DEFAULT_CHUNK
            args.compression_interval = (args.prefill_chunk or DEFAULT_CHUNK) - args.speculate_k
            notes.append(f"--speculate: compressing caches compress every "
                         f"{args.compression_interval} positions in every row (the lossless "
                         f"reference)")
    policy_factories(args, [])  # bad cache flags fail before loading
    transformers = None
    if args.peer:
        module = {"transformers": "transformers", "llama.cpp": "llama_cpp"}[args.peer]
        if importlib.util.find_spec(module) is None:  # the peers: benchmark only, never the engine
            raise UserError(f"--peer {args.peer} needs the {module} package: "
                            f"{PEER_INSTALL[args.peer]}")
        try:  # now, not after the engine's rows: a package installed without its dependencies
            peer = importlib.import_module(module)
        except (ImportError, OSError) as e:
            raise UserError(f"--peer {args.peer}: the {module} package is installed but does "
                            f"not import ({e}); reinstall it with its dependencies: "
                            f"{PEER_INSTALL[args.peer]}") from None
        if args.peer == "transformers":
            transformers = peer
    from engine.loading.checkpoint import load_model, read_config
    from engine.loading.default_model import resolve_checkpoint
    from engine.loading.tokenizer import load_tokenizer
    from engine.runtime.tp import start as start_tp

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    tp = start_tp(device)  # under torchrun: figures are per rank (engine/runtime/tp.py)
    if tp and args.peer:
        raise UserError("--peer runs one process; run it without torchrun")
    ckpt = resolve_checkpoint(args.checkpoint_path)
    cfg = read_config(ckpt)
    factories = policy_factories(args, notes, cfg, dtype)
    limit = cfg["model"]["max_position_embeddings"]
    too_long = [c for c in args.contexts if c + args.new_tokens + 1 > limit]
    if too_long:
        raise UserError(f"context {too_long[0]} + {args.new_tokens} new tokens + 1 exceeds the "
                        f"model's {limit} positions; use --contexts up to "
                        f"{limit - args.new_tokens - 1}")
    prompt = context_ids(load_tokenizer(ckpt), max(args.contexts), args.text_file)

    def say(msg):
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    machine = dict(machine_info(device), ranks=tp.world if tp else 1)
    model = load_model(ckpt, device=device, dtype=dtype, tp=tp)
    say("measuring the machine's streaming-read bandwidth...")
    probes = [machine_bandwidth_gbs(device) for _ in range(BANDWIDTH_PROBES[0])]
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.compile]
    rows = []
    for compiled in modes:
        for policy, (factory, settings) in factories.items():
            for ctx in args.contexts:
                batches = args.batch_size
                if args.memory_gib is not None:
                    batches = [streams_in(args.memory_gib, model, factory,
                                          ctx + args.new_tokens + 1, dtype)]
                    if not batches[0]:
                        notes.append(f"{policy} at context {ctx}: one stream's caches exceed "
                                     f"--memory_gib {args.memory_gib:g}; no row")
                        continue
                for batch in batches:
                    say(f"{'compiled' if compiled else 'eager'} {policy} at context {ctx}, "
                        f"batch {batch}...")
                    text = task_prompt(prompt, ctx, args.task)
                    rows.append(bench_engine(model, policy, factory, settings, ctx, text,
                                             args, compiled, device, batch))
                    rows[-1]["memory_gib"] = args.memory_gib
                    for draft in args.speculate if policy in args.cache else ():
                        say(f"  speculating with {draft}...")
                        rows.append(bench_engine(model, policy, factory, settings, ctx, text,
                                                 args, compiled, device, batch, draft))
    say("measuring the machine's streaming-read bandwidth again...")
    probes += [machine_bandwidth_gbs(device) for _ in range(BANDWIDTH_PROBES[1])]
    measured = bandwidth_summary(probes)
    bandwidth = measured["machine_bandwidth_gbs"]
    for r in rows:
        r["bandwidth_fraction"] = r["bandwidth_gbs"] / bandwidth
    add_overheads(rows)
    add_speedups(rows)
    add_equal_memory(rows)

    peer_rows = []
    if transformers is not None:
        hf = hf_llama(peer_float_model(model, cfg, ckpt, dtype, device), dtype, device)
        notes.append(f"peer: transformers {transformers.__version__} LlamaForCausalLM "
                     f"({hf.config._attn_implementation} attention) holding the engine's weights; "
                     f"model.generate(do_sample=False, min_new_tokens=max_new_tokens); decode "
                     f"tokens/s = {args.new_tokens} / (time of {args.new_tokens + 1} new tokens "
                     f"- time of 1), medians of {args.repeats}; ttft = time of 1 new token")
        for policy, (_, settings) in factories.items():
            for ctx in args.contexts:
                say(f"transformers {policy} at context {ctx}...")
                row, note = bench_peer(hf, policy, settings, ctx, prompt[:ctx], args, device)
                if row:
                    peer_rows.append(row)
                elif note not in notes:
                    notes.append(note)
    if args.peer == "llama.cpp":
        peer_rows = run_llama_cpp(model, cfg, ckpt, dtype, device, factories, prompt, args, notes)
    add_peer_ratios(rows, peer_rows)

    result = {
        "machine": machine, **measured, "bandwidth_probe_bytes": probe_bytes(device),
        "last_level_cache_bytes": last_level_cache_bytes(),
        "model": {"checkpoint": str(ckpt), "source": cfg.get("source"), "dtype":
                  str(dtype).removeprefix("torch."), "quantization": cfg.get("quantization"),
                  "parameters": sum(p.numel() for p in model.parameters())},
        "settings": {"new_tokens": args.new_tokens, "repeats": args.repeats,
                     "batch_sizes": args.batch_size, "memory_gib": args.memory_gib,
                     "contexts": args.contexts, "policies": args.cache},
        "rows": rows, "peer_rows": peer_rows, "notes": notes,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    run(main)
