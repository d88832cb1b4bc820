"""Sessions: cache state that outlives a call (append, continue, save/load), independent sessions
on one model, rows at different positions, and the terminal chat on the default model."""
import os
import subprocess
import sys

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from caches import POLICIES, make_cache_factory
from conftest import DATA, ROOT, tiny_model
from core.errors import UserError
from engine.runtime.generation import Generator, Session, compile_decode, decode_one_token

COMPRESSING = [p for p in POLICIES if p != "full"]


def factory(name, **kw):
    return make_cache_factory(name, **({"cache_size": 16, "chunk": 8, **kw} if name != "full"
                                       else {}))


def retained(session):
    return [c.pos.clone() for c in session.caches]


@pytest.mark.parametrize("name", list(POLICIES))
def test_rows_of_different_lengths_equal_each_row_alone(name):
    model = tiny_model()
    prompts = [list(range(1, 30)), [7, 8, 9], list(range(40, 51))]
    batch = Generator(model, 128, batch_size=3, make_cache=factory(name))
    out = batch.generate(prompts, 40)
    for b, p in enumerate(prompts):
        alone = Generator(model, 128, make_cache=factory(name))
        assert alone.generate(p, 40).new_ids[0] == out.new_ids[b], b
        if name != "full":  # the same tokens retained, in every layer and head
            for row, single in zip(retained(batch), retained(alone)):
                assert torch.equal(row[b].sort(-1).values, single[0].sort(-1).values)


@pytest.mark.parametrize("name", ["full", "weightedkv", "lagkv", "cam"])
def test_a_prompt_shared_by_every_row_is_read_once_and_copied(name):
    """append_shared: one row reads the prompt, the others get copies of its state; every buffer
    then equals what reading it in each row gives, and so does every row's continuation."""
    model = tiny_model()
    prompt = list(range(1, 30))
    each, shared = (Session(model, factory(name), 128, batch_size=3) for _ in range(2))
    each.append(prompt)
    shared.append_shared(prompt)
    for a, b in zip(each.caches, shared.caches):
        for (key, x), y in zip(a.state().items(), b.state().values()):
            if x.is_floating_point():  # products over three rows may round apart from one row's
                torch.testing.assert_close(x, y, rtol=0, atol=1e-5, msg=key)
            else:  # positions and index maps: the same tokens kept, in the same slots
                assert torch.equal(x, y), key
    torch.testing.assert_close(each.logits, shared.logits, rtol=0, atol=1e-5)
    assert each.tokens == shared.tokens
    assert each.generate(20).new_ids == shared.generate(20).new_ids
    with pytest.raises(UserError, match="reset it first"):
        shared.append_shared(prompt)


@pytest.mark.parametrize("name", ["full"] + COMPRESSING)
def test_append_continues_the_same_stream(name):
    # A session that appends twice and generates in between reads the same tokens as one that
    # is handed the whole stream in the same pieces; without eviction it equals the full cache.
    model = tiny_model()
    big = factory(name, cache_size=120) if name != "full" else factory("full")
    s = Session(model, big, max_seq_length=160)
    s.append(list(range(1, 12)))
    first = s.generate(15).new_ids[0]
    s.append([100, 101, 102, 103, 104])
    second = s.generate(15).new_ids[0]
    stream = list(range(1, 12)) + first + [100, 101, 102, 103, 104]
    assert s.tokens[0] + [s.pending.item()] == stream + second
    ref = Generator(model, 160)
    assert ref.generate(stream, 15).new_ids[0] == second


def test_generate_twice_continues_from_the_pending_token():
    model = tiny_model()
    s = Session(model, factory("weightedkv"), max_seq_length=128)
    s.append([3, 1, 4, 1, 5])
    a = s.generate(10).new_ids[0]
    b = s.generate(10).new_ids[0]
    one = Session(model, factory("weightedkv"), max_seq_length=128)
    one.append([3, 1, 4, 1, 5])
    assert one.generate(20).new_ids[0] == a + b


def test_two_sessions_on_one_model_are_independent():
    model = tiny_model()
    a = Session(model, factory("h2o"), max_seq_length=128)
    b = Session(model, factory("weightedkv"), max_seq_length=128)
    a.append([1, 2, 3])
    b.append([9, 8, 7, 6])
    ga = [a.generate(5).new_ids[0] for _ in range(3)]
    gb = [b.generate(5).new_ids[0] for _ in range(3)]
    for s, prompt, got in ((Session(model, factory("h2o"), max_seq_length=128), [1, 2, 3], ga),
                           (Session(model, factory("weightedkv"), max_seq_length=128),
                            [9, 8, 7, 6], gb)):
        s.append(prompt)
        assert sum(got, []) == s.generate(15).new_ids[0]


