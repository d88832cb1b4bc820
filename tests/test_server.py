"""The OpenAI-compatible server on the default model, over loopback: the real `openai` client,
streaming and not; greedy output equal to generate.py's; conversations that reuse their cache;
a bounded load test (every request completes or gets a clean 429, none mixed, RSS flat); bad
input answered in OpenAI's error shape while every other stream goes on."""
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import ROOT, run_cli

MODEL = "SmolLM2-135M-Instruct"
CACHE = ["--cache", "weightedkv", "--cache_size", "512"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "serve.py"), "--port", str(self.port), *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve.py exited: {self.proc.stdout.read()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("serve.py did not start")

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path):
        c = self.conn(5)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()

    def post(self, path, body, timeout=120):
        c = self.conn(timeout)
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        c.request("POST", path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")

    def metrics(self) -> dict:
        text = self.get("/metrics")[1]
        return {m[1]: float(m[2]) for m in re.finditer(r"^(regionkv_\S+) (\S+)$", text, re.M)}

    def rss_mib(self) -> float:
        status = open(f"/proc/{self.proc.pid}/status").read()
        return int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024

    def client(self):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                             max_retries=0, timeout=120)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def server(default_checkpoint):
    s = Server(*CACHE, "--slots", "4", "--queue", "4")
    yield s
    s.close()


def test_models_and_health(server):
    assert [m.id for m in server.client().models.list().data] == [MODEL]
    status, body = server.get("/health")
    assert status == 200 and json.loads(body)["slots"] == 4


def test_completions_and_chat_whole_and_streamed(server):
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt="The capital of France is",
                                      max_tokens=12, temperature=0)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == 5 and whole.usage.total_tokens == 17
    streamed = client.completions.create(model=MODEL, prompt="The capital of France is",
                                         max_tokens=12, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0)
    assert chat.choices[0].finish_reason == "stop"  # the model's end of turn
    assert "Paris" in chat.choices[0].message.content
    parts = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == \
        chat.choices[0].message.content
    assert parts[-1].choices[0].finish_reason == "stop"


def test_stop_strings_and_seeds(server):
    client = server.client()
    full = client.completions.create(model=MODEL, prompt="One, two, three, four,",
                                     max_tokens=12, temperature=0).choices[0].text
    word = full.split(",")[1]  # cut before the second comma-separated item
    cut = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=12,
                                    temperature=0, stop=[word + ","])
    assert cut.choices[0].text == full[:full.index(word + ",")]
    assert cut.choices[0].finish_reason == "stop"
    draw = lambda: client.completions.create(model=MODEL, prompt="Once", max_tokens=10,  # noqa
                                             temperature=1.0, top_p=0.9, seed=5).choices[0].text
    assert draw() == draw()


@pytest.mark.parametrize("chat", [False, True])
def test_greedy_output_equals_generate_py(server, chat):
    prompt = "Write one sentence about the sea." if chat else "The old lighthouse keeper"
    out = run_cli("generate.py", "--prompt", prompt, "--max_new_tokens", 24, "--temperature", 0,
                  "--positions", "cache", "--json", *CACHE, *(["--chat"] if chat else []))
    assert out.returncode == 0, out.stderr
    expected = json.loads(out.stdout)["text"]
    client = server.client()
    if chat:
        got = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=24,
            temperature=0).choices[0].message.content
    else:
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                        temperature=0).choices[0].text
    assert got == expected


def test_a_chat_through_the_stateless_api_reads_only_each_new_turn(server):
    client = server.client()
    messages = [{"role": "system", "content": "You are brief."}]
    previous_total = 0  # prompt + reply tokens of the turn before
    for i, question in enumerate(["Name a fruit.", "Name another one.", "And a vegetable?"]):
        messages.append({"role": "user", "content": question})
        before = server.metrics()
        r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                           max_tokens=20)
        read = server.metrics()["regionkv_prefilled_tokens_total"] - \
            before["regionkv_prefilled_tokens_total"]
        cached = r.usage.prompt_tokens_details.cached_tokens
        if i:
            # the history is found: only the new turn (and the last reply token) is read
            assert cached > 0 and read == r.usage.prompt_tokens - cached
            assert cached == previous_total - 1
        previous_total = r.usage.prompt_tokens + r.usage.completion_tokens
        messages.append({"role": "assistant", "content": r.choices[0].message.content})


def test_load_every_request_completes_or_gets_429_and_nothing_is_mixed(server):
    prompts = ["The river", "In the morning", "A recipe for bread:", "Dear diary,"]
    client = server.client()
    alone = {p: client.completions.create(model=MODEL, prompt=p, max_tokens=8,
                                          temperature=0).choices[0].text for p in prompts}
    rss_before = server.rss_mib()

    def one(i):
        p = prompts[i % len(prompts)]
        status, body = server.post("/v1/completions", {"model": MODEL, "prompt": p,
                                                       "max_tokens": 8, "temperature": 0},
                                   timeout=300)
        return p, status, body

    with ThreadPoolExecutor(16) as pool:  # 16 clients x 4 requests
        results = list(pool.map(one, range(64)))
    done = [(p, b) for p, s, b in results if s == 200]
    refused = [b for p, s, b in results if s == 429]
    assert len(done) + len(refused) == 64
    assert len(done) >= 8 and refused  # 4 slots + 4 waiting: some are refused at once
    for p, body in done:
        assert body["choices"][0]["text"] == alone[p]
    assert all(b["error"]["code"] == "rate_limit_exceeded" for b in refused)
    metrics = server.metrics()
    assert metrics["regionkv_active_slots"] == 0 and metrics["regionkv_queue_length"] == 0
    grown = server.rss_mib() - rss_before
    assert grown < 48, f"RSS grew {grown:.0f} MiB over the load"


