"""Tensor parallelism over gloo on loopback: the result does not depend on the number of ranks,
for every cache policy (INT8 middle included), for quantized checkpoints and for the default
model; bad launches end with one line from rank 0 and every rank exits."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, tiny_model, write_tiny_checkpoint

TINY = dict(vocab_size=49152, n_layer=2, dim=64, n_head=4, n_kv_heads=2, head_dim=16,
            intermediate_size=128, max_position_embeddings=256, tie_embeddings=True)
PROMPT = "The quick brown fox jumps over the lazy dog. The old lighthouse keeper"


def torchrun(n, *args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           str(n), "--master_port", str(free_port()), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_ckpt(default_checkpoint, tmp_path_factory):
    """The default model's tokenizer and config format, a tiny random model with 2 KV heads."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tp") / "ckpt", default_checkpoint,
                                 **TINY)


@pytest.fixture(scope="module")
def one_rank(tiny_ckpt, tmp_path_factory):
    """The tiny model's matrix on one rank, the reference of every two-rank run."""
    return matrix(tiny_ckpt, tmp_path_factory.mktemp("one"), 1)


def matrix(ckpt, tmp_path, n, *extra):
    out = tmp_path / f"matrix-{n}.json"
    script = ROOT / "tests" / "tp_matrix.py"
    if n == 1:
        proc = subprocess.run([sys.executable, str(script), str(ckpt), str(out), *extra],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
    else:
        proc = torchrun(n, script, ckpt, out, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_policy_gives_the_same_tokens_and_perplexity_on_two_ranks(tiny_ckpt, one_rank,
                                                                        tmp_path):
    one, two = one_rank, matrix(tiny_ckpt, tmp_path, 2)
    assert two["_run"]["kv_heads_here"] == 1  # each rank holds one of the two KV heads
    for key, ref in one.items():
        if key.startswith("_"):
            continue
        assert two[key]["tokens"] == ref["tokens"], key
        assert abs(two[key]["nll"] - ref["nll"]) <= 1e-4 * abs(ref["nll"]), key


def test_the_compiled_step_with_collectives_matches_and_compiles_once(tiny_ckpt, one_rank,
                                                                      tmp_path):
    # the policies that communicate (TOVA) or draw by global head (CaM), and two that do not
    one = one_rank
    two = matrix(tiny_ckpt, tmp_path, 2, "--compile", "full,tova,cam,weightedkv")
    assert len(two) == 4 + 1 and two["_run"]["graphs"] > 0
    for key, got in two.items():
        if not key.startswith("_"):
            assert got["tokens"] == got["again"] == one[key]["tokens"], key
            assert got["new_graphs"] == 0, key  # the all-reduces compiled into the step


# int4 (slow) shards as int8 does: the same packed layout, half the bytes
@pytest.mark.parametrize("mode", ["int8", pytest.param("int4", marks=pytest.mark.slow)])
def test_quantized_checkpoints_shard(tiny_ckpt, tmp_path, mode):
    from engine.loading.checkpoint import quantize_checkpoint
    q = quantize_checkpoint(tiny_ckpt, mode, out=tmp_path / f"q-{mode}")
    one, two = matrix(q, tmp_path, 1), matrix(q, tmp_path, 2)
    # The packed kernels compute in bfloat16, so partial sums over ranks round differently:
    # a compressing cache can then evict another token of this flat random model (near-ties),
    # but the full cache keeps the tokens, and every NLL stays within 1%.
    assert two["full/model"]["tokens"] == one["full/model"]["tokens"]
    for key, ref in one.items():
        if not key.startswith("_"):
            assert abs(two[key]["nll"] - ref["nll"]) <= 1e-2 * abs(ref["nll"]), key
    assert two["_run"]["kv_heads_here"] == 1


# slow: minutes for three ranks on two cores; the tiny matrix runs every policy on two ranks,
# and test_sampling_ranks_agree_without_a_seed generate.py under torchrun
@pytest.mark.slow
@pytest.mark.parametrize("cache", [["--cache", "weightedkv", "--cache_size", "32"],
                                   ["--cache", "tova", "--cache_size", "32"]])
def test_default_model_on_three_ranks_equals_one(default_checkpoint, cache):
    args = ["generate.py", "--prompt", PROMPT, "--max_new_tokens", 16, "--temperature", 0,
            "--json", *cache]
    one = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    three = torchrun(3, *args)  # SmolLM2-135M: 3 KV heads, one per rank
    assert one.returncode == 0 and three.returncode == 0, three.stderr[-2000:]
    a, b = json.loads(one.stdout), json.loads(three.stdout)
    assert b["ranks"] == 3 and a["token_ids"] == b["token_ids"]
    assert three.stdout.count("\n") == 1  # rank 0 alone prints


def test_sampling_ranks_agree_without_a_seed(tiny_ckpt):
    two = torchrun(2, "generate.py", "--checkpoint_path", tiny_ckpt, "--prompt", "Once",
                   "--max_new_tokens", 12, "--temperature", 1.0, "--json")
    assert two.returncode == 0, two.stderr[-2000:]
    assert len(json.loads(two.stdout)["token_ids"]) >= 2  # no rank diverged (no hang)


def test_the_text_streams_from_rank_0_alone(tiny_ckpt):
    args = ["generate.py", "--checkpoint_path", tiny_ckpt, "--prompt", "Once",
            "--max_new_tokens", 8, "--temperature", 0]
    one = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    two = torchrun(2, *args)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert two.stdout == one.stdout and one.stdout.startswith("Once")


@pytest.mark.slow  # as above; the tiny matrix compares every policy's NLL on two ranks
def test_eval_ppl_on_three_ranks_equals_one(default_checkpoint):
    args = ["eval.py", "ppl", "--text_file", ROOT / "tests" / "data" / "kjv_genesis_1_2.txt",
            "--max_tokens", 96, "--cache", "h2o", "--cache_size", 48, "--json"]
    one = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    three = torchrun(3, *args)
    assert one.returncode == 0 and three.returncode == 0, three.stderr[-2000:]
    a, b = json.loads(one.stdout), json.loads(three.stdout)
    assert abs(a["ppl"] - b["ppl"]) <= 1e-4 * a["ppl"] and b["ranks"] == 3


def test_a_world_size_that_does_not_divide_the_heads_is_one_line_from_rank_0(default_checkpoint):
    bad = torchrun(2, "generate.py", "--prompt", "Hi", "--max_new_tokens", 2, timeout=300)
    assert bad.returncode != 0
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: 2 ranks do not divide the model's 3 KV heads; run torchrun "
                      "--nproc_per_node 1 or 3"]
    # both ranks exited with status 2 (torchrun then reports the failure in its own words)
    assert "exitcode  : 2" in bad.stderr and 'generate.py", line' not in bad.stderr


def rank_env(rank, world, port):
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")


def test_ranks_with_different_arguments_stop_with_one_line(tiny_ckpt):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "generate.py"), "--checkpoint_path",
                               str(tiny_ckpt), "--prompt", "Hi", "--max_new_tokens", str(2 + r)],
                              env=rank_env(r, 2, port), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 2 for p in procs)
    assert outs[0][1].strip().splitlines()[-1].startswith("error: the ranks were started with "
                                                          "different arguments")
    assert "error:" not in outs[1][1]