@pytest.mark.parametrize("name", ["full", "weightedkv", "quantized", "cam", "lagkv"])
def test_save_load_round_trip_continues_identically(name, tmp_path):
    model = tiny_model()
    s = Session(model, factory(name, **({"kv_middle": "int8"} if name == "weightedkv" else {})),
                max_seq_length=128)
    s.append(list(range(1, 40)))
    s.generate(7)
    s.save(tmp_path / "s.safetensors")
    saved = [list(t) for t in s.tokens]
    expected = s.generate(20).new_ids[0]
    loaded = Session.load(tmp_path / "s.safetensors", model)
    assert loaded.tokens == saved
    assert loaded.generate(20).new_ids[0] == expected
    for a, b in zip(loaded.caches, s.caches):
        for (n, x), (_, y) in zip(a.state().items(), b.state().items()):
            assert torch.equal(x, y), n


def test_saved_file_errors_are_one_line(tmp_path):
    model = tiny_model()
    s = Session(model, factory("weightedkv"), max_seq_length=128)
    s.append([1, 2, 3, 4])
    path = tmp_path / "s.safetensors"
    s.save(path)
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:len(data) // 2])
    (tmp_path / "text.safetensors").write_text("not a session")
    cases = [
        (lambda: Session.load(tmp_path / "missing", model), "does not exist"),
        (lambda: Session.load(tmp_path / "cut.safetensors", model), "cut.safetensors"),
        (lambda: Session.load(tmp_path / "text.safetensors", model), "text.safetensors"),
        (lambda: Session.load(path, tiny_model(seed=1)), "another model"),
        (lambda: Session.load(path, model, make_cache=factory("h2o")), "policy=weightedkv"),
        (lambda: Session.load(path, model, make_cache=factory("weightedkv", cache_size=32)),
         "cache_size=16"),
        (lambda: Session.load(path, model, max_seq_length=256), "128 positions"),
        (lambda: Session.load(path, model.to(torch.bfloat16)), "float32"),
    ]
    for call, needle in cases:
        with pytest.raises(UserError) as e:
            call()
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    model.float()
    # an older format is refused by name
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata(), version="0")
    save_file(load_file(str(path)), str(tmp_path / "old.safetensors"), metadata=meta)
    with pytest.raises(UserError, match="format version 0"):
        Session.load(tmp_path / "old.safetensors", model)
    # saving over an existing file goes through a temporary: a failed save leaves it whole
    assert Session.load(path, model).tokens == [[1, 2, 3, 4]]


def test_bad_turns_are_user_errors():
    model = tiny_model()
    s = Session(model, factory("full"), max_seq_length=16)
    with pytest.raises(UserError, match="append a prompt"):
        s.generate(3)
    with pytest.raises(UserError, match="empty"):
        s.append([])
    s.append(list(range(12)))
    with pytest.raises(UserError, match="16 positions"):
        s.append(list(range(8)))
    assert len(s.generate(100).new_ids[0]) == 4  # the rest of the positions, then it stops


def test_one_decode_graph_across_turns_and_save_load(tmp_path):
    torch._dynamo.reset()
    model = tiny_model()
    counter = CompileCounter()
    s = Session(model, factory("weightedkv"), max_seq_length=512)
    s.decode_fn = compile_decode(decode_one_token, model, backend=counter, caches=s.caches)
    for turn in range(4):
        s.append([turn + 1] * (5 + 9 * turn))  # chunks and single tokens
        s.generate(12)
    frames = counter.frame_count
    # the step, and prompt-chunk compression for a stack of layers (chunk order) and for a
    # cache alone (two chunks read layer by layer: a wavefront of one piece)
    assert frames == 3
    s.save(tmp_path / "s.safetensors")
    loaded = Session.load(tmp_path / "s.safetensors", model)
    loaded.decode_fn = compile_decode(decode_one_token, model, backend=counter,
                                      caches=loaded.caches)
    for turn in range(3):
        loaded.append([7] * (3 + 10 * turn))
        loaded.generate(12)
    assert counter.frame_count == frames


