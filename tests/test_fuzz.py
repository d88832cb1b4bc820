"""Damaged and hostile inputs: a property-based harness (hypothesis) that drives the CLIs and the
loaders with generated values on a tiny checkpoint, in process, and holds them to the contract:
exit status 0 or 2, never an uncaught exception (a traceback), never a half-written output,
never more memory than a stated bound.

CI runs REGIONKV_FUZZ_EXAMPLES (default 20) examples per property; a longer run by hand:
    REGIONKV_FUZZ_EXAMPLES=500 python -m pytest -q tests/test_fuzz.py
"""
import contextlib
import io
import json
import os
import resource

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import write_tiny_checkpoint
from core.errors import UserError

EXAMPLES = int(os.environ.get("REGIONKV_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 50,
                suppress_health_check=list(HealthCheck))
MEMORY_BOUND = 2 * 2**30  # the harness may raise this process's peak RSS by at most 2 GiB
TINY = dict(vocab_size=49152, n_layer=2, dim=64, n_head=4, n_kv_heads=2, head_dim=16,
            intermediate_size=128, max_position_embeddings=256, tie_embeddings=True)


@pytest.fixture(scope="module")
def tiny_ckpt(default_checkpoint, tmp_path_factory):
    """A real engine checkpoint directory: the default model's tokenizer, a tiny random model."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", default_checkpoint,
                                 **TINY)


@pytest.fixture(scope="module", autouse=True)
def memory_bound():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    yield
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert after - before < MEMORY_BOUND, (before, after)


def script(name: str):
    """A CLI script as a module (quantize.py is shadowed by the quantize/ package)."""
    import importlib.util

    from conftest import ROOT
    spec = importlib.util.spec_from_file_location(f"cli_{name}", ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(main, argv) -> tuple[int, str]:
    """A CLI's main through engine.cli.run, in process: (exit status, stdout + stderr). Any
    exception other than SystemExit escapes and fails the property with its example."""
    from engine.cli import run
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            run(lambda: main(argv))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue()


def check(code: int, output: str) -> None:
    assert code in (0, 2), (code, output[-2000:])
    assert "Traceback" not in output, output[-2000:]
    if code == 2:  # one line that starts with error:
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, output[-2000:]


# Values at and beyond each flag's range, wrong types, empty and odd strings.
def ints(lo, hi, huge=(0, -1, 2**31, 10**12, 10**30)):
    return st.one_of(st.integers(lo, hi).map(str), st.sampled_from(huge).map(str),
                     st.sampled_from(["", "x", "1.5", "1e3", " 7", "٣"]))


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.floats(-2, 3).map(str), st.sampled_from(["", "nan", "-inf", "1,5", "0x10"]))
WORDS = st.one_of(st.text(max_size=12), st.sampled_from(["", "full", "h2o", "int8", "cache"]))
POLICY = st.sampled_from(["full", "streaming", "quantized", "h2o", "tova", "a2sf", "weightedkv",
                          "weightedkv-evict", "cam", "lagkv", "knorm", "keydiff", "nope", ""])
CACHE_FLAGS = {
    "--cache": POLICY,
    "--cache_size": ints(-3, 300, huge=(0, 1, 2, 10**8, 10**12)),
    "--cache_mib": st.one_of(FLOATS, st.sampled_from(["0.01", "0.3", "1e9", "1e300"])),
    "--sink": ints(-3, 40),
    "--window": ints(-3, 300, huge=(0, 10**9)),
    "--kv_middle": st.sampled_from(["model", "int8", "fp4", ""]),
    "--positions": st.sampled_from(["auto", "original", "cache", "rank", ""]),
    "--prefill_chunk": ints(-3, 64, huge=(0, 10**9)),
    "--prompt_compression": st.sampled_from(["chunked", "bulk", "snap", ""]),
    "--forgetting_factor": FLOATS,
    "--merge_span": ints(-3, 40),
    "--lag": ints(-3, 80),
    "--lag_keep_ratio": FLOATS,
}
GENERATE_FLAGS = {
    **CACHE_FLAGS,
    # valid values stay small: the harness is about input, not about generating for hours
    "--max_new_tokens": ints(-3, 24, huge=(0, -5)),
    "--temperature": FLOATS,
    "--top_k": ints(-3, 100, huge=(0, 10**12)),
    "--num_samples": ints(-2, 2, huge=(0,)),
    "--seed": ints(-5, 5, huge=(2**63, -2**63 - 1, 10**30)),
    "--dtype": st.sampled_from(["float32", "bfloat16", "float16", "int8", ""]),
    "--device": st.sampled_from(["cpu", "cuda", "cuda:7", "tpu", ""]),
    "--max_seq_length": ints(-3, 600, huge=(0, 10**9)),
    "--prompt": st.one_of(st.text(max_size=40), st.text(min_size=900, max_size=1200)),
    "--system": st.text(max_size=20),
}


def argv_from(flags: dict, switches=()):
    """Some of `flags` with generated values, plus some of the on/off switches."""
    chosen = st.lists(st.sampled_from(sorted(flags)), unique=True, max_size=7)
    return chosen.flatmap(lambda names: st.tuples(
        st.tuples(*[flags[n] for n in names]), st.lists(st.sampled_from(switches) if switches
                                                         else st.nothing(), unique=True))
        .map(lambda vs: [x for n, v in zip(names, vs[0]) for x in (n, v)] + list(vs[1])))


@FUZZ
@given(argv=argv_from(GENERATE_FLAGS, switches=("--json", "--chat", "--list_caches")))
def test_generate_cli(tiny_ckpt, argv):
    generate = script("generate")
    check(*run_main(generate.main, ["--checkpoint_path", str(tiny_ckpt), *argv]))


@FUZZ
@given(argv=argv_from({**CACHE_FLAGS, "--max_tokens": ints(-3, 40, huge=(0, 1, 10**9)),
                       "--seed": ints(-5, 5, huge=(10**30,))}, switches=("--json",)),
       text=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_eval_ppl_cli(tiny_ckpt, tmp_path_factory, argv, text):
    eval_cli = script("eval")
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_bytes(text)
    check(*run_main(eval_cli.main, ["ppl", "--checkpoint_path", str(tiny_ckpt),
                                    "--text_file", str(path), *argv]))


@FUZZ
@given(argv=argv_from({**CACHE_FLAGS, "--contexts": st.text(max_size=12),
                       "--batch_size": st.text(max_size=8), "--new_tokens": ints(-3, 8),
                       "--repeats": ints(-3, 3), "--compile": WORDS}))
def test_bench_arguments(argv):
    # The parser and the per-policy factories (a full bench run measures the machine: seconds).
    bench = script("bench")

    def main(a):
        args = bench.build_parser().parse_args(a)
        bench.policy_factories(args, [])
    check(*run_main(main, argv))


@FUZZ
@given(mode=st.sampled_from(["int8", "int4", "int2", ""]),
       groupsize=st.one_of(st.none(), ints(-3, 300, huge=(0, 32, 64, 10**9))),
       out_name=st.sampled_from(["q", "q/nested", "", "."]))
def test_quantize_cli_writes_whole_checkpoints_or_nothing(tiny_ckpt, tmp_path_factory, mode,
                                                          groupsize, out_name):
    quantize = script("quantize")
    root = tmp_path_factory.mktemp("quant")
    out = root / out_name if out_name else root / "default"
    argv = ["--checkpoint_path", str(tiny_ckpt), "--mode", mode, "--out", str(out)]
    if groupsize is not None:
        argv += ["--groupsize", groupsize]
    code, output = run_main(quantize.main, argv)
    check(code, output)
    leftovers = [p.name for p in root.rglob(".*")]
    assert not leftovers, leftovers  # no staging directory survives
    if code == 0:
        from engine.loading.checkpoint import load_model
        assert load_model(out).args.n_layer == 2  # whole and loadable


def with_file(ckpt, d, name: str, data: bytes):
    """A copy of checkpoint `ckpt` in `d` (links) whose file `name` holds `data`."""
    for f in ckpt.iterdir():
        if f.name != name:
            os.symlink(f, d / f.name)
    (d / name).write_bytes(data)
    return d


def loads_or_one_error(d) -> None:
    from engine.loading.checkpoint import load_model
    from engine.loading.tokenizer import load_tokenizer
    for load in (load_model, load_tokenizer):
        try:
            load(d)
        except UserError as e:
            assert "\n" not in str(e)


def json_values():
    return st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                                  st.floats(allow_nan=False), st.text(max_size=6)),
                        lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(sorted(TINY) + ["norm_eps", "rope_base",
                                                               "rope_scaling", "attention_bias",
                                                               "extra"]),
                               json_values(), min_size=1, max_size=3),
       top=st.sampled_from(["model", "format", "architecture", "quantization", "tokenizer",
                            None]),
       top_value=json_values())
def test_config_loader(tiny_ckpt, tmp_path_factory, changes, top, top_value):
    # Any JSON in config.json: the model loads (the values happen to be valid) or one UserError.
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    cfg["model"].update(changes)
    if top is not None:
        cfg[top] = top_value
    loads_or_one_error(with_file(tiny_ckpt, tmp_path_factory.mktemp("cfg"), "config.json",
                                 json.dumps(cfg).encode()))


@FUZZ
@given(cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)),
                                           max_size=4),
       which=st.sampled_from(["model.safetensors", "config.json", "tokenizer.json"]))
def test_damaged_files(tiny_ckpt, tmp_path_factory, cut, flips, which):
    # Truncated or corrupted bytes in any checkpoint file: a load or one UserError.
    data = bytearray((tiny_ckpt / which).read_bytes()[:int(cut * (tiny_ckpt / which).stat().st_size)])
    for where, byte in flips:
        if data:
            data[int(where * (len(data) - 1))] = byte
    loads_or_one_error(with_file(tiny_ckpt, tmp_path_factory.mktemp("bytes"), which, bytes(data)))


@FUZZ
@given(cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)),
                                           max_size=4))
def test_damaged_session_files(tiny_ckpt, tmp_path_factory, cut, flips):
    from caches import make_cache_factory
    from engine.loading.checkpoint import load_model
    from engine.runtime.generation import Session
    model = load_model(tiny_ckpt)
    d = tmp_path_factory.mktemp("session")
    s = Session(model, make_cache_factory("weightedkv", cache_size=16, chunk=8), 64)
    s.append([1, 2, 3, 4, 5])
    s.save(d / "s.safetensors")
    data = bytearray((d / "s.safetensors").read_bytes())
    data = data[:max(1, int(cut * len(data)))]
    for where, byte in flips:
        data[int(where * (len(data) - 1))] = byte
    (d / "bad.safetensors").write_bytes(bytes(data))
    try:
        Session.load(d / "bad.safetensors", model).generate(3)
    except UserError as e:
        assert "\n" not in str(e)


# ---- the cases found by hand, kept as plain tests ----------------------------------------------

@pytest.fixture(scope="module")
def truncated(tiny_ckpt, tmp_path_factory):
    d = tmp_path_factory.mktemp("truncated")
    for f in tiny_ckpt.iterdir():
        if f.name != "model.safetensors":
            os.symlink(f, d / f.name)
    data = (tiny_ckpt / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:len(data) // 2])
    return d


def one_error(code, output, needle):
    check(code, output)
    assert code == 2 and needle in output, output[-2000:]


def test_truncated_weights_are_one_line_everywhere(truncated):
    generate, eval_cli, bench = script("generate"), script("eval"), script("bench")
    from conftest import DATA
    ckpt = ["--checkpoint_path", str(truncated)]
    for main, argv in ((generate.main, ckpt),
                       (eval_cli.main, ["ppl", *ckpt, "--max_tokens", "20",
                                        "--text_file", str(DATA / "kjv_genesis_1_2.txt")]),
                       (bench.main, [*ckpt, "--contexts", "16", "--new_tokens", "2",
                                     "--repeats", "1", "--compile", "off"])):
        one_error(*run_main(main, argv), "model.safetensors")


def test_config_value_of_the_wrong_type(tiny_ckpt, tmp_path):
    for f in tiny_ckpt.iterdir():
        if f.name != "config.json":
            os.symlink(f, tmp_path / f.name)
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    cfg["model"]["n_layer"] = "2"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    one_error(*run_main(script("generate").main, ["--checkpoint_path", str(tmp_path)]),
              "n_layer must be an integer, got '2'")


@pytest.mark.parametrize("argv,needle", [
    (["--cache", "lagkv", "--lag", "0"], "--lag must be between 1"),
    (["--temperature", "inf"], "must be a finite number"),
    (["--cache", "a2sf", "--forgetting_factor", "5"], "--forgetting_factor must be in [0, 1]"),
    (["--cache", "weightedkv", "--cache_size", "100000000", "--positions", "cache"],
     "exceeds the model's context"),
    (["--max_seq_length", "100000000"], "exceeds the model's context"),
])
def test_meaningless_values_are_refused(tiny_ckpt, argv, needle):
    one_error(*run_main(script("generate").main, ["--checkpoint_path", str(tiny_ckpt), *argv]),
              needle)


def test_a_budget_the_run_cannot_fill_is_not_allocated(tiny_ckpt):
    generate = script("generate")
    base = ["--checkpoint_path", str(tiny_ckpt), "--prompt", "Hello there", "--temperature", "0",
            "--max_new_tokens", "20", "--json", "--cache", "weightedkv"]
    code, huge = run_main(generate.main, base + ["--cache_size", "100000", "--prefill_chunk",
                                                 "100000"])
    assert code == 0 and "note: --cache_size 100000 is more than" in huge
    code, small = run_main(generate.main, base + ["--cache_size", "256"])
    assert code == 0
    out = [json.loads(o.splitlines()[-1]) for o in (huge, small)]
    assert out[0]["token_ids"] == out[1]["token_ids"]  # nothing this run could hold was cut
    # sink 4 + window 60 + middle 1 (+ 1 staging slot, 1 spare) instead of 100,000 + 100,000
    assert out[0]["cache_bytes"] < out[1]["cache_bytes"] < 2**22


def test_memory_is_checked_before_it_is_taken(tiny_ckpt):
    from caches import build_caches, make_cache_factory
    from engine.loading.checkpoint import load_model
    model = load_model(tiny_ckpt)
    with pytest.raises(UserError) as e:
        build_caches(model, 4096, 256, make_cache_factory("weightedkv", cache_size=10**7))
    message = str(e.value)
    assert "needs about" in message and "available RAM" in message and "\n" not in message
