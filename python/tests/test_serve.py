"""moekit.serve: the OpenAI-compatible server, in-process on a free port, over the tiny qwen3moe model with
a Qwen3-style tokenizer and chat template beside it. Raw HTTP (urllib) always; the `openai` client where it is
installed (skipped visibly otherwise)."""

import json
import pathlib
import shutil
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("jinja2", reason="moekit.serve renders chat templates with jinja2 (scripts/setup.sh)")

import moekit  # noqa: E402
from moekit import serve  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "goldens"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def bytes_to_unicode():
    # GPT-2's byte-level alphabet: every byte as a printable character
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(
        range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_tokenizer():
    """A byte-level tokenizer.json of exactly the tiny model's 256 ids: bytes 0x00-0xFD (0xFE and 0xFF never
    occur in UTF-8) and the two chat specials, no merges."""
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(254)}
    added = [{"id": 254 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(["<|im_start|>", "<|im_end|>"])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve") / "tiny-qwen3moe"
    shutil.copytree(ROOT / "models" / "qwen3moe", d)
    (d / "tokenizer.json").write_text(json.dumps(tiny_tokenizer()))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>",
                                                         "bos_token": None}))
    return d


def start(folder, api_key=None, parallel=4):
    model = moekit.Model(str(folder), mode="exact")
    srv = serve.Server(model, "tiny", parallel, api_key)
    httpd = serve.ThreadingHTTPServer(("127.0.0.1", 0), serve.make_handler(srv))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return model, httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture(scope="module")
def server(folder):
    model, httpd, url = start(folder)
    yield model, url
    httpd.shutdown()


def call(url, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def events(text):
    lines = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_health_and_models(server):
    _, url = server
    assert call(url, "/health") == (200, '{"status": "ok"}')
    status, text = call(url, "/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == "tiny"


def test_completion_from_ids_is_generate(server):
    model, url = server
    prompt = [5, 17, 99, 3]
    want = model.generate(prompt, max_tokens=8)["ids"]
    status, text = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                 "return_token_ids": True, "ignore_eos": True})
    assert status == 200, text
    out = json.loads(text)
    assert out["prompt_token_ids"] == prompt
    assert out["choices"][0]["token_ids"] == want[:8]
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}
    assert out["choices"][0]["finish_reason"] == "length"


def log_softmax(row):
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def spelled(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{c:02x}" for c in b)


def test_logprobs_are_the_models_own_log_softmax(server):
    model, url = server
    prompt = [5, 17, 99, 3]
    status, text = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 3,
                                                 "return_token_ids": True, "ignore_eos": True})
    assert status == 200, text
    c = json.loads(text)["choices"][0]
    ids, lp = c["token_ids"], c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids) == 4
    seq = model.new_sequence()
    row = model.forward(seq, prompt)[0]
    for t, tok in enumerate(ids):
        want = log_softmax(row)
        assert lp["token_logprobs"][t] == pytest.approx(want[tok], abs=1e-12)
        top = lp["top_logprobs"][t]
        assert len(top) == 3 and max(top.values()) == pytest.approx(want.max(), abs=1e-12)
        assert lp["tokens"][t] == spelled(model.token_bytes(tok))
        row = model.forward(seq, [tok])[0]
    assert lp["text_offset"][0] == 0
    # The chat API: logprobs true with top_logprobs, the same numbers in its own shape, streamed too.
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "ignore_eos": True}
    whole = json.loads(call(url, "/v1/chat/completions", body)[1])["choices"][0]["logprobs"]["content"]
    assert len(whole) == 3 and all(len(e["top_logprobs"]) == 2 and spelled(bytes(e["bytes"])) == e["token"]
                                   for e in whole)
    chunks = events(call(url, "/v1/chat/completions", {**body, "stream": True})[1])
    streamed = [e for ch in chunks for e in ((ch["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert streamed == whole


def test_penalties_follow_openais_rule(server):
    model, url = server
    prompt, presence, frequency = [40, 41, 42], 0.5, 2.0
    status, text = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                 "presence_penalty": presence, "frequency_penalty": frequency,
                                                 "return_token_ids": True, "ignore_eos": True})
    assert status == 200, text
    got = json.loads(text)["choices"][0]["token_ids"]
    seq, want = model.new_sequence(), []
    row = model.forward(seq, prompt)[0]
    for _ in range(12):  # logit − presence − frequency · count over the tokens generated so far, then greedy
        x = row.astype(np.float32).copy()
        for tok in set(want):
            x[tok] -= np.float32(presence) + np.float32(frequency) * np.float32(want.count(tok))
        want.append(int(np.argmax(x)))
        row = model.forward(seq, [want[-1]])[0]
    assert got == want
    plain = json.loads(call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                     "return_token_ids": True, "ignore_eos": True})[1])
    assert plain["choices"][0]["token_ids"] != want  # the penalties changed something here


