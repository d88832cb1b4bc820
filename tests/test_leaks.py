"""Long runs hold constant memory, checked by counting what is alive, not by the clock: the live
tensors, the Python objects the collector tracks and the bytes malloc has handed out do not
grow from a few decode steps to many (session turns, batcher requests), for every policy. A
run that keeps one small tensor a step (as the decode loop once kept its tokens) grows by
thousands of tensors here; scripts/soak.py measures the same at full scale."""
import ctypes
import gc

import pytest
import torch

from caches import POLICIES, make_cache_factory
from conftest import tiny_model
from engine.runtime.batcher import Batcher, SamplingParams
from engine.runtime.generation import Session

# What a stream may keep per token: its id in the session's token history (a list's 8-byte
# pointer, and the list's spare room as it grows). A kept tensor costs hundreds of bytes.
BYTES_PER_TOKEN = 16
SLACK_OBJECTS = 8  # the collector's own bookkeeping between two counts
LENGTHS = [5, 17, 33, 9, 24, 3, 40, 12]  # a batcher wave's prompts


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloc_in_use():
    """Bytes glibc's malloc has handed out and not taken back (heap and mapped blocks)."""
    try:
        f = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33+ (mallinfo2)")
    f.restype = _MallInfo2
    m = f()
    return m.uordblks + m.hblkhd


def census():
    """(live tensors, tracked objects, malloc bytes in use) after a full collection."""
    gc.collect()
    objects = gc.get_objects()
    # by type, not isinstance: that asks some objects for __class__ (a dead weak proxy raises)
    tensors = sum(issubclass(type(o), torch.Tensor) for o in objects)
    return tensors, len(objects), _malloc_in_use()


def assert_flat(before, after, tokens: int, what: str):
    (t0, o0, b0), (t1, o1, b1) = before, after
    # Fewer is no leak: tests before this one in the process may leave tensors that are let go
    # of meanwhile (116 fewer once, after test_caches and test_layers).
    assert t1 <= t0, f"{what}: {t1 - t0} more live tensors after {tokens} more tokens"
    assert o1 - o0 <= SLACK_OBJECTS, f"{what}: {o1 - o0} more objects after {tokens} tokens"
    assert b1 - b0 <= BYTES_PER_TOKEN * tokens, \
        f"{what}: malloc holds {b1 - b0} more bytes after {tokens} more tokens"


def unbounded(name):
    """A policy's cache of 32 tokens; with rank positions where it compresses, so that the
    stream outgrows the model's context as a long generation does."""
    if name == "full" or POLICIES[name].keeps_every_token:
        return make_cache_factory(name), 2400
    return make_cache_factory(name, cache_size=32, chunk=8, positions="cache"), 512


@pytest.mark.parametrize("name", list(POLICIES))
def test_decode_steps_hold_constant_memory(name):
    model = tiny_model(max_position_embeddings=2400)
    make, length = unbounded(name)
    session = Session(model, make, length)
    session.append(list(range(1, 20)))
    counts, n = {}, [0]

    def count(token):  # inside the loop: what one generation holds while it runs
        n[0] += 1
        if n[0] in (200, 2000):
            counts[n[0]] = census()
    session.generate(2000, temperature=0.8, top_k=50, callback=count)
    assert_flat(counts[200], counts[2000], 1800, name)


@pytest.mark.parametrize("name", ["weightedkv", "quantized"])
def test_a_session_in_turns_holds_constant_memory(name):
    model = tiny_model(max_position_embeddings=2400)
    make, length = unbounded(name)
    session = Session(model, make, length)

    def turns(n):
        for i in range(n):
            session.append([(7 * i + j) % 256 for j in range(1, 6)])
            session.generate(10, temperature=0.8, top_k=50)
    turns(10)
    before = census()
    turns(60)
    assert_flat(before, census(), 60 * 15, name)


@pytest.mark.parametrize("name", ["full", "weightedkv"])
def test_the_batcher_holds_constant_memory_as_rows_join_and_leave(name):
    model = tiny_model(max_position_embeddings=2400)
    make, length = unbounded(name)
    batcher = Batcher(model, make, slots=3, max_seq_length=min(length, 512), parked=2).start()
    g = torch.Generator().manual_seed(5)

    def wave(n):  # more requests than rows; every third is cancelled while it runs
        # New prompts of the same lengths each wave: a new length is a new shape, which
        # caches of its own may keep (a warm-up, not a leak).
        requests = [batcher.submit(torch.randint(1, 256, (k,), generator=g).tolist(),
                                   SamplingParams(max_tokens=12, temperature=0.8, seed=k))
                    for k in LENGTHS[:n]]
        for i, r in enumerate(requests):
            if i % 3 == 2:
                batcher.cancel(r)
        for r in requests:
            r.result()
        return sum(len(r.tokens) + len(r.prompt) for r in requests)
    try:
        for _ in range(10):  # the full cache's prompt reads settle over several waves
            wave(8)
        before = census()
        tokens = sum(wave(8) for _ in range(10))
        after = census()
        assert batcher.active == 0 and batcher.queued == 0
    finally:
        batcher.stop()
    assert_flat(before, after, tokens, name)
