"""RULER-style tasks: generators (exact length, needles at their depths, known answers, seeds),
scorers, `eval.py ruler` end to end and a resumable `[ruler]` sweep section on a tiny model."""
import collections
import json
import re

import pytest

from conftest import DATA, run_cli, write_tiny_checkpoint
from core.errors import UserError
from engine.evaluation import ruler
from engine.evaluation.passkey import PromptTooShort
from engine.evaluation.ruler import TASKS, build_cell_prompts, build_prompt, parse_tasks, score
from engine.evaluation.sweep import ResultStore, load_config, run_sweep
from engine.loading.tokenizer import load_tokenizer
from eval import main

PNG = b"\x89PNG\r\n\x1a\n"
NEEDLE_TASKS = [t for t in TASKS if TASKS[t].haystack]


@pytest.fixture(scope="module")
def tok(default_checkpoint):
    return load_tokenizer(default_checkpoint)


@pytest.fixture(scope="module")
def haystack(tok):
    return tok.encode((DATA / "kjv_genesis_1_2.txt").read_text())


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, default_checkpoint):
    """The default model's tokenizer, a tiny random model with a context of 1024."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ruler") / "ckpt", default_checkpoint,
                                 vocab_size=49152, n_layer=2, dim=32, n_head=2, n_kv_heads=1,
                                 head_dim=16, intermediate_size=64,
                                 max_position_embeddings=1024, tie_embeddings=True)


@pytest.fixture
def corpora(tmp_path):
    d = tmp_path / "corpora"
    d.mkdir()
    (d / "gen.txt").write_text((DATA / "kjv_genesis_1_2.txt").read_text())
    return d


# ---------------------------------------------------------------------------------------------
# Generators

@pytest.mark.parametrize("task", NEEDLE_TASKS)
@pytest.mark.parametrize("length", [300, 511, 1024])
def test_needles_sit_at_their_depths_in_uncut_text(tok, haystack, task, length):
    p = build_prompt(task, tok, haystack, length, seed=3, trial=1)
    assert len(p.ids) == length and p.task == task
    starts = [s for s, _ in p.needles]
    assert starts == sorted(starts) and p.depths == sorted(p.depths)
    pre = len(tok.encode({"variable_tracking": ruler.VT_PREFACE}.get(task, ruler.NIAH_PREFACE)))
    before = 0  # needle tokens placed before this one
    for (start, ids), depth in zip(p.needles, p.depths):
        assert start == pre + before + round(depth * p.haystack_len)
        assert p.ids[start:start + len(ids)] == ids
        before += len(ids)
    # Without its needles the prompt is the preface, the haystack's first H tokens in order,
    # and the question.
    rest, at = [], 0
    for start, ids in p.needles:
        rest += p.ids[at:start]
        at = start + len(ids)
    rest += p.ids[at:]
    assert rest[pre:pre + p.haystack_len] == haystack[:p.haystack_len]
    question = len(rest) - pre - p.haystack_len
    assert question > 10 and len(rest) + before == length


def test_multikey_asks_one_of_four_keys(tok, haystack):
    p = build_prompt("niah_multikey", tok, haystack, 512, seed=0, trial=2)
    needles = [re.fullmatch(r"\nOne of the special magic numbers for (\S+) is: (\d{7})\.\n",
                            tok.decode(ids)).groups() for _, ids in p.needles]
    keys, values = zip(*needles)
    assert len(set(keys)) == len(set(values)) == ruler.MULTIKEY_KEYS
    asked = re.search(r"magic number for (\S+) in the text above\?", tok.decode(p.ids)).group(1)
    assert p.expected == [dict(needles)[asked]]
    assert tok.decode(p.ids).endswith(f"The special magic number for {asked} is")


def test_multivalue_asks_all_values_of_one_key(tok, haystack):
    p = build_prompt("niah_multivalue", tok, haystack, 512, seed=0, trial=0)
    needles = [re.fullmatch(r"\nOne of the special magic numbers for (\S+) is: (\d{7})\.\n",
                            tok.decode(ids)).groups() for _, ids in p.needles]
    assert len({k for k, _ in needles}) == 1
    assert p.expected == [v for _, v in needles] and len(set(p.expected)) == 4
    assert tok.decode(p.ids).endswith(f"numbers for {needles[0][0]} are")


def test_variable_tracking_chain_resolves_to_the_expected_names(tok, haystack):
    p = build_prompt("variable_tracking", tok, haystack, 600, seed=5, trial=0)
    value = {}  # follow the assignments in prompt order: each copies one already defined
    for _, ids in p.needles:
        name, rhs = re.fullmatch(r"\nVAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})\n",
                                 tok.decode(ids)).groups()
        value[name] = value[rhs[4:]] if rhs.startswith("VAR ") else rhs
    asked = re.search(r"assigned the value (\d{5}) in the text", tok.decode(p.ids)).group(1)
    assert sorted(n for n, v in value.items() if v == asked) == sorted(p.expected)
    assert len(p.expected) == 5 and len(value) == 10 and len(set(value.values())) == 2


@pytest.mark.parametrize("length", [461, 700, 1024, 2048])
def test_common_words_frequent_ones_are_the_expected(tok, length):
    p = build_prompt("common_words", tok, None, length, seed=0, trial=0)
    assert len(p.ids) == length
    text = tok.decode(p.ids)
    items = re.findall(r"^(\d+)\. (\w+)$", text, re.M)
    assert [int(n) for n, _ in items] == list(range(1, len(items) + 1))
    counts = collections.Counter(w for _, w in items)
    top = {counts[w] for w in p.expected}
    assert len(top) == 1 and top.pop() >= ruler.CW_MIN_COMMON and len(p.expected) == 10
    rare = [c for w, c in counts.items() if w not in p.expected]
    assert len(rare) >= 10 and set(rare) == {ruler.CW_RARE}
    # Longer lists repeat the frequent words more (about 40% of the items).
    if length >= 1024:
        assert counts[p.expected[0]] * 10 > 0.3 * len(items)


@pytest.mark.parametrize("task", list(TASKS))
def test_same_seed_same_prompts(tok, haystack, task):
    pool = haystack * 2
    a = build_cell_prompts(tok, pool, task, 480, 3, seed=1, max_length=512)
    b = build_cell_prompts(tok, pool, task, 480, 3, seed=1, max_length=512)
    c = build_cell_prompts(tok, pool, task, 480, 3, seed=2, max_length=512)
    assert [p.ids for p in a] == [p.ids for p in b] and {len(p.ids) for p in a} == {480}
    assert [p.ids for p in a] != [p.ids for p in c]
    assert len({tuple(p.ids) for p in a}) == 3  # trials differ
    # A trial asks the same thing at every length.
    longer = build_cell_prompts(tok, pool, task, 512, 3, seed=1, max_length=512)
    assert [p.expected for p in longer] == [p.expected for p in a]


@pytest.mark.parametrize("task", list(TASKS))
def test_too_short_names_the_shortest_length_for_every_trial(tok, haystack, task):
    with pytest.raises(PromptTooShort, match=f"^{task} length 120 .*; use at least") as e:
        build_cell_prompts(tok, haystack, task, 120, 4, seed=0, max_length=1024)
    least = e.value.least
    assert {len(p.ids) for p in build_cell_prompts(tok, haystack, task, least, 4, 0, 1024)} == \
        {least}
    with pytest.raises(PromptTooShort):
        build_cell_prompts(tok, haystack, task, least - 1, 4, 0, 1024)


def test_words_are_a_fixed_sequence():
    assert ruler.words(50)[:10] == ruler.words(10)
    assert len(set(ruler.words(3000))) == 3000
    assert all(re.fullmatch(r"[a-z]{4,7}", w) for w in ruler.words(3000))


# ---------------------------------------------------------------------------------------------
# Scorers

@pytest.mark.parametrize("task,perfect,partial,fraction", [
    ("niah_multikey", " 4829113.", " 4829113 and 1234567", 1.0),
    ("niah_multivalue", " 4829113, 7700321, 1000002 and 5550001.", " 4829113, 1000002.", 0.5),
    ("variable_tracking", " QWERT, ASDFG, ZXCVB, POIUY, LKJHG", " qwert, ZXCVB, LKJHG, MNBVC",
     0.6),
    ("common_words", " 1. bavo 2. kelut\n3. tomani, lirosa, fenu, gapitor, mesalu, runo, sivek, "
     "dolamur", " Bavo, kelut, tomani, fenu, runo, sivek, dolamur, bavolin", 0.7)])
def test_scores(task, perfect, partial, fraction):
    expected = {"niah_multikey": ["4829113"],
                "niah_multivalue": ["4829113", "7700321", "1000002", "5550001"],
                "variable_tracking": ["QWERT", "ASDFG", "ZXCVB", "POIUY", "LKJHG"],
                "common_words": ["bavo", "kelut", "tomani", "lirosa", "fenu", "gapitor",
                                 "mesalu", "runo", "sivek", "dolamur"]}[task]
    assert score(perfect, expected) == 1.0
    assert score("", expected) == 0.0
    assert score(" I do not know. 48291130 x4829113y ABCDEFG", expected) == 0.0
    assert score(partial, expected) == pytest.approx(fraction)


def test_parse_tasks():
    assert parse_tasks(["common_words", " niah_multikey", "common_words", ""], "--tasks") == \
        ["common_words", "niah_multikey"]
    with pytest.raises(UserError, match="unknown task 'niah'; choose from niah_multikey"):
        parse_tasks(["niah"], "--tasks")


# ---------------------------------------------------------------------------------------------
# eval.py ruler and the [ruler] section of a sweep

def test_ruler_cli(tmp_path, tiny_checkpoint, corpora, capsys):
    out = tmp_path / "ruler.jsonl"
    args = ("eval.py", "ruler", "--checkpoint_path", tiny_checkpoint, "--corpus_dir", corpora,
            "--corpus", "gen", "--lengths", "464,480", "--trials", "2",
            "--cache", "full,streaming", "--cache_size", "16", "--json", "--out", out)
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    cells = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {(c["label"], c["task"], c["length"]) for c in cells} == {
        (p, t, n) for p in ("full", "streaming") for t in TASKS for n in (464, 480)}
    assert all(0 <= c["score"] <= 1 for c in cells)
    rows = ResultStore(out).rows()
    assert len(rows) == 16 and all(len(r["answers"]) == 2 for r in rows)
    for r in rows:  # each task decodes its own number of tokens; scores are the answers' mean
        assert r["key"]["new_tokens"] == TASKS[r["task"]].new_tokens
        assert r["score"] == sum(score(a["answer"], a["expected"]) for a in r["answers"]) / 2
    assert out.with_suffix(".png").read_bytes().startswith(PNG)
    # Resumed: nothing runs; the tables come from the file.
    main([str(a) for a in args[1:] if a != "--json"])
    captured = capsys.readouterr()
    assert "ruler: 0 cell(s) to run" in captured.err
    for task in TASKS:
        table = captured.out.split(f"{task}\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert table[0] == "| policy | cache | L=464 | L=480 | mean |"
        assert [line.split(" | ")[:2] for line in table[2:]] == [["| full", "all"],
                                                                 ["| streaming", "16"]]
    assert len(out.read_text().splitlines()) == 16


@pytest.mark.parametrize("extra,needle", [
    (["--tasks", "niah_multikey,nosuch"], "--tasks: unknown task 'nosuch'; choose from "),
    (["--lengths", "1000"], "common_words length 1000 + 64 new tokens exceeds the model's "
                            "context of 1024; use --lengths of at most 960"),
    (["--lengths", "1020", "--tasks", "niah_multikey"], "niah_multikey length 1020 + 12 new "
                                                        "tokens exceeds the model's context of "
                                                        "1024; use --lengths of at most 1012"),
    (["--lengths", "100", "--tasks", "variable_tracking"], "variable_tracking length 100 "
                                                           "leaves no room for a haystack; use "
                                                           "at least "),
    (["--lengths", "300", "--tasks", "common_words"], "common_words length 300 is too short "
                                                      "for 10 frequent and 10 rare words; use "
                                                      "at least ")])
def test_ruler_cli_errors(tmp_path, tiny_checkpoint, corpora, extra, needle):
    proc = run_cli("eval.py", "ruler", "--checkpoint_path", tiny_checkpoint, "--corpus_dir",
                   corpora, "--corpus", "gen", "--out", tmp_path / "r.jsonl", *extra)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert not (tmp_path / "r.jsonl").exists()


def write_config(tmp_path, checkpoint, corpus_dir, **ruler_section):
    cfg = {"out_dir": str(tmp_path / "out"), "checkpoint_path": str(checkpoint),
           "corpus_dir": str(corpus_dir), "dtype": "float32", "device": "cpu",
           "max_tokens": 24, "corpora": ["gen"], "cache_sizes": [16],
           "policies": ["full", "weightedkv"],
           "ruler": {"corpus": "gen", "lengths": [464], "trials": 2, "new_tokens": 6,
                     "tasks": ["niah_multivalue", "common_words"], **ruler_section}}
    path = tmp_path / "ruler.json"
    path.write_text(json.dumps(cfg))
    return path


def test_sweep_ruler_section_resumes(tmp_path, tiny_checkpoint, corpora):
    cfg = load_config(write_config(tmp_path, tiny_checkpoint, corpora))
    first = run_sweep(cfg)
    # full once + weightedkv at one size, x 2 tasks x 1 length
    assert first["ruler_cells"] == 4 and first["ruler_tokens"] == 4 * 2 * (464 + 6)
    again = run_sweep(cfg)
    assert again["ruler_cells"] == 0 and again["cells_run"] == 0
    # Drop one ruler cell: only that one runs again.
    path = cfg.out_dir / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if '"kind": "ruler"' in line)
    dropped = json.loads(lines.pop(i))
    path.write_text("".join(lines))
    resumed = run_sweep(cfg)
    assert resumed["ruler_cells"] == 1 and resumed["cells_run"] == 0
    rows = [r for r in ResultStore(path).rows() if r.get("key", {}).get("kind") == "ruler"]
    assert len(rows) == 4 and rows[-1]["key"] == dropped["key"]
    report = (cfg.out_dir / "report.md").read_text()
    for task in ("niah_multivalue", "common_words"):
        table = report.split(f"### {task}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert table[0] == "| policy | cache | L=464 | mean |" and len(table) == 4
    assert "ruler, 3,760 prompt and answer tokens in" in report
    assert (cfg.out_dir / "ruler.png").read_bytes().startswith(PNG)
    # Other prompts (here another seed) are other cells.
    reseeded = load_config(write_config(tmp_path, tiny_checkpoint, corpora, seed=1,
                                        tasks=["common_words"]))
    assert run_sweep(reseeded)["ruler_cells"] == 2


def test_sweep_ruler_config_errors(tmp_path, tiny_checkpoint, corpora):
    def fails(needle, **section):
        with pytest.raises(UserError, match=re.escape(needle)):
            run_sweep(load_config(write_config(tmp_path, tiny_checkpoint, corpora, **section)))

    fails("[ruler]: unknown task 'haystack'", tasks=["haystack"])
    fails("[ruler]: unknown key(s) depths", depths=[0.5])
    fails("exceeds the model's context of 1024", lengths=[1020])
    fails("common_words length 200 is too short", lengths=[200])
    # common_words alone needs no haystack
    cfg = load_config(write_config(tmp_path, tiny_checkpoint, corpora, tasks=["common_words"]))
    assert not cfg.ruler.needs_haystack
    assert not (tmp_path / "out").exists()  # nothing ran


def test_shipped_ruler_grid():
    from conftest import ROOT
    grid = load_config(ROOT / "configs" / "results.toml")
    assert grid.ruler.lengths == [1024, 2048, 4096] and grid.ruler.cache_sizes == [256, 1024]
    assert grid.ruler.tasks == list(TASKS) and grid.ruler.corpus == grid.passkey.corpus
    assert [s.label for s in grid.ruler.policies] == [s.label for s in grid.passkey.policies]
    # SmolLM2-135M's context of 8192 holds the longest prompt and answer
    assert max(grid.ruler.lengths) + max(map(grid.ruler.tokens, TASKS)) <= 8192