def test_logit_bias_is_added_to_its_tokens_logits(server):
    model, url = server
    prompt = [40, 41, 42]
    seq = model.new_sequence()
    row = model.forward(seq, prompt)[0].astype(np.float32)
    order = np.argsort(-row)
    banned, lifted = int(order[0]), int(order[5])  # the greedy token barred, the sixth one lifted
    bias = {str(banned): -100, lifted: 7.5}
    status, text = call(url, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                 "logit_bias": bias, "return_token_ids": True, "ignore_eos": True})
    assert status == 200, text
    got = json.loads(text)["choices"][0]["token_ids"]
    seq, want = model.new_sequence(), []
    row = model.forward(seq, prompt)[0]
    for _ in range(6):  # logit + bias on the named tokens, then greedy
        x = row.astype(np.float32).copy()
        x[banned] += np.float32(-100)
        x[lifted] += np.float32(7.5)
        want.append(int(np.argmax(x)))
        row = model.forward(seq, [want[-1]])[0]
    assert got == want and banned not in got


def test_streamed_chat_equals_the_whole_answer(server):
    _, url = server
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    whole = json.loads(call(url, "/v1/chat/completions", body)[1])
    status, text = call(url, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    chunks = events(text)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == whole["choices"][0]["message"]["content"]
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    ids = [i for c in chunks if c["choices"] for i in c["choices"][0].get("token_ids", [])]
    assert ids == whole["choices"][0]["token_ids"]


def test_concurrent_requests_get_what_they_get_alone(server):
    _, url = server
    prompts = [[1, 2, 3], [40, 41], [7, 8, 9, 10, 11], [100], [5, 5, 5], [60, 61, 62]]
    body = lambda p: {"prompt": p, "max_tokens": 10, "temperature": 0, "ignore_eos": True,  # noqa: E731
                      "return_token_ids": True}
    alone = [json.loads(call(url, "/v1/completions", body(p))[1])["choices"][0]["token_ids"] for p in prompts]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda p: json.loads(call(url, "/v1/completions", body(p))[1]), prompts))
    assert [t["choices"][0]["token_ids"] for t in together] == alone


class RecordingModel:
    """moekit.Model with every step's rows recorded: (the number of sequences, the rows of each)."""

    def __init__(self, model):
        self.model, self.steps = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, seqs, ids):
        self.steps.append([len(x) for x in ids])
        return self.model.step(seqs, ids)


def run_engine(engine, prompt, max_tokens, started=None):
    job = engine.submit(serve.Job(prompt, max_tokens, moekit.Sampler(), [], ignore_eos=True))
    out = []
    while True:
        ev = job.events.get(timeout=60)
        if ev[0] == "token" and ev[1] is not None:
            out.append(ev[1])
            if started is not None:
                started.set()
        elif ev[0] != "token":
            assert ev == ("done", "length"), ev
            return out


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode(folder):
    model = moekit.Model(str(folder), mode="exact")
    long_prompt = [(7 * i + 3) % 250 for i in range(40)]
    alone_short = run_engine(serve.Engine(model, parallel=2, step_tokens=4), [1, 2, 3], 60)
    alone_long = run_engine(serve.Engine(model, parallel=2, step_tokens=4), long_prompt, 5)
    rec = RecordingModel(model)
    engine = serve.Engine(rec, parallel=2, step_tokens=4)
    started = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        short = pool.submit(run_engine, engine, [1, 2, 3], 60, started)
        assert started.wait(60)
        long = pool.submit(run_engine, engine, long_prompt, 5)
        assert short.result() == alone_short and long.result() == alone_long
    assert all(sum(rows) <= 4 for rows in rec.steps)  # no step past its rows
    mixed = [rows for rows in rec.steps if len(rows) == 2 and rows[0] == 1 and rows[1] == 3]
    assert len(mixed) >= 10, rec.steps  # the long prompt went 3 rows a step beside the short one's decoding


class ScriptedModel:
    """A stand-in for moekit.Model whose greedy continuation is a script of token ids, each one piece of
    text: the engine's stop strings, hold-back and end-of-generation checked without a real model."""

    PIECES = ["Hel", "lo", " wor", "ld", "!", " Bye", "<end>"]

    def __init__(self):
        import numpy as np
        self.np = np
        self.vocab_size = len(self.PIECES)

    class Seq:
        def __init__(self):
            self.n, self.capacity, self.started = 0, 64, False

        @property
        def size(self):
            return self.n

    class Stream:
        def __init__(self, pieces):
            self.pieces = pieces

        def push(self, i):
            return self.pieces[i]

        def flush(self):
            return ""

    def new_sequence(self):
        return self.Seq()

    def text_stream(self):
        return self.Stream(self.PIECES)

    def is_end_of_generation(self, i):
        return self.PIECES[i] == "<end>"

    def _row(self, seq):
        row = self.np.zeros(self.vocab_size, dtype=self.np.float32)
        row[min(seq.n, self.vocab_size - 1)] = 1.0  # the script: 0, 1, 2, ... after the prompt
        return row

    def step(self, seqs, ids):  # the prompt gives the script's first token, each decode token the next
        for s, chunk in zip(seqs, ids):
            s.n = 0 if not s.started else s.n + len(chunk)
            s.started = True
        return self.np.stack([self._row(s) for s in seqs])