def test_one_process_compiles_every_policy():
    # every policy is its own graph of the one block step: more than dynamo's default limit of 8
    model = tiny_model()
    counter = CompileCounter()
    for name in list(POLICIES) + ["weightedkv+int8", "h2o+int8"]:
        policy, _, middle = name.partition("+")
        s = Session(model, factory(policy, **({"kv_middle": "int8"} if middle else {})), 128)
        s.decode_fn = compile_decode(decode_one_token, model, backend=counter, caches=s.caches)
        s.append(list(range(1, 20)))
        s.generate(3)
    assert counter.frame_count >= len(POLICIES)


# ---- the default model -----------------------------------------------------------------------

QUESTIONS = ["Who created the heaven and the earth?", "What was upon the face of the deep?",
             "What did God call the light?"]


def test_saved_document_answers_like_a_fresh_read(default_checkpoint, tmp_path):
    from engine.loading.checkpoint import load_model
    from engine.loading.tokenizer import load_tokenizer
    model, tok = load_model(default_checkpoint), load_tokenizer(default_checkpoint)
    doc = tok.encode((DATA / "kjv_genesis_1_2.txt").read_text())[:200]
    make = make_cache_factory("weightedkv", cache_size=96, kv_middle="int8")
    s = Session(model, make, max_seq_length=512)
    s.append(doc)
    s.save(tmp_path / "doc.safetensors")
    for q in QUESTIONS:
        ids = tok.encode(f"\nQuestion: {q}\nAnswer:", bos=False)
        fresh = Session(model, make, max_seq_length=512)
        fresh.append(doc)
        fresh.append(ids)
        expected = fresh.generate(12, eos_ids=tok.eos_ids).new_ids[0]
        loaded = Session.load(tmp_path / "doc.safetensors", model, make_cache=make)
        loaded.append(ids)
        assert loaded.generate(12, eos_ids=tok.eos_ids).new_ids[0] == expected
    assert len({tuple(tok.encode(q)) for q in QUESTIONS}) == 3


@pytest.fixture(scope="module")
def smol(default_checkpoint):
    from engine.loading.checkpoint import load_model
    from engine.loading.tokenizer import load_tokenizer
    return load_model(default_checkpoint), load_tokenizer(default_checkpoint)


@pytest.mark.parametrize("name", list(POLICIES))
def test_chat_appends_only_what_each_turn_adds(name, smol):
    # Whatever the policy, the session has read exactly the rendered conversation: each turn's
    # suffix, the model's own replies (end-of-turn token included) and nothing twice.
    from engine.runtime.chat import Chat
    model, tok = smol
    make = make_cache_factory(name, **({"cache_size": 48, "chunk": 8, "positions": "cache"}
                                       if name != "full" else {}))
    session = Session(model, make, max_seq_length=512 if name == "full" else 64)
    chat = Chat(session, tok, system="Be brief.")
    sizes = set()
    for text in ["Hi!", "What is the capital of France?", "And of Spain?"]:
        chat.turn(text, 6)
        sizes.add(session.cache_bytes)
    chat.messages.append({"role": "user", "content": "Bye."})
    rendered = tok.encode(tok.apply_chat_template(chat.messages), bos=False)
    fed = session.tokens[0] + session.pending.view(-1).tolist()
    replies_end = [m["content"] for m in chat.messages if m["role"] == "assistant"]
    assert len(replies_end) == 3 and len(sizes) == 1
    # the history is a prefix of the re-rendered conversation, up to where the last reply ends
    # (the template's closing text of that reply is read with the next turn)
    assert rendered[:len(fed)] == fed or tok.decode(rendered).startswith(tok.decode(fed)), name