def test_a_client_that_disconnects_frees_its_row(server):
    other = threading.Thread(target=lambda: results.append(server.client().completions.create(
        model=MODEL, prompt="Count: one, two,", max_tokens=24, temperature=0)))
    results = []
    conn = server.conn()
    conn.request("POST", "/v1/completions",
                 # greedy: this prompt's continuation runs 400+ tokens without an end of text (a
                 # sampled one could end on its own before the hang-up, and not be "cancelled")
                 json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 100000,
                             "temperature": 0, "stream": True}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    other.start()
    assert response.readline().startswith(b"data: ")
    assert server.metrics()["regionkv_active_slots"] >= 1
    cancelled = lambda: server.metrics()['regionkv_finished_total{reason="cancelled"}']  # noqa
    start = cancelled()  # before the disconnect: the server may count it at once
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.time() + 30
    while cancelled() == start and time.time() < deadline:
        time.sleep(0.2)
    other.join(120)
    assert cancelled() == start + 1
    assert results and results[0].choices[0].finish_reason == "length"


BAD = [  # (body, status, code)
    (b"{not json", 400, None),
    ({"model": MODEL}, 400, "missing_required_parameter"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": -1}, 400, "invalid_value"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "invalid_type"),
    ({"model": MODEL, "prompt": "hi", "temperature": True}, 400, "invalid_type"),
    ({"model": MODEL, "prompt": "hi", "n": 3}, 400, "invalid_value"),
    ({"model": MODEL, "prompt": {"text": "hi"}}, 400, "invalid_type"),
    ({"model": MODEL, "prompt": [1, 2, 10**9]}, 400, "invalid_value"),
    ({"model": "gpt-4o", "prompt": "hi"}, 404, "model_not_found"),
    ({"prompt": "hi"}, 400, "missing_required_parameter"),
    ({"model": MODEL, "prompt": "hi", "stop": [1]}, 400, "invalid_type"),
]
BAD_CHAT = [
    ({"model": MODEL}, 400, "missing_required_parameter"),
    ({"model": MODEL, "messages": "hi"}, 400, "invalid_type"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, 400, "invalid_type"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400,
     "invalid_type"),
]


def test_bad_input_gets_an_openai_error_and_the_server_goes_on(server):
    for path, cases in (("/v1/completions", BAD), ("/v1/chat/completions", BAD_CHAT)):
        for body, status, code in cases:
            got, reply = server.post(path, body)
            assert got == status, (body, reply)
            assert reply["error"]["code"] == code and reply["error"]["message"], (body, reply)
            assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert server.get("/v1/nowhere")[0] == 404
    r = server.client().completions.create(model=MODEL, prompt="Still here:", max_tokens=3,
                                           temperature=0)  # a sampled end of text is rare, not 0
    assert r.usage.completion_tokens == 3


def test_metrics_are_prometheus_text(server):
    status, text = server.get("/metrics")
    assert status == 200
    for line in text.splitlines():
        assert line.startswith("# ") or re.fullmatch(r'regionkv_\w+(\{\w+="\w+"\})? \d+', line)
    names = server.metrics()
    for name in ("requests_total", "generated_tokens_total", "active_slots", "queue_length",
                 "cache_bytes"):
        assert f"regionkv_{name}" in names
    assert names["regionkv_cache_bytes"] > 0


def test_full_cache_refuses_a_prompt_longer_than_a_stream_holds(default_checkpoint):
    s = Server("--cache", "full", "--max_seq_length", "64", "--slots", "2")
    try:
        status, reply = s.post("/v1/completions", {"model": MODEL, "prompt": "word " * 100})
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
        assert "--max_seq_length" in reply["error"]["message"]
        r = s.client().completions.create(model=MODEL, prompt="Short", max_tokens=200,
                                          temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
        assert r.usage.prompt_tokens + r.usage.completion_tokens <= 64
    finally:
        s.close()


def test_one_shot_prompt_compression_serves_as_generate_py(default_checkpoint):
    # A prompt longer than the budget: snapkv reads it in one shot in the server as in
    # generate.py (the server used to read it chunk by chunk); its next turn continues it.
    flags = ["--cache", "weightedkv", "--cache_size", "64", "--prompt_compression", "snapkv"]
    prompt = (ROOT / "tests/data/kjv_genesis_1_2.txt").read_text()[:1200]
    out = run_cli("generate.py", "--prompt", prompt, "--max_new_tokens", 16, "--temperature", 0,
                  "--positions", "cache", "--json", *flags)
    assert out.returncode == 0, out.stderr
    s = Server(*flags, "--slots", "2")
    try:
        client = s.client()
        first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                          temperature=0)
        assert first.choices[0].text == json.loads(out.stdout)["text"]
        assert first.usage.prompt_tokens > 64
        more = prompt + first.choices[0].text + " And God said, Let there be light"
        second = client.completions.create(model=MODEL, prompt=more, max_tokens=8,
                                           temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens
        assert second.choices[0].finish_reason == "length"
    finally:
        s.close()


def test_serve_refuses_bad_flags():
    out = run_cli("serve.py", "--cache", "nope")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    out = run_cli("serve.py", "--cache", "full", "--kv_middle", "int8")
    assert out.returncode == 2 and "error:" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("serve.py", "--cache", "weightedkv", "--cache_size", "100000")
    assert out.returncode == 2 and "context" in out.stderr and "Traceback" not in out.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        out = run_cli("serve.py", "--port", taken.getsockname()[1])
    assert out.returncode == 2 and out.stderr.startswith("error: cannot listen on 127.0.0.1:")
    assert out.stderr.count("\n") == 1