def run_scripted(stop, max_tokens=20):
    engine = serve.Engine(ScriptedModel(), parallel=2)
    job = engine.submit(serve.Job([0], max_tokens, moekit.Sampler(), stop, ignore_eos=False))
    pieces, reason = [], None
    while reason is None:
        ev = job.events.get(timeout=10)
        if ev[0] == "token":
            pieces.append(ev[2])
        else:
            reason = ev[1]
    return pieces, reason


def test_stop_strings_end_the_text_before_them_and_hold_back_their_prefixes():
    pieces, reason = run_scripted([])
    assert "".join(pieces) == "Hello world! Bye<end>" and reason == "stop"  # the end-of-generation token
    pieces, reason = run_scripted(["o w"])  # across pieces
    assert "".join(pieces) == "Hell" and reason == "stop"
    assert pieces[0] == "Hel"  # "lo" waits: "o" may begin "o w"
    pieces, reason = run_scripted(["world!!"])  # a prefix held back, then released
    assert "".join(pieces) == "Hello world! Bye<end>"
    pieces, reason = run_scripted(["Bye"], max_tokens=3)
    assert "".join(pieces) == "Hello wor" and reason == "length"


@pytest.mark.parametrize("path,body,raw,status,needle", [
    ("/v1/completions", None, b"{not json", 400, "not valid JSON"),
    ("/v1/nothing", {}, None, 404, "no route"),
    ("/v1/chat/completions", {"messages": []}, None, 400, "messages"),
    ("/v1/completions", {"prompt": [1], "temperature": 9}, None, 400, "temperature"),
    ("/v1/completions", {"prompt": [1], "n": 2}, None, 400, "n = 1"),
    ("/v1/completions", {"prompt": [999999]}, None, 400, "token ids"),
    ("/v1/completions", {"prompt": list(range(1, 200)) * 40}, None, 400, "context"),
    ("/v1/completions", {"prompt": 5}, None, 400, "prompt"),
    ("/v1/completions", {"prompt": [1], "logprobs": 21}, None, 400, "logprobs"),
    ("/v1/completions", {"prompt": [1], "frequency_penalty": 2.5}, None, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"x": 1}}, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"999999": 1}}, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"3": 101}}, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "logit_bias": [3]}, None, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, None, 400,
     "needs 'logprobs'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, None, 400,
     "true or false"),
])
def test_bad_requests_are_openai_errors(server, path, body, raw, status, needle):
    _, url = server
    got, text = call(url, path, body, raw=raw)
    assert got == status, text
    err = json.loads(text)["error"]
    assert needle in err["message"] and "type" in err and "code" in err


def test_api_key_is_enforced(folder):
    _, httpd, url = start(folder, api_key="secret")
    try:
        assert call(url, "/v1/models")[0] == 401
        assert call(url, "/v1/models", headers={"Authorization": "Bearer secret"})[0] == 200
        assert call(url, "/health")[0] == 200
    finally:
        httpd.shutdown()


def test_a_client_that_leaves_costs_only_its_request(server):
    import socket
    _, url = server
    host, port = url[len("http://"):].split(":")
    s = socket.create_connection((host, int(port)))
    body = json.dumps({"prompt": [1, 2], "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.recv(100)
    s.close()
    assert call(url, "/health")[0] == 200
    assert json.loads(call(url, "/v1/completions", {"prompt": [3], "max_tokens": 2})[1])["usage"]["completion_tokens"] >= 1


def test_the_openai_client(server):
    openai = pytest.importorskip("openai", reason="the openai package is not installed")
    _, url = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens >= 1
    stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, stream=True)
    assert sum(1 for _ in stream) >= 1


def test_the_moekit_serve_command(folder):
    import os
    import subprocess
    cli = os.environ.get("MOEKIT_CLI")
    if not cli:
        pytest.skip("MOEKIT_CLI is not set (ctest sets it to the build's moekit)")
    p = subprocess.Popen([cli, "serve", "--model", str(folder), "--port", "0", "--parallel", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("moekit serve: http://127.0.0.1:"), line + p.stderr.read()
        url = line.split()[2]
        assert call(url, "/health")[0] == 200
        out = json.loads(call(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                            "max_tokens": 3})[1])
        assert out["usage"]["completion_tokens"] >= 1
    finally:
        p.terminate()
        p.wait(timeout=30)
    bad = subprocess.run([cli, "serve", "--model", str(folder / "missing")], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("moekit: error: serve: "), bad.stderr