def test_an_incomplete_torchrun_environment_is_one_line(tiny_ckpt):
    env = dict(os.environ, RANK="0", WORLD_SIZE="2")
    env.pop("MASTER_ADDR", None)
    proc = subprocess.run([sys.executable, str(ROOT / "generate.py"), "--checkpoint_path",
                           str(tiny_ckpt), "--prompt", "Hi"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the torchrun environment is incomplete")
    assert proc.stderr.count("\n") == 1


def test_the_shards_hold_each_ranks_heads():
    # in-process, world of 2 faked: rank 1's wqkv rows are the second half of q, k and v
    from engine.runtime.tp import TP, shard_model
    model = tiny_model(**{**TINY, "vocab_size": 256})
    full = model.layers[0].attention.wqkv.weight.detach().clone()
    w2 = model.layers[0].feed_forward.w2.weight.detach().clone()
    shard_model(model, TP(1, 2, "unused"))
    D, H, Hkv = 16, 4, 2
    q, k, v = full.split([H * D, Hkv * D, Hkv * D])
    got = model.layers[0].attention.wqkv.weight
    assert torch.equal(got, torch.cat([q[2 * D:], k[D:], v[D:]]))
    assert torch.equal(model.layers[0].feed_forward.w2.linear.weight, w2[:, 64:])
    assert model.args.n_kv_heads == 1 and model.kv_shard.offset == 1
