"""Resumable evaluation grids: policies x cache sizes x corpora (+ passkey, RULER-style tasks).

    python eval.py sweep --config configs/results.toml [--out DIR] [--render-only]

Every finished cell is one JSONL line (`DIR/results.jsonl`), appended with a single write and
fsync'ed, keyed by every setting that affects it; a rerun skips the cells it finds, and a line
cut short by a crash is dropped. The corpora of one (policy, cache size) stream through one
batched decode step. Then `DIR/report.md` and the PNG plots are rendered from the JSONL.

Config (TOML or JSON), every key optional except `policies` and `corpora`:

    out_dir = "results/NAME"        # default results/<config file stem>
    checkpoint_path = "..."         # default: the embedded default model
    dtype = "float32"   device = "cpu"   compile = true   seed = 0
    max_tokens = 4000               # tokens per corpus (max_tokens - 1 scored)
    corpora = ["wiki", "kjv"]       # data/corpora/NAME.txt (corpus_dir = "..." to move it)
    cache_sizes = [256, 1024]       # `full` runs once per corpus, whatever the sizes; a size
                                    # "6.45MiB" is a memory budget (caches.fit_to_bytes: the
                                    # largest regions whose bytes fit), measured in
    size_dtype = "bfloat16"         # this dtype's bytes (default: the run's dtype)
    policies = ["full", "weightedkv", "weightedkv+int8", {cache = "a2sf", forgetting_factor = 0.1}]
    curve_policies = ["weightedkv", "weightedkv-evict", "full"]
    [passkey]                       # optional
    corpus = "wiki"  lengths = [1024, 2048]  depths = [0.1, 0.5, 0.9]  trials = 5  seed = 0
    cache_sizes = [...]  policies = [...]   # default: the top-level ones
    new_tokens = 8  batch_size = 0          # 0: all trials x depths of a cell in one batch
    [ruler]                         # optional: synthetic tasks of engine/evaluation/ruler.py
    corpus = "wiki"  lengths = [1024, 2048]  trials = 2  seed = 0   # corpus: the haystack
    tasks = ["niah_multikey", "niah_multivalue", "variable_tracking", "common_words"]  # default
    cache_sizes = [...]  policies = [...]   # default: the top-level ones
    new_tokens = 16  batch_size = 0         # new_tokens: every task's (default: each its own)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Optional

from core.errors import UserError
from engine.loading.files import check_writable, write_atomic

# A policy table's keys: the region's settings, then every option a policy declares.
REGION_KEYS = ("kv_middle", "positions", "sink", "window", "prefill_chunk", "prompt_compression",
               "observation_window", "budget_pattern", "layer_pattern")


def policy_keys() -> tuple:
    from caches import all_options
    return REGION_KEYS + tuple(all_options())
TOP_KEYS = ("out_dir", "checkpoint_path", "dtype", "device", "compile", "seed", "max_tokens",
            "corpora", "corpus_dir", "cache_sizes", "size_dtype", "policies", "curve_policies",
            "passkey", "ruler")
PASSKEY_KEYS = ("corpus", "text_file", "lengths", "depths", "trials", "seed", "cache_sizes",
                "policies", "new_tokens", "batch_size")
RULER_KEYS = ("corpus", "text_file", "tasks", "lengths", "trials", "seed", "cache_sizes",
              "policies", "new_tokens", "batch_size")
DEFAULT_CURVE_POLICIES = ("weightedkv", "weightedkv-evict", "full")


# ---------------------------------------------------------------------------------------------
# Policies: "NAME", "NAME+int8" or a table {cache = "NAME", option = value, ...}

@dataclass(frozen=True)
class PolicySpec:
    cache: str
    options: tuple = ()  # sorted (name, value) pairs that differ from the defaults

    @property
    def label(self) -> str:
        opts = dict(self.options)
        text = self.cache + ("+int8" if opts.get("kv_middle") == "int8" else "")
        rest = [f"{k}={v}" for k, v in self.options if k != "kv_middle"]
        return text + (f"({','.join(rest)})" if rest else "")

    @property
    def is_full(self) -> bool:
        return self.cache == "full"

    def sizes(self, sizes: list) -> list:
        """The budgets this policy runs at: `full` once (None), a policy that keeps every token
        (quantized) at token budgets only (it has no regions for a memory budget to size)."""
        from caches import keeps_every_token
        if self.is_full:
            return [None]
        if keeps_every_token(self.cache):
            return [s for s in sizes if not isinstance(s, str)]
        return list(sizes)

    def regions(self, size, shape) -> tuple:
        """(cache_size, sink, window) of a budget: tokens as given, or a "NMiB" budget sized by
        caches.fit_to_bytes for shape = (model args, dtype whose bytes count)."""
        opts = dict(self.options)
        if not isinstance(size, str):
            return size, opts.get("sink"), opts.get("window")
        from caches import DEFAULT_CHUNK, fit_to_bytes
        if shape is None:
            raise UserError(f"policy {self.label}: a budget in MiB needs the model's shape")
        chunk = opts.pop("prefill_chunk", DEFAULT_CHUNK)
        opts.pop("positions", None)
        sink, window, middle = fit_to_bytes(self.cache, int(mib_budget(size) * 2**20), *shape,
                                            chunk=chunk, **opts)
        return sink + window + middle, sink, window

    def factory(self, cache_size, seed: int = 0, shape=None):
        from caches import DEFAULT_CHUNK, make_cache_factory
        opts = dict(self.options)
        if cache_size is not None and not self.is_full:
            cache_size, opts["sink"], opts["window"] = self.regions(cache_size, shape)
        common = dict(kv_middle=opts.pop("kv_middle", "model"),
                      positions=opts.pop("positions", "original"))
        if self.is_full:
            region = [k for k in ("sink", "window", "prefill_chunk", "prompt_compression")
                      if k in opts]
            if region:
                raise UserError(f"policy {self.label}: {', '.join(region)} apply to compressing "
                                f"policies, not full")
            return make_cache_factory("full", **common, **opts)
        return make_cache_factory(self.cache, cache_size=cache_size, sink=opts.pop("sink", None),
                                  window=opts.pop("window", None),
                                  chunk=opts.pop("prefill_chunk", DEFAULT_CHUNK), seed=seed,
                                  **common, **opts)

    def slots(self, cache_size, shape=None) -> int:
        """Slots the cache holds (budget + prefill staging + spare): the RoPE table must cover
        them in --positions cache mode."""
        from caches import DEFAULT_CHUNK
        tokens = self.regions(cache_size, shape)[0]
        return tokens + dict(self.options).get("prefill_chunk", DEFAULT_CHUNK) + 1


def mib_budget(size) -> Optional[float]:
    """6.45 for a size "6.45MiB", None for a size in tokens."""
    if isinstance(size, str) and size.endswith("MiB"):
        try:
            value = float(size[:-3])
        except ValueError:
            return None
        return value if math.isfinite(value) and value > 0 else None
    return None


def parse_policy(entry, where: str) -> PolicySpec:
    from caches import POLICIES, layer_policies
    if isinstance(entry, str):
        name, _, suffix = entry.partition("+")
        if suffix not in ("", "int8"):
            raise UserError(f"{where}: policy {entry!r}: the only suffix is +int8 "
                            f"(an INT8 middle)")
        opts = {"kv_middle": "int8"} if suffix else {}
    elif isinstance(entry, dict):
        opts = dict(entry)
        name = opts.pop("cache", None)
        if not isinstance(name, str):
            raise UserError(f"{where}: a policy table needs cache = \"NAME\", got {entry!r}")
        keys = policy_keys()
        unknown = sorted(set(opts) - set(keys))
        if unknown:
            raise UserError(f"{where}: policy {name!r} has unknown key(s) {', '.join(unknown)} "
                            f"(known: cache, {', '.join(keys)})")
    else:
        raise UserError(f"{where}: a policy is a name or a table, got {entry!r}")
    unknown = [p for p in layer_policies(name) if p not in POLICIES]
    if unknown:
        raise UserError(f"{where}: unknown policy {unknown[0]!r}; choose one of "
                        f"{', '.join(POLICIES)}")
    defaults = {"kv_middle": "model", "positions": "original", "prompt_compression": "chunked",
                "budget_pattern": "uniform"}
    opts = {k: v for k, v in opts.items() if defaults.get(k, object()) != v}
    return PolicySpec(name, tuple(sorted(opts.items())))


def cli_policies(text: str, sizes: list, seed: int) -> list:
    """--cache "full,weightedkv+int8": the specs, each checked to build at every size."""
    specs = [parse_policy(name.strip(), "--cache") for name in text.split(",") if name.strip()]
    if not specs:
        raise UserError("--cache needs at least one policy")
    for spec in specs:
        for size in sizes:
            spec.factory(size, seed)
    return specs


# ---------------------------------------------------------------------------------------------
# Config

@dataclass(kw_only=True)
class GridConfig:
    """What a passkey and a ruler grid share: lengths x policies x budgets over a haystack."""
    lengths: list
    trials: int
    seed: int = 0
    corpus: Optional[str] = None
    text_file: Optional[str] = None
    policies: list = field(default_factory=list)
    cache_sizes: list = field(default_factory=list)
    batch_size: int = 0


@dataclass(kw_only=True)
class PasskeyConfig(GridConfig):
    depths: list
    trials: int = 5
    new_tokens: int = 8


@dataclass(kw_only=True)
class RulerConfig(GridConfig):
    tasks: list = field(default_factory=list)  # default: every task of engine/evaluation/ruler.py
    trials: int = 2
    new_tokens: Optional[int] = None  # None: each task's own (engine.evaluation.ruler.TASKS)

    def __post_init__(self):
        from engine.evaluation.ruler import TASKS
        self.tasks = list(self.tasks or TASKS)

    def tokens(self, task: str) -> int:
        from engine.evaluation.ruler import TASKS
        return self.new_tokens or TASKS[task].new_tokens

    @property
    def needs_haystack(self) -> bool:
        from engine.evaluation.ruler import TASKS
        return any(TASKS[t].haystack for t in self.tasks)


@dataclass
class SweepConfig:
    path: Path
    out_dir: Path
    policies: list
    corpora: list
    cache_sizes: list = field(default_factory=lambda: [256])
    max_tokens: int = 4000
    checkpoint_path: Optional[str] = None
    dtype: Optional[str] = None
    size_dtype: Optional[str] = None
    device: Optional[str] = None
    compile: bool = False
    seed: int = 0
    corpus_dir: Optional[str] = None
    curve_policies: list = field(default_factory=lambda: list(DEFAULT_CURVE_POLICIES))
    passkey: Optional[PasskeyConfig] = None
    ruler: Optional[RulerConfig] = None


def _check(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise UserError(f"{where}: {message}")


def _int_list(value, where, key, minimum=1) -> list:
    _check(isinstance(value, list) and value and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value),
        where, f"{key} must be a non-empty list of integers >= {minimum}, got {value!r}")
    return list(value)


def _pos_int(value, where, key, minimum=1) -> int:
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= minimum, where,
           f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _sizes(value, where, key) -> list:
    """Token budgets (integers >= 2) and memory budgets ("6.45MiB")."""
    _check(isinstance(value, list) and value and all(
        (isinstance(v, int) and not isinstance(v, bool) and v >= 2) or mib_budget(v) is not None
        for v in value) and len(set(value)) == len(value),
        where, f"{key} must be a list of distinct token budgets (integers >= 2) or memory "
               f"budgets like \"6.45MiB\", got {value!r}")
    return list(value)


def _policies(value, where) -> list:
    _check(isinstance(value, list) and value, where, "policies must be a non-empty list")
    specs = [parse_policy(v, where) for v in value]
    seen = set()
    for s in specs:
        _check(s.label not in seen, where, f"policy {s.label} is listed twice")
        seen.add(s.label)
    return specs


def load_config(path, out_dir=None) -> SweepConfig:
    from engine.cli import DTYPES
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"config file {where!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config {where!r}: {e}") from None
    try:
        if path.suffix == ".json":
            raw = json.loads(text)
        else:
            import tomllib
            raw = tomllib.loads(text)
    except (ValueError, json.JSONDecodeError) as e:  # tomllib.TOMLDecodeError is a ValueError
        raise UserError(f"cannot parse {where}: {str(e).splitlines()[0]}") from None
    _check(isinstance(raw, dict), where, "the config must be a table/object")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    _check(not unknown, where, f"unknown key(s) {', '.join(unknown)} (known: "
                               f"{', '.join(TOP_KEYS)})")
    _check("policies" in raw and "corpora" in raw, where, "needs policies and corpora")
    corpora = raw["corpora"]
    _check(isinstance(corpora, list) and corpora and all(isinstance(c, str) for c in corpora)
           and len(set(corpora)) == len(corpora), where,
           f"corpora must be a list of distinct names, got {corpora!r}")
    cfg = SweepConfig(path=path, out_dir=Path(out_dir or raw.get("out_dir")
                                              or Path("results") / path.stem),
                      policies=_policies(raw["policies"], where), corpora=list(corpora))
    if "cache_sizes" in raw:
        cfg.cache_sizes = _sizes(raw["cache_sizes"], where, "cache_sizes")
    if "max_tokens" in raw:
        cfg.max_tokens = _pos_int(raw["max_tokens"], where, "max_tokens", 2)
    for key in ("checkpoint_path", "device", "corpus_dir"):
        if key in raw:
            _check(isinstance(raw[key], str), where, f"{key} must be a string")
            setattr(cfg, key, raw[key])
    for key in ("dtype", "size_dtype"):
        if key in raw:
            _check(raw[key] in DTYPES, where, f"{key} must be one of {', '.join(DTYPES)}, "
                                              f"got {raw[key]!r}")
            setattr(cfg, key, raw[key])
    if "compile" in raw:
        _check(isinstance(raw["compile"], bool), where, "compile must be true or false")
        cfg.compile = raw["compile"]
    if "seed" in raw:
        cfg.seed = _pos_int(raw["seed"], where, "seed", 0)
    if "curve_policies" in raw:
        cfg.curve_policies = [parse_policy(p, where).label for p in raw["curve_policies"]]
    if "passkey" in raw:
        cfg.passkey = _passkey_config(raw["passkey"], cfg, f"{where} [passkey]")
    if "ruler" in raw:
        cfg.ruler = _ruler_config(raw["ruler"], cfg, f"{where} [ruler]")
    # Every (policy, size) must build before anything runs: a bad cell fails now, not in hour 3
    # (budgets in MiB need the model's shape: run_sweep checks them before the first cell).
    for spec in cfg.policies:
        for size in cfg.cache_sizes:
            if not isinstance(size, str):
                spec.factory(size, cfg.seed)
    return cfg


def _section(raw, keys: tuple, where: str) -> None:
    _check(isinstance(raw, dict), where, "must be a table")
    unknown = sorted(set(raw) - set(keys))
    _check(not unknown, where, f"unknown key(s) {', '.join(unknown)} (known: {', '.join(keys)})")
    _check("lengths" in raw, where, "needs lengths")


def _decode_grid(raw, grid, cfg: SweepConfig, where: str, haystack: bool = True):
    """What a passkey or ruler section shares: its haystack text and its (policy, size) grid,
    every cell checked to build."""
    if haystack or "corpus" in raw or "text_file" in raw:
        _check(("corpus" in raw) != ("text_file" in raw), where, "give one of corpus or "
                                                                  "text_file")
    grid.corpus, grid.text_file = raw.get("corpus"), raw.get("text_file")
    grid.policies = _policies(raw["policies"], where) if "policies" in raw else cfg.policies
    grid.cache_sizes = (_int_list(raw["cache_sizes"], where, "cache_sizes", 2) if "cache_sizes"
                        in raw else [s for s in cfg.cache_sizes if not isinstance(s, str)])
    for spec in grid.policies:
        for size in grid.cache_sizes:
            spec.factory(size, cfg.seed)
    return grid


def _passkey_config(raw, cfg: SweepConfig, where: str) -> PasskeyConfig:
    _section(raw, PASSKEY_KEYS, where)
    depths = raw.get("depths", [0.1, 0.5, 0.9])
    _check(isinstance(depths, list) and depths and all(
        isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in depths),
        where, f"depths must be a list of numbers in [0, 1], got {depths!r}")
    pk = PasskeyConfig(lengths=_int_list(raw["lengths"], where, "lengths", 16),
                       depths=[float(d) for d in depths],
                       trials=_pos_int(raw.get("trials", 5), where, "trials"),
                       seed=_pos_int(raw.get("seed", 0), where, "seed", 0),
                       new_tokens=_pos_int(raw.get("new_tokens", 8), where, "new_tokens"),
                       batch_size=_pos_int(raw.get("batch_size", 0), where, "batch_size", 0))
    return _decode_grid(raw, pk, cfg, where)


def _ruler_config(raw, cfg: SweepConfig, where: str) -> RulerConfig:
    from engine.evaluation.ruler import parse_tasks
    _section(raw, RULER_KEYS, where)
    tasks = raw.get("tasks")
    if tasks is not None:
        _check(isinstance(tasks, list) and all(isinstance(t, str) for t in tasks), where,
               f"tasks must be a list of task names, got {tasks!r}")
        tasks = parse_tasks(tasks, where)
    rc = RulerConfig(lengths=_int_list(raw["lengths"], where, "lengths", 16), tasks=tasks,
                     trials=_pos_int(raw.get("trials", 2), where, "trials"),
                     seed=_pos_int(raw.get("seed", 0), where, "seed", 0),
                     new_tokens=(_pos_int(raw["new_tokens"], where, "new_tokens")
                                 if "new_tokens" in raw else None),
                     batch_size=_pos_int(raw.get("batch_size", 0), where, "batch_size", 0))
    return _decode_grid(raw, rc, cfg, where, haystack=rc.needs_haystack)


# ---------------------------------------------------------------------------------------------
# The results file

def key_id(key: dict) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


class ResultStore:
    """Append-only JSONL of finished cells; each row has a "key" dict of its settings."""

    def __init__(self, path):
        self.path = Path(path)

    def rows(self) -> list:
        """Every complete row, in file order. A truncated last line (a crash mid-write) is cut
        off the file, so the next append starts on a fresh line; unparsable lines are skipped."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())
            print(f"note: dropped a truncated last line of {self.path}", file=sys.stderr)
            data = data[:keep]
        out = []
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                print(f"note: skipping unreadable line {n} of {self.path}", file=sys.stderr)
                continue
            if isinstance(row, dict):
                out.append(row)
        return out

    def check_writable(self) -> "ResultStore":
        """Fail before the first cell, not after it, when results could not be appended (rows
        are appended in place, so the file itself must be writable too)."""
        check_writable(self.path, "results file")
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise UserError(f"results file {self.path} is not a writable file; pass another "
                            f"path")
        return self

    def done(self) -> set:
        return {key_id(r["key"]) for r in self.rows() if isinstance(r.get("key"), dict)}

    def append(self, row: dict) -> None:
        """One line, one write, then fsync: a crash leaves whole lines or one truncated tail."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(row) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)


def ids_sha1(ids: list) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Running

def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Setup:
    """Device, dtype, checkpoint, tokenizer and context resolved up front; the model itself is
    loaded on first use (a fully resumed sweep never loads it)."""

    def __init__(self, cfg_like):
        from engine.loading.checkpoint import model_args, read_config
        from engine.cli import resolve_device, resolve_dtype
        from engine.loading.default_model import resolve_checkpoint
        from engine.loading.tokenizer import load_tokenizer
        self.device = resolve_device(cfg_like.device)
        self.dtype = resolve_dtype(cfg_like.dtype, self.device)
        self.checkpoint = str(resolve_checkpoint(cfg_like.checkpoint_path))
        # The default model is keyed by name, not by where this machine keeps it, so a results
        # file carries over to another machine (or REGIONKV_HOME) and resumes there.
        self.checkpoint_key = cfg_like.checkpoint_path or f"default:{Path(self.checkpoint).name}"
        self.args = model_args(read_config(self.checkpoint))
        self.context = self.args.max_position_embeddings
        self.tokenizer = load_tokenizer(self.checkpoint)
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from engine.loading.checkpoint import load_model
            self._model = load_model(self.checkpoint, device=self.device, dtype=self.dtype)
        return self._model

    def base_key(self, compile: bool, seed: int) -> dict:
        return {"checkpoint": self.checkpoint_key, "dtype": str(self.dtype).removeprefix("torch."),
                "device": self.device.type, "compile": compile, "seed": seed}


def _reset_compiler() -> None:
    # Each cell builds new caches; a fresh dynamo state keeps recompiles under the cache limit.
    import torch
    torch._dynamo.reset()


def run_sweep(cfg: SweepConfig) -> dict:
    """Run every missing cell of cfg, append them to cfg.out_dir/results.jsonl, render the
    report. Returns counts: cells_run, cells_skipped, scored_tokens, wall_s, tokens_per_s."""
    import torch
    from tqdm import tqdm

    from caches import build_caches
    from engine.evaluation.perplexity import (batched_full_perplexity, batched_streaming_perplexity,
                                   compile_step, corpus_path,
                                   downsample_curve, encode_prefix, read_text, score_step,
                                   warmup)

    t_start = time.perf_counter()
    # Fail on missing corpora before loading anything.
    paths = {c: corpus_path(c, cfg.corpus_dir) for c in cfg.corpora}
    store = ResultStore(cfg.out_dir / "results.jsonl").check_writable()
    env = Setup(cfg)
    tokenizer, device = env.tokenizer, env.device
    streams = {}
    for c, p in paths.items():
        ids = encode_prefix(tokenizer, read_text(p, f"corpus {c}"), cfg.max_tokens)
        if len(ids) < cfg.max_tokens:
            raise UserError(f"corpus {c} ({p}) has only {len(ids)} tokens, fewer than max_tokens "
                            f"{cfg.max_tokens}; lower max_tokens or use a longer text")
        streams[c] = ids
    haystack = None
    if cfg.passkey is not None:  # bad lengths or a short haystack fail now, not after the ppl
        haystack = _haystack_text(cfg.passkey, cfg.corpus_dir)
        check_passkey_prompts(tokenizer, cfg.passkey, haystack, env.context)
    ruler_haystack = None
    if cfg.ruler is not None:
        if cfg.ruler.needs_haystack:
            ruler_haystack = _haystack_text(cfg.ruler, cfg.corpus_dir)
        check_ruler_prompts(tokenizer, cfg.ruler, ruler_haystack, env.context)
    for spec in cfg.policies:
        positions = dict(spec.options).get("positions", "original")
        if cfg.max_tokens > env.context and (spec.is_full or positions == "original"):
            raise UserError(f"max_tokens {cfg.max_tokens} exceeds the model's context of "
                            f"{env.context} for {spec.label}; lower max_tokens")
    from engine.cli import DTYPES
    size_dtype = DTYPES[cfg.size_dtype] if cfg.size_dtype else env.dtype
    shape = (env.args, size_dtype)
    for spec in cfg.policies:  # memory budgets: each fits its policy, or fails now
        for size in spec.sizes(cfg.cache_sizes):
            if isinstance(size, str):
                spec.factory(size, cfg.seed, shape)
    done = store.done()
    base = env.base_key(cfg.compile, cfg.seed)

    def cell_key(spec, size, corpus):
        key = {**base, "kind": "ppl", "max_tokens": cfg.max_tokens, "corpus": corpus,
               "ids_sha1": ids_sha1(streams[corpus]), "policy": spec.cache,
               "options": dict(spec.options), "cache_size": size}
        if isinstance(size, str):  # a memory budget: the dtype its bytes are counted in
            key["size_dtype"] = str(size_dtype).removeprefix("torch.")
        return key

    groups = []  # (spec, size, corpora still to run)
    for spec in cfg.policies:
        for size in spec.sizes(cfg.cache_sizes):
            todo = [c for c in cfg.corpora if key_id(cell_key(spec, size, c)) not in done]
            if todo:
                groups.append((spec, size, todo))
    n_cells = sum(len(g[2]) for g in groups)
    skipped = sum(len(cfg.corpora) * len(s.sizes(cfg.cache_sizes))
                  for s in cfg.policies) - n_cells
    _log(f"sweep {cfg.path.name}: {n_cells} cell(s) to run, {skipped} already in {store.path}")

    scored = cells_run = 0
    for spec, size, todo in groups:
        model = env.model
        name = spec.label + ("" if size is None else f"@{size}")
        caches = build_caches(model, len(todo), max(cfg.max_tokens, 0 if size is None
                                                    else spec.slots(size, shape)),
                              spec.factory(size, cfg.seed, shape))
        step, compile_s = score_step, 0.0
        if cfg.compile and not spec.is_full:  # full is scored by causal chunks, uncompiled
            _reset_compiler()
            step = compile_step(score_step, model, caches, len(todo))
            compile_s = warmup(model, caches, step, len(todo))
        bar = tqdm(total=cfg.max_tokens - 1, unit="tok", unit_scale=len(todo),
                   desc=f"{name} [{','.join(todo)}]", leave=False,
                   disable=not sys.stderr.isatty())

        def progress(n, nlls):
            if n % 64 == 0 or n == cfg.max_tokens - 1:
                bar.update(n - bar.n)
                bar.set_postfix(ppl=f"{math.exp(nlls.mean().item()):.2f}")

        if spec.is_full:
            results = batched_full_perplexity(model, caches, [streams[c] for c in todo],
                                              progress=progress)
        else:
            results = batched_streaming_perplexity(model, caches, [streams[c] for c in todo],
                                                   step, progress)
        bar.close()
        nbytes = sum(c.nbytes for c in caches) // len(todo)
        for corpus, r in zip(todo, results):
            row = {"key": cell_key(spec, size, corpus), "label": spec.label,
                   "policy": spec.cache, "cache_size": size, "corpus": corpus,
                   "nll": r.nll, "ppl": r.ppl, "tokens": r.tokens, "cache_bytes": nbytes,
                   "regions": None if spec.is_full else [
                       int(getattr(caches[0], a, 0) or 0) for a in ("sink", "window", "middle")],
                   "tokens_per_s": r.tokens * len(todo) / r.seconds,
                   "stream_tokens_per_s": r.tokens_per_s, "batch": len(todo),
                   "seconds": r.seconds, "compile_s": compile_s,
                   "curve": downsample_curve(r.curve),
                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
            store.append(row)
            cells_run += 1
            scored += r.tokens
            _log(f"[{cells_run}/{n_cells}] {name} {corpus}: ppl {r.ppl:.3f}, "
                 f"{nbytes / 2**20:.2f} MiB, {row['tokens_per_s']:.1f} tok/s (batch {len(todo)})")

    ppl_wall = time.perf_counter() - t_start
    pk_cells = pk_tokens = 0
    if cfg.passkey is not None:
        pk_cells, pk_tokens = run_passkey_grid(
            env, cfg.passkey, store, base,
            haystack_text=haystack, compile=cfg.compile)
    pk_wall = time.perf_counter() - t_start - ppl_wall
    ruler_cells = ruler_tokens = 0
    if cfg.ruler is not None:
        ruler_cells, ruler_tokens = run_ruler_grid(env, cfg.ruler, store, base, ruler_haystack,
                                                   compile=cfg.compile)
    wall = time.perf_counter() - t_start
    ruler_wall = wall - ppl_wall - pk_wall
    summary = {"kind": "run", "config": str(cfg.path), "cells_run": cells_run,
               "cells_skipped": skipped, "scored_tokens": scored, "passkey_cells": pk_cells,
               "passkey_tokens": pk_tokens, "ruler_cells": ruler_cells,
               "ruler_tokens": ruler_tokens, "wall_s": round(wall, 3),
               "tokens_per_s": scored / ppl_wall if ppl_wall else 0.0,
               "ppl_wall_s": round(ppl_wall, 3),
               "passkey_tokens_per_s": pk_tokens / pk_wall if pk_cells else 0.0,
               "ruler_tokens_per_s": ruler_tokens / ruler_wall if ruler_cells else 0.0,
               **base,
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if cells_run or pk_cells or ruler_cells:
        store.append(summary)
    _log(f"sweep throughput: {cells_run} ppl cell(s), {scored} scored tokens in "
         f"{ppl_wall:.1f} s = {summary['tokens_per_s']:.1f} tokens/s; {pk_cells} passkey "
         f"cell(s), {pk_tokens} tokens in {pk_wall:.1f} s = "
         f"{summary['passkey_tokens_per_s']:.1f} tokens/s; {ruler_cells} ruler cell(s), "
         f"{ruler_tokens} tokens in {ruler_wall:.1f} s = "
         f"{summary['ruler_tokens_per_s']:.1f} tokens/s; {skipped} skipped; {wall:.1f} s in all")
    render(cfg)
    return summary


def _haystack_text(grid, corpus_dir) -> str:
    """The haystack of a passkey or ruler section."""
    from engine.evaluation.perplexity import corpus_path, read_text
    if grid.corpus is not None:
        return read_text(corpus_path(grid.corpus, corpus_dir), f"corpus {grid.corpus}")
    return read_text(grid.text_file)


def _haystack_pool(tokenizer, haystack_text: Optional[str], lengths: list) -> list:
    # Enough text that trial offsets differ: four times the longest prompt.
    from engine.evaluation.perplexity import encode_prefix
    if haystack_text is None:
        return []
    return encode_prefix(tokenizer, haystack_text, 4 * max(lengths))


def _check_context(what: str, length: int, new_tokens: int, context: int) -> None:
    if length + new_tokens > context:
        raise UserError(f"{what} length {length} + {new_tokens} new tokens exceeds the model's "
                        f"context of {context}; use `lengths` of at most {context - new_tokens}")


def check_passkey_prompts(tokenizer, pk: PasskeyConfig, haystack_text: str,
                          context: int) -> None:
    from engine.evaluation.passkey import build_cell_prompts
    _check_context("passkey", max(pk.lengths), pk.new_tokens, context)
    pool = _haystack_pool(tokenizer, haystack_text, pk.lengths)
    for length in pk.lengths:
        build_cell_prompts(tokenizer, pool, length, pk.depths[:1], 1, pk.seed, max(pk.lengths))


def check_ruler_prompts(tokenizer, rc: RulerConfig, haystack_text: Optional[str],
                        context: int) -> None:
    """Every task, length and trial builds and fits the context, before anything runs."""
    from engine.evaluation.ruler import build_cell_prompts
    longest = max(rc.tasks, key=rc.tokens)  # the longest answer bounds every length
    _check_context(longest, max(rc.lengths), rc.tokens(longest), context)
    pool = _haystack_pool(tokenizer, haystack_text, rc.lengths)
    for task in rc.tasks:
        for length in rc.lengths:
            build_cell_prompts(tokenizer, pool, task, length, rc.trials, rc.seed,
                               max(rc.lengths))


def cell_tokens(row: dict) -> int:
    """Prompt and answer tokens of a passkey or ruler cell."""
    return len(row["answers"]) * (row["length"] + row["key"]["new_tokens"])


def run_cells(kind: str, cells: list, store: Optional[ResultStore], describe,
              compile: bool = False, on_cell=None) -> tuple:
    """cells: (key, fields, run, name) of batched greedy-decode cells; run() returns the cell's
    results. Runs those whose key is not in store, appends each as {"key": key, **fields,
    **results} to store (if given), passes it to on_cell and logs describe(row). Returns
    (cells run, prompt + new tokens)."""
    done = store.done() if store is not None else set()
    todo = [c for c in cells if key_id(c[0]) not in done]
    _log(f"{kind}: {len(todo)} cell(s) to run")
    n_tokens = 0
    for i, (key, fields, run, name) in enumerate(todo, 1):
        if compile:
            _reset_compiler()
        row = {"key": key, **fields, **run(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if store is not None:
            store.append(row)
        if on_cell is not None:
            on_cell(row)
        n_tokens += cell_tokens(row)
        _log(f"[{kind} {i}/{len(todo)}] {name}: {describe(row)}, {row['seconds']:.1f} s")
    return len(todo), n_tokens


def _grid_cells(grid, base: dict, kind: str, tasks: list, key_fields, run) -> list:
    """The cells of a passkey or ruler grid for run_cells: policy x size (full once) x task
    (passkey: the one task None) x length; run(spec, size, task, length) runs one."""
    cells = []
    for spec in grid.policies:
        for size in ([None] if spec.is_full else grid.cache_sizes):
            for task in tasks:
                for length in grid.lengths:
                    key = {**base, "kind": kind, "policy": spec.cache,
                           "options": dict(spec.options), "cache_size": size, "length": length,
                           **key_fields(task, length)}
                    fields = {"label": spec.label, "policy": spec.cache, "cache_size": size,
                              **({"task": task} if task is not None else {}), "length": length}
                    name = (spec.label + ("" if size is None else f"@{size}")
                            + ("" if task is None else f" {task}") + f" L={length}")
                    cells.append((key, fields, partial(run, spec, size, task, length), name))
    return cells


def run_passkey_grid(env: Setup, pk: PasskeyConfig, store: Optional[ResultStore],
                     base: dict, haystack_text: str, compile: bool = False,
                     on_cell=None) -> tuple:
    """Run every missing (policy, size, length) cell, all trials x depths batched; append each
    to store (if given) and pass it to on_cell. Returns (cells run, prompt + new tokens)."""
    from engine.evaluation.passkey import build_cell_prompts, run_cell

    pool = _haystack_pool(env.tokenizer, haystack_text, pk.lengths)
    fields = {"haystack": pk.corpus or pk.text_file, "haystack_sha1": ids_sha1(pool),
              "depths": pk.depths, "trials": pk.trials, "passkey_seed": pk.seed,
              "new_tokens": pk.new_tokens}

    def run(spec, size, _, length):
        prompts = build_cell_prompts(env.tokenizer, pool, length, pk.depths, pk.trials, pk.seed,
                                     max(pk.lengths))
        return run_cell(env.model, env.tokenizer, spec.factory(size, base.get("seed", 0)),
                        prompts, pk.new_tokens, compile=compile,
                        batch_size=pk.batch_size or None)

    def describe(row):
        depths = " ".join(f"{d}:{a:.0%}" for d, a in row["by_depth"].items())
        return f"accuracy {row['accuracy']:.0%} ({depths})"

    cells = _grid_cells(pk, base, "passkey", [None], lambda *_: fields, run)
    return run_cells("passkey", cells, store, describe, compile, on_cell)


def run_ruler_grid(env: Setup, rc: RulerConfig, store: Optional[ResultStore], base: dict,
                   haystack_text: Optional[str], compile: bool = False, on_cell=None) -> tuple:
    """Run every missing (policy, size, task, length) cell, its trials batched; append each to
    store (if given) and pass it to on_cell. Returns (cells run, prompt + new tokens)."""
    from engine.evaluation.ruler import TASKS, build_cell_prompts, run_cell

    pool = _haystack_pool(env.tokenizer, haystack_text, rc.lengths)
    # Every policy reads the same prompts; their hash keys the cells, so a change of haystack,
    # seed or generator runs them afresh.
    prompts = {(task, length): build_cell_prompts(env.tokenizer, pool, task, length, rc.trials,
                                                  rc.seed, max(rc.lengths))
               for task in rc.tasks for length in rc.lengths}

    def key_fields(task, length):
        return {"task": task, "trials": rc.trials, "ruler_seed": rc.seed,
                "new_tokens": rc.tokens(task),
                "haystack": (rc.corpus or rc.text_file) if TASKS[task].haystack else None,
                "prompts_sha1": ids_sha1([p.ids for p in prompts[(task, length)]])}

    def run(spec, size, task, length):
        return run_cell(env.model, env.tokenizer, spec.factory(size, base.get("seed", 0)),
                        prompts[(task, length)], rc.tokens(task), compile=compile,
                        batch_size=rc.batch_size or None)

    cells = _grid_cells(rc, base, "ruler", rc.tasks, key_fields, run)
    return run_cells("ruler", cells, store, lambda row: f"score {row['score']:.0%}", compile,
                     on_cell)


# ---------------------------------------------------------------------------------------------
# Rendering

def in_grid(row: dict, kind: str, labels, sizes, lengths) -> bool:
    return (row.get("key", {}).get("kind") == kind and row["label"] in labels
            and row["cache_size"] in sizes and row["length"] in lengths)


def in_passkey_grid(row: dict, labels, sizes, lengths) -> bool:
    return in_grid(row, "passkey", labels, sizes, lengths)


def passkey_accuracy(rows: list, labels, sizes, lengths, depths) -> dict:
    """{(label, size): {length: {depth: accuracy}}} from passkey rows (last row wins)."""
    acc = {}
    for r in rows:
        if not in_passkey_grid(r, labels, sizes, lengths):
            continue
        cell = acc.setdefault((r["label"], r["cache_size"]), {}).setdefault(r["length"], {})
        for d, a in r["by_depth"].items():
            if float(d) in depths:
                cell[float(d)] = a
    return acc


def ruler_scores(rows: list, labels, sizes, tasks, lengths) -> dict:
    """{task: {(label, size): {length: mean score}}} from ruler rows (last row wins)."""
    out = {}
    for r in rows:
        if in_grid(r, "ruler", labels, sizes, lengths) and r.get("task") in tasks:
            out.setdefault(r["task"], {}).setdefault((r["label"], r["cache_size"]),
                                                     {})[r["length"]] = r["score"]
    return out


def expand_full(acc: dict, sizes: list) -> dict:
    """`full` ignores the budget: show its row under every size."""
    out = dict(acc)
    for (label, size), v in acc.items():
        if size is None:
            for s in sizes:
                out.setdefault((label, s), v)
    return out


def render(cfg: SweepConfig) -> list:
    """Markdown table + PNG plots from the JSONL rows that match cfg. Returns written paths."""
    from engine.evaluation import plots

    store = ResultStore(cfg.out_dir / "results.jsonl")
    rows = store.rows()
    labels = [s.label for s in cfg.policies]
    ppl_rows = {}
    for r in rows:
        k = r.get("key", {})
        if (k.get("kind") == "ppl" and r.get("label") in labels and r.get("corpus") in cfg.corpora
                and k.get("max_tokens") == cfg.max_tokens
                and (r.get("cache_size") is None or r.get("cache_size") in cfg.cache_sizes)):
            ppl_rows[(r["label"], r["cache_size"], r["corpus"])] = r  # last row wins
    runs = [r for r in rows if r.get("kind") == "run"]
    written = []
    sizes = cfg.cache_sizes

    def cell(label, size, corpus):
        return ppl_rows.get((label, size, corpus)) or ppl_rows.get((label, None, corpus))

    reference = {c: ppl_rows[(lb, None, c)]["ppl"] for lb in labels for c in cfg.corpora
                 if lb == "full" and (lb, None, c) in ppl_rows}
    lines = [f"# Sweep: {cfg.path.name}", ""]
    any_row = next(iter(ppl_rows.values()), None)
    if any_row:
        k = any_row["key"]
        lines += [f"Checkpoint `{Path(k['checkpoint']).name}`, {k['dtype']}, {k['device']}, "
                  f"compile {'on' if k['compile'] else 'off'}; streaming perplexity over the "
                  f"first {cfg.max_tokens} tokens of each corpus ({cfg.max_tokens - 1} scored). "
                  f"Cache MiB: one stream's cache. tok/s: scored tokens per second of the "
                  f"batched step (all corpora of a cell group in one batch). `full` keeps every "
                  f"token whatever the size (the reference row); Δ is relative to it. The "
                  f"best policy held to each budget is in bold. A size \"NMiB\" is a memory "
                  f"budget in {cfg.size_dtype or k['dtype']} bytes; [N] after its MiB is the "
                  f"tokens the policy holds in it.", ""]
    head = ["policy"]
    for c in cfg.corpora:
        for s in sizes:
            head += [f"{c} {s} ppl", f"{c} {s} MiB", f"{c} {s} tok/s"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    # The best policy of each column in bold: among those held to the budget (not full, not a
    # policy that keeps every token).
    from caches import keeps_every_token
    budgeted = [s.label for s in cfg.policies if not keeps_every_token(s.cache)]
    best = {}
    for c in cfg.corpora:
        for s in sizes:
            got = [(ppl_rows[(lb, s, c)]["ppl"], lb) for lb in budgeted if (lb, s, c) in ppl_rows]
            if got:
                best[(s, c)] = min(got)[1]
    for label in labels:
        cells = [label]
        for c in cfg.corpora:
            for s in sizes:
                r = cell(label, s, c)
                if r is None:
                    cells += ["-", "-", "-"]
                    continue
                delta = (f" ({(r['ppl'] / reference[c] - 1) * 100:+.2f}%)"
                         if c in reference and label != "full" else "")
                value = f"**{r['ppl']:.3f}**" if best.get((s, c)) == label else f"{r['ppl']:.3f}"
                held = r.get("regions") if r.get("cache_size") == s else None
                tokens = f" [{sum(v or 0 for v in held)}]" if isinstance(s, str) and held else ""
                cells += [f"{value}{delta}", f"{r['cache_bytes'] / 2**20:.2f}{tokens}",
                          f"{r['tokens_per_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    pk, rc = cfg.passkey, cfg.ruler
    pk_labels = [s.label for s in pk.policies] if pk is not None else []
    pk_rows = [r for r in rows if pk is not None
               and in_passkey_grid(r, pk_labels, [None] + pk.cache_sizes, pk.lengths)]
    rc_labels = [s.label for s in rc.policies] if rc is not None else []
    rc_rows = [r for r in rows if rc is not None and r.get("task") in rc.tasks
               and in_grid(r, "ruler", rc_labels, [None] + rc.cache_sizes, rc.lengths)]
    lines += _throughput_lines(ppl_rows.values(), pk_rows, rc_rows, runs)

    if ppl_rows:
        ppl = {(lb, s, c): r["ppl"] for (lb, s, c), r in ppl_rows.items() if s is not None}
        bar_labels = [lb for lb in labels if lb != "full"]
        written.append(plots.ppl_bars(ppl, reference, bar_labels, sizes, cfg.corpora,
                                      cfg.out_dir / "ppl.png"))
        curve_labels = [lb for lb in cfg.curve_policies if lb in labels]
        curves = {k: r["curve"] for k, r in ppl_rows.items() if k[0] in curve_labels}
        written.append(plots.curves(curves, curve_labels, sizes, cfg.corpora,
                                    cfg.out_dir / "curves.png"))
        nbytes = {(lb, s): r["cache_bytes"] for (lb, s, c), r in ppl_rows.items()}
        written.append(plots.cache_bytes(nbytes, labels, sizes, cfg.out_dir / "cache_bytes.png"))
        lines += ["", "![ppl](ppl.png)", "", "![running log-ppl](curves.png)", "",
                  "![cache bytes](cache_bytes.png)"]

    if pk is not None:
        acc = expand_full(passkey_accuracy(rows, pk_labels, [None] + pk.cache_sizes, pk.lengths,
                                           pk.depths), pk.cache_sizes)
        if acc:
            lines += ["", "## Passkey retrieval", "",
                      f"Accuracy over {pk.trials} trial(s) per depth; haystack "
                      f"`{pk.corpus or pk.text_file}`; greedy, {pk.new_tokens} new tokens.", ""]
            lines += passkey_table(acc, pk_labels, pk.cache_sizes, pk.lengths, pk.depths)
            written.append(plots.passkey_heatmaps(acc, pk_labels, pk.cache_sizes, pk.lengths,
                                                  pk.depths, cfg.out_dir / "passkey.png"))
            lines += ["", "![passkey](passkey.png)"]
    if rc is not None:
        scores = {t: expand_full(acc, rc.cache_sizes) for t, acc in
                  ruler_scores(rows, rc_labels, [None] + rc.cache_sizes, rc.tasks,
                               rc.lengths).items()}
        if scores:
            tokens = ", ".join(f"{t} {rc.tokens(t)}" for t in rc.tasks)
            lines += ["", "## RULER-style synthetic tasks", "",
                      f"Mean score over {rc.trials} trial(s) per cell (the fraction of the "
                      f"expected keys, values, variables or words in the answer); haystack "
                      f"`{rc.corpus or rc.text_file}`; greedy, new tokens: {tokens}."]
            for task in rc.tasks:
                if task in scores:
                    lines += ["", f"### {task}", ""]
                    lines += ruler_table(scores[task], rc_labels, rc.cache_sizes, rc.lengths)
            written.append(plots.ruler_heatmaps(scores, [t for t in rc.tasks if t in scores],
                                                rc_labels, rc.cache_sizes, rc.lengths,
                                                cfg.out_dir / "ruler.png"))
            lines += ["", "![ruler](ruler.png)"]
    report = cfg.out_dir / "report.md"
    write_atomic(report, "\n".join(lines) + "\n")
    written.append(report)
    _log(f"wrote {', '.join(str(p) for p in written)}")
    return written


def _throughput_lines(ppl_rows, passkey_rows, ruler_rows, runs) -> list:
    """The sweep's own speed, summed over the cells in the report (a resumed sweep's cells come
    from several runs): scored tokens per second of perplexity, prompt + answer tokens per
    second of passkey and of the ruler tasks."""
    out = []
    # The corpora of a batched cell share its seconds: each row carries the batch's time.
    ppl_s = sum(r["seconds"] / r["batch"] for r in ppl_rows)
    ppl_tokens = sum(r["tokens"] for r in ppl_rows)
    if ppl_s:
        out.append(f"perplexity, {ppl_tokens:,} scored tokens in {ppl_s / 3600:.2f} h of cell "
                   f"time = {ppl_tokens / ppl_s:.1f} tokens/s")
    for what, cells in (("passkey", passkey_rows), ("ruler", ruler_rows)):
        seconds = sum(r["seconds"] for r in cells)
        tokens = sum(cell_tokens(r) for r in cells)
        if seconds:
            out.append(f"{what}, {tokens:,} prompt and answer tokens in {seconds / 3600:.2f} h "
                       f"= {tokens / seconds:.1f} tokens/s")
    if not out:
        return []
    line = ("Sweep throughput (every cell of this report, compile time included): "
            + "; ".join(out) + ".")
    if runs:
        last = runs[-1]
        ruler = f", {last['ruler_cells']} ruler" if last.get("ruler_cells") else ""
        line += (f" Last run: {last['cells_run']} perplexity and {last.get('passkey_cells', 0)} "
                 f"passkey{ruler} cell(s) in {last['wall_s']:.0f} s, {last['cells_skipped']} "
                 f"resumed.")
    return ["", line]


def score_table(acc: dict, labels, sizes, columns: list) -> list:
    """Markdown rows: acc[(label, size)] -> {column: score in [0, 1]}; columns: (header,
    column) pairs; one row per policy and budget (full once), then the mean of its cells."""
    head = ["policy", "cache"] + [h for h, _ in columns] + ["mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels:
        for size in sizes[:1] if label == "full" else sizes:  # full ignores the budget
            cell = acc.get((label, size))
            if cell is None:
                continue
            vals = [cell.get(c) for _, c in columns]
            got = [v for v in vals if v is not None]
            mean = f"{sum(got) / len(got):.0%}" if got else "-"
            lines.append("| " + " | ".join([label, "all" if label == "full" else str(size)] + [
                "-" if v is None else f"{v:.0%}" for v in vals] + [mean]) + " |")
    return lines


def passkey_table(acc: dict, labels, sizes, lengths, depths) -> list:
    flat = {k: {(n, d): v for n, by_depth in cell.items() for d, v in by_depth.items()}
            for k, cell in acc.items()}
    return score_table(flat, labels, sizes, [(f"L={n} d={d:g}", (n, d)) for n in lengths
                                             for d in depths])


def ruler_table(acc: dict, labels, sizes, lengths) -> list:
    """acc[(label, size)][length] -> mean score of one task."""
    return score_table(acc, labels, sizes, [(f"L={n}", n) for n in lengths])