def test_interactive_chat_in_a_terminal(default_checkpoint, tmp_path):
    """Six turns of `generate.py --interactive` driven through a pseudo-terminal: the prompt line
    counts the tokens seen, the cache bytes stay fixed, /save writes a loadable session, /reset
    starts over and /exit ends."""
    import pexpect
    # One thread, as the suite's workers run: two would wait on the core the other worker holds
    # (305 s against 17 s beside a busy core).
    env = dict(os.environ, OMP_NUM_THREADS="1", REGIONKV_HOME=os.environ.get("REGIONKV_HOME", ""))
    env = {k: v for k, v in env.items() if v != ""}
    child = pexpect.spawn(sys.executable, [str(ROOT / "generate.py"), "--interactive",
                                           "--checkpoint_path", str(default_checkpoint),
                                           "--cache", "weightedkv", "--cache_size", "64",
                                           "--max_new_tokens", "12", "--temperature", "0",
                                           "--system", "You answer in one short sentence."],
                          cwd=str(ROOT), env=env, encoding="utf-8", timeout=180)
    prompt = r"\[(\d+) tokens, cache ([\d.]+) MiB\] > "
    child.expect(prompt)
    seen = [int(child.match.group(1))]
    sizes = {child.match.group(2)}
    turns = ["Hello!", "What is the capital of France?", "And of Italy?", "Name a color.",
             "What is two plus two?", "One more: what is water made of?"]
    for turn in turns:
        child.sendline(turn)
        child.expect(prompt)
        seen.append(int(child.match.group(1)))
        sizes.add(child.match.group(2))
    assert seen[0] == 0 and all(b > a for a, b in zip(seen, seen[1:])), seen
    assert len(sizes) == 1  # constant memory: the cache never grows
    assert seen[-1] > 64 + 12  # the chat outgrew the budget: compression ran
    child.sendline("")  # an empty turn is an error, not the end
    child.expect("error: the turn is empty")
    child.expect(prompt)
    child.sendline(f"/save {tmp_path / 'chat.safetensors'}")
    child.expect(r"\(saved ")
    child.expect(prompt)
    child.sendline("/reset")
    child.expect(prompt)
    assert int(child.match.group(1)) == 0
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    from engine.loading.checkpoint import load_model
    loaded = Session.load(tmp_path / "chat.safetensors", load_model(default_checkpoint))
    assert max(loaded.positions) == seen[-1]


RSS_PROBE = r"""
import os, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import torch
from caches import make_cache_factory
from conftest import tiny_model
from engine.runtime.generation import Session

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

s = Session(tiny_model(), make_cache_factory("weightedkv", cache_size=32, chunk=8,
            positions="cache"), max_seq_length=64, compile=sys.argv[2] == "compiled")
s.append(list(range(1, 20)))
torch.manual_seed(0)
marks = []
for _ in range(5):
    s.generate(int(sys.argv[3]), temperature=0.8, top_k=50)
    marks.append(rss_mib())
print(marks[1], marks[4])
"""


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_memory_is_flat_over_a_long_stream(mode):
    # RSS after N and after 4N more tokens (the first N warm allocators and compiled graphs).
    n = 400
    proc = subprocess.run([sys.executable, "-c", RSS_PROBE, str(ROOT), mode, str(n)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    after_n, after_4n = map(float, proc.stdout.split())
    assert after_4n - after_n < 8, (after_n, after_4n)  # MiB, over 1,200 more tokens


def test_a_refused_append_changes_nothing():
    model = tiny_model()
    s = Session(model, factory("full"), max_seq_length=32)
    s.append(list(range(1, 11)))
    s.generate(5)
    before = (list(s.tokens[0]), s.pending.clone(), s.positions)
    with pytest.raises(UserError, match="32 positions"):
        s.append(list(range(30)))
    assert (s.tokens[0], s.positions) == (before[0], before[2])
    assert torch.equal(s.pending, before[1])
    s.append([7, 7])  # and the stream goes on from where it was
    assert s.tokens[0] == before[0] + [before[1].item(), 7, 7]


def test_int8_words_in_float32_or_int32_tensors_decode_alike_and_load_either_way(
        monkeypatch, tmp_path):
    # An INT8 middle's words live in float32 tensors on an AVX2 CPU and in int32 ones on an
    # AVX-512 CPU (quantize/kv.py: WORD, for whole vector loads in the compiled step): the same
    # bits either way. Compiled, the two give the same tokens and the same cache, and a session
    # saved where the words are floats loads where they are integers.
    import quantize.kv as kv
    model = tiny_model()
    make = factory("quantized")
    runs = {}
    for word in (torch.float32, torch.int32):
        monkeypatch.setattr(kv, "WORD", word)
        torch._dynamo.reset()
        s = Session(model, make, 128, compile=True)
        assert s.caches[0].k_words.dtype == word
        s.append(list(range(1, 40)))
        first = s.generate(8).new_ids[0]
        if word == torch.float32:
            s.save(tmp_path / "floats.safetensors")
        runs[word] = (first, s.generate(8).new_ids[0],
                      [{n: t.clone() for n, t in c.state().items()} for c in s.caches])
    assert runs[torch.float32][:2] == runs[torch.int32][:2]
    for a, b in zip(runs[torch.float32][2], runs[torch.int32][2]):
        assert all(torch.equal(a[n], b[n]) for n in a)
    loaded = Session.load(tmp_path / "floats.safetensors", model, make_cache=make, compile=True)
    assert loaded.caches[0].k_words.dtype == torch.int32
    assert loaded.generate(8).new_ids[0] == runs[torch.float32][1]
    torch._dynamo.reset()
