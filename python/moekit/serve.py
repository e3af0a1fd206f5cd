"""An OpenAI-compatible server over one moekit.Model, with continuous batching.

    python -m moekit.serve --model M.gguf [--host 127.0.0.1] [--port 8080] [--parallel 4] [--ctx N]
                           [--threads N] [--mode auto|exact|int8|bf16] [--api-key K]

Endpoints: ``GET /health`` (200 once the model is loaded), ``GET /v1/models``, ``POST /v1/completions``
(a prompt as text or token ids) and ``POST /v1/chat/completions`` (the model's own chat template,
rendered by moekit.chat as transformers renders it), each streamed as server-sent events (chunks, a
last chunk with ``finish_reason``, ``data: [DONE]``) or not. Parameters: ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``n`` = 1,
``stream_options.include_usage``, ``presence_penalty`` / ``frequency_penalty``, ``logprobs`` (and the chat
API's ``top_logprobs``), vLLM's ``return_token_ids`` and ``ignore_eos``; ``usage`` counts.

Batching: one engine thread owns the model. Up to ``--parallel`` requests run together, each step
one ``Model.step`` over all of them: every decoding request's next token and, in the rest of the
step's 256 rows, chunks of new requests' prompts (oldest first) — a long prompt is prefilled over
several steps while the others keep decoding, and each MoE block reads the experts of all those
rows once. A request's sequence is dropped when it ends or its client goes away. In the exact mode a
request's tokens do not depend on what runs beside it or on how its prompt was cut into chunks
(``Model.step``'s batch invariance).

Errors are OpenAI's ``{"error": {"message", "type", "code"}}`` with a 4xx status; the server never
exits on a request.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

import moekit
from moekit import chat
from moekit._cli import ContractParser


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error fields."""

    def __init__(self, status, message, type_="invalid_request_error", code=None):
        super().__init__(message)
        self.status, self.type, self.code = status, type_, code


class Job:
    """One request in the engine: its prompt, sampling, limits and the events its client reads."""

    def __init__(self, prompt_ids, max_tokens, sampler, stop, ignore_eos, logprobs=None, presence=0.0,
                 frequency=0.0, bias=None):
        self.prompt_ids = prompt_ids
        self.logprobs = logprobs  # None, or how many alternatives each token's logprobs list
        self.presence, self.frequency = presence, frequency  # OpenAI's penalties on generated tokens
        self.bias = bias  # None, or (ids, values): OpenAI's logit_bias, added to those logits
        self.max_tokens = max_tokens
        self.sampler = sampler
        self.stop = stop
        self.ignore_eos = ignore_eos
        # ("token", id, text, logprobs) ... then ("done", finish_reason) or ("error", msg); logprobs: None or
        # (the token's, [(id, logprob) of the most likely]) from the model's own distribution
        self.events = queue.Queue()
        self.cancelled = threading.Event()
        self.seq = None
        self.history = list(prompt_ids)
        self.generated = []
        self.stream = None
        self.text = ""  # decoded so far (stop strings are found in it)
        self.sent = 0  # characters of `text` handed to the client
        self.last = None
        self.cut = False  # a stop string ended the text: nothing after it goes out


class Engine:
    """Continuous batching over one model (see the module's docstring)."""

    def __init__(self, model, parallel, step_tokens=256):
        self.model = model
        self.parallel = parallel
        # Rows of one step: the decode tokens first, prompts' chunks in the rest (at least one row
        # of prompt a step, so a prompt always advances).
        self.step_tokens = max(int(step_tokens), parallel + 1)
        self.waiting = queue.Queue()
        self.prefilling = []  # admitted, their prompt not all run yet (oldest first)
        self.active = []  # decoding
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="moekit-engine", daemon=True)
        self.thread.start()

    def submit(self, job):
        self.waiting.put(job)
        self.wake.set()
        return job

    def _finish(self, job, reason):
        if job.seq is not None:
            job.seq = None  # the cache goes with it
        job.events.put(("done", reason))

    def _emit(self, job, token, logprobs=None):
        """Records `token`; returns a finish reason or None."""
        job.generated.append(token)
        job.history.append(token)
        job.text += job.stream.push(token)
        cut = None
        for s in job.stop:
            at = job.text.find(s, max(0, job.sent - len(s)))
            if at >= 0 and (cut is None or at < cut):
                cut = at
        if cut is not None:
            job.text = job.text[:cut]
            job.cut = True
        # hold back what could still become a stop string
        hold = 0
        if cut is None:
            for s in job.stop:
                for k in range(min(len(s) - 1, len(job.text)), 0, -1):
                    if job.text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
        end = len(job.text) - hold
        piece = job.text[job.sent:end]
        job.sent = max(job.sent, end)
        job.events.put(("token", token, piece, logprobs))
        if cut is not None:
            return "stop"
        if not job.ignore_eos and self.model.is_end_of_generation(token):
            return "stop"
        if len(job.generated) >= job.max_tokens:
            return "length"
        if job.seq.size >= job.seq.capacity:
            return "length"
        return None

    def _flush(self, job):
        rest = job.text[job.sent:] + ("" if job.cut else job.stream.flush())
        job.sent = len(job.text)
        if rest:
            job.events.put(("token", None, rest, None))

    def _admit(self):
        while len(self.active) + len(self.prefilling) < self.parallel:
            try:
                job = self.waiting.get_nowait()
            except queue.Empty:
                return
            if job.cancelled.is_set():
                continue
            try:
                job.seq = self.model.new_sequence()
                job.stream = self.model.text_stream()
            except Exception as e:  # noqa: BLE001 - a request's failure is its own
                job.events.put(("error", str(e)))
                continue
            job.fed = 0
            self.prefilling.append(job)

    def _batch(self):
        """This step's rows: every decoding job's last token, then prompt chunks, oldest first."""
        batch = [(j, [j.last]) for j in self.active]
        budget = self.step_tokens - len(batch)
        for j in self.prefilling:
            if budget <= 0:
                break
            n = min(budget, len(j.prompt_ids) - j.fed)
            batch.append((j, j.prompt_ids[j.fed:j.fed + n]))
            budget -= n
        return batch

    def _step(self, batch):
        """Model.step over the batch: logits row per job, or an exception for a job whose part failed
        (the step refuses before appending anything, so the others run again without it)."""
        try:
            return list(self.model.step([j.seq for j, _ in batch], [ids for _, ids in batch]))
        except Exception:  # noqa: BLE001 - find whose part it was: each alone
            out = []
            for j, ids in batch:
                try:
                    out.append(self.model.step([j.seq], [ids])[0])
                except Exception as e:  # noqa: BLE001
                    out.append(e)
            return out

    def _run(self):
        while True:
            self._admit()
            for j in self.active + self.prefilling:
                if j.cancelled.is_set():
                    self._finish(j, "cancelled")
            self.active = [j for j in self.active if not j.cancelled.is_set()]
            self.prefilling = [j for j in self.prefilling if not j.cancelled.is_set()]
            if not self.active and not self.prefilling:
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            batch = self._batch()
            rows = self._step(batch)
            still = []
            for (j, ids), row in zip(batch, rows):
                prefill = j in self.prefilling
                if isinstance(row, Exception):
                    j.events.put(("error", str(row)))
                    if prefill:
                        self.prefilling.remove(j)
                    continue
                if prefill:
                    j.fed += len(ids)
                    if j.fed < len(j.prompt_ids):
                        continue
                    self.prefilling.remove(j)
                token = j.sampler.sample(_penalized(row, j), j.history)
                reason = self._emit(j, token, None if j.logprobs is None else _logprobs(row, token, j.logprobs))
                if reason:
                    self._flush(j)
                    self._finish(j, reason)
                else:
                    j.last = token
                    still.append(j)
            self.active = still


def _penalized(row, job):
    """The row the sampler draws from: OpenAI's presence and frequency penalties on the tokens
    generated so far, logit − presence − frequency · count (vLLM's rule: the output's tokens, not
    the prompt's), then the request's logit_bias added to its tokens' logits."""
    penalize = (job.presence or job.frequency) and job.generated
    if not penalize and job.bias is None:
        return row
    out = np.array(row, dtype=np.float32)
    if penalize:
        ids, counts = np.unique(np.asarray(job.generated, dtype=np.int64), return_counts=True)
        out[ids] -= np.float32(job.presence) + np.float32(job.frequency) * counts.astype(np.float32)
    if job.bias is not None:
        out[job.bias[0]] += job.bias[1]
    return out


def _logit_bias(body, vocab):
    """OpenAI's logit_bias: {token id (a string or an integer): bias in [-100, 100]}, as (ids, values)."""
    bias = body.get("logit_bias")
    if bias is None or bias == {}:
        return None
    if not isinstance(bias, dict):
        raise RequestError(400, "'logit_bias' must be an object of token ids to numbers", code="invalid_value")
    chosen = {}  # "5" and "05" name one token: the later one counts
    for key, v in bias.items():
        try:
            i = int(key)
        except ValueError:
            i = None
        if i is None or not 0 <= i < vocab:
            raise RequestError(400, f"logit_bias: '{key}' is not a token id in [0, {vocab})", code="invalid_value")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise RequestError(400, f"logit_bias: token {i}'s bias must be a number in [-100, 100]",
                               code="invalid_value")
        chosen[i] = v
    return np.asarray(list(chosen), dtype=np.int64), np.asarray(list(chosen.values()), dtype=np.float32)


def _logprobs(row, token, k):
    """log-softmax of the model's row (before penalties and sampling's temperature, as vLLM reports
    them), in float64: the token's and the k most likely, most likely first."""
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    lp = x - (m + np.log(np.exp(x - m).sum()))
    top = []
    k = min(k, lp.size)
    if k:
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.lexsort((idx, -lp[idx]))]
        top = [(int(i), float(lp[i])) for i in idx]
    return float(lp[token]), top


def _number(body, key, default, lo, hi, integer=False):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise RequestError(400, f"'{key}' must be {'an integer' if integer else 'a number'}", code="invalid_value")
    if not lo <= v <= hi:
        raise RequestError(400, f"'{key}' is {v}, outside [{lo}, {hi}]", code="invalid_value")
    return v


class Server:
    def __init__(self, model, name, parallel, api_key=None):
        self.model = model
        self.name = name
        self.api_key = api_key
        self.engine = Engine(model, parallel)
        self.created = int(time.time())

    def job(self, body, prompt_ids, chat_request=False):
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        if body.get("n", 1) != 1:
            raise RequestError(400, "only n = 1 is supported", code="invalid_value")
        ctx = self.model.info["ctx"]
        if len(prompt_ids) == 0:
            raise RequestError(400, "the prompt is empty")
        if len(prompt_ids) >= ctx:
            raise RequestError(400, f"the prompt's {len(prompt_ids)} tokens reach the context of {ctx}",
                               code="context_length_exceeded")
        vocab = self.model.vocab_size
        if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab for i in prompt_ids):
            raise RequestError(400, f"prompt token ids must be integers in [0, {vocab})", code="invalid_value")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = ctx - len(prompt_ids) if max_tokens is None else _number(
            {"max_tokens": max_tokens}, "max_tokens", 16, 1, 1 << 20, integer=True)
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        seed = _number(body, "seed", None, 0, (1 << 63) - 1, integer=True)
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise RequestError(400, "'stop' must be a string or up to 4 non-empty strings", code="invalid_value")
        presence = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
        frequency = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
        logprobs = self.logprobs_of(body, chat_request)
        bias = _logit_bias(body, vocab)
        if top_p == 0:  # OpenAI's top_p 0: the most likely token only
            temperature, top_p = 0.0, 1.0
        sampler = moekit.Sampler(temperature=float(temperature), top_p=float(top_p),
                                 seed=seed if seed is not None else uuid.uuid4().int & ((1 << 63) - 1))
        return Job(list(prompt_ids), max_tokens, sampler, stop, bool(body.get("ignore_eos", False)), logprobs,
                   float(presence), float(frequency), bias)

    def logprobs_json(self, entries, chat_request):
        """OpenAI's logprobs object for (token id, (logprob, [(id, logprob)])) entries: the chat API's
        `content` list (token, logprob, bytes, top_logprobs) or the completions API's parallel lists. A
        token that is part of a UTF-8 character is spelled "bytes:\\xe2\\x80", as OpenAI spells it."""
        def piece(i):
            if not self.model.has_tokenizer:  # a file without one: the id stands for the token
                return f"token_id:{i}", []
            b = self.model.token_bytes(i)
            try:
                return b.decode("utf-8"), list(b)
            except UnicodeDecodeError:  # part of a character: OpenAI's spelling of its bytes
                return "bytes:" + "".join(f"\\x{c:02x}" for c in b), list(b)

        if chat_request:
            content = []
            for tok, (lp, top) in entries:
                text, raw = piece(tok)
                alternatives = [(piece(i), v) for i, v in top]
                content.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": b} for (t, b), v in alternatives]})
            return {"content": content}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = 0
        for tok, (lp, top) in entries:
            text = piece(tok)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({piece(i)[0]: v for i, v in top})
            out["text_offset"].append(offset)
            offset += len(text)
        return out

    @staticmethod
    def logprobs_of(body, chat_request):
        """How many alternatives each token's logprobs list (None: no logprobs): the completions API's
        `logprobs` (an integer), the chat API's `logprobs` (true) with `top_logprobs`."""
        if not chat_request:
            return _number(body, "logprobs", None, 0, 20, integer=True)
        want = body.get("logprobs")
        if want is not None and not isinstance(want, bool):
            raise RequestError(400, "'logprobs' must be true or false", code="invalid_value")
        top = _number(body, "top_logprobs", None, 0, 20, integer=True)
        if top is not None and not want:
            raise RequestError(400, "'top_logprobs' needs 'logprobs': true", code="invalid_value")
        return (top or 0) if want else None

    def prompt_of(self, body, chat_request):
        tokenize = lambda text: self.model.tokenize(text, add_special=not chat_request, parse_special=True)  # noqa: E731
        if chat_request:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise RequestError(400, "'messages' must be a non-empty list of message objects")
            template = self.model.chat_template
            if template is None:
                raise RequestError(400, "the model's file has no chat template: use /v1/completions")
            special = self.model.special_tokens
            try:
                text = chat.render(template, messages, add_generation_prompt=True, tools=body.get("tools"),
                                   bos_token=special["bos_token"] or "", eos_token=special["eos_token"] or "",
                                   **(body.get("chat_template_kwargs") or {}))
            except Exception as e:  # noqa: BLE001 - the template's own error (raise_exception)
                raise RequestError(400, f"the chat template refused the messages: {e}") from e
            return tokenize(text)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not self.model.has_tokenizer:
                raise RequestError(400, "the model has no tokenizer: give the prompt as token ids")
            return tokenize(prompt)
        if isinstance(prompt, list):
            return prompt
        raise RequestError(400, "'prompt' must be a string or a list of token ids")


def make_handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: one line per request on stderr is noise under load
            pass

        def _send(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: RequestError):
            self._send(e.status, {"error": {"message": str(e), "type": e.type, "code": e.code}})

        def _authorized(self):
            if server.api_key is None:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {server.api_key}":
                return True
            self._error(RequestError(401, "a valid API key is required (Authorization: Bearer ...)",
                                     "authentication_error", "invalid_api_key"))
            return False

        def do_GET(self):  # noqa: N802
            try:
                if self.path == "/health":
                    return self._send(200, {"status": "ok"})
                if not self._authorized():
                    return None
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [
                        {"id": server.name, "object": "model", "created": server.created, "owned_by": "moekit"}]})
                raise RequestError(404, f"no route GET {self.path}", code="not_found")
            except RequestError as e:
                self._error(e)

        def do_POST(self):  # noqa: N802
            try:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length > 0 else b""
                if not self._authorized():
                    return None
                chat_request = self.path == "/v1/chat/completions"
                if not chat_request and self.path != "/v1/completions":
                    raise RequestError(404, f"no route POST {self.path}", code="not_found")
                try:
                    body = json.loads(raw)
                except ValueError as e:
                    raise RequestError(400, f"the body is not valid JSON: {e}") from e
                if not isinstance(body, dict):
                    raise RequestError(400, "the body must be a JSON object")
                prompt_ids = server.prompt_of(body, chat_request)
                job = server.engine.submit(server.job(body, prompt_ids, chat_request))
                self._answer(body, job, chat_request)
            except RequestError as e:
                self._error(e)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _answer(self, body, job, chat_request):
            rid = ("chatcmpl-" if chat_request else "cmpl-") + uuid.uuid4().hex[:24]
            kind = "chat.completion" if chat_request else "text_completion"
            created = int(time.time())
            want_ids = bool(body.get("return_token_ids"))
            stream = bool(body.get("stream"))
            usage = lambda: {"prompt_tokens": len(job.prompt_ids), "completion_tokens": len(job.generated),  # noqa: E731
                             "total_tokens": len(job.prompt_ids) + len(job.generated)}

            def choice(text, reason, delta, entries=()):
                c = {"index": 0, "finish_reason": reason, "logprobs": None}
                if job.logprobs is not None and (entries or not delta):
                    c["logprobs"] = server.logprobs_json(entries, chat_request)
                if chat_request:
                    c["delta" if delta else "message"] = ({"content": text} if delta else
                                                          {"role": "assistant", "content": text})
                else:
                    c["text"] = text
                return c

            if not stream:
                text, reason, entries = [], None, []
                while reason is None:
                    ev = job.events.get()
                    if ev[0] == "token":
                        text.append(ev[2])
                        if ev[3] is not None:
                            entries.append((ev[1], ev[3]))
                    elif ev[0] == "error":
                        raise RequestError(500, ev[1], "server_error")
                    else:
                        reason = ev[1]
                c = choice("".join(text), reason, False, entries)
                out = {"id": rid, "object": kind, "created": created, "model": server.name, "choices": [c],
                       "usage": usage()}
                if want_ids:
                    out["prompt_token_ids"] = job.prompt_ids
                    c["token_ids"] = job.generated
                return self._send(200, out)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            chunk_kind = "chat.completion.chunk" if chat_request else "text_completion"

            def send(obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            try:
                if chat_request:
                    send({"id": rid, "object": chunk_kind, "created": created, "model": server.name,
                          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "finish_reason": None}]})
                first = True
                while True:
                    ev = job.events.get()
                    if ev[0] == "token":
                        c = choice(ev[2], None, True, [(ev[1], ev[3])] if ev[3] is not None else [])
                        if want_ids:
                            c["token_ids"] = [ev[1]] if ev[1] is not None else []
                        chunk = {"id": rid, "object": chunk_kind, "created": created, "model": server.name,
                                 "choices": [c]}
                        if want_ids and first:
                            chunk["prompt_token_ids"] = job.prompt_ids
                        first = False
                        send(chunk)
                    elif ev[0] == "error":
                        send({"error": {"message": ev[1], "type": "server_error", "code": None}})
                        break
                    else:
                        send({"id": rid, "object": chunk_kind, "created": created, "model": server.name,
                              "choices": [choice("", ev[1], True)]})
                        if (body.get("stream_options") or {}).get("include_usage"):
                            send({"id": rid, "object": chunk_kind, "created": created, "model": server.name,
                                  "choices": [], "usage": usage()})
                        break
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                job.cancelled.set()  # the client went away: the engine drops its sequence
            self.close_connection = True

    return Handler


def main(argv=None):
    ap = ContractParser("serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file or a release folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--parallel", type=int, default=4, help="requests decoding together (default 4)")
    ap.add_argument("--ctx", type=int, default=0, help="context of each sequence (0: the model's, up to 4096)")
    ap.add_argument("--threads", type=int, default=0, help="compute threads (0: moekit's default)")
    ap.add_argument("--mode", default="auto", choices=["auto", "exact", "int8", "bf16"])
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    args = ap.parse_args(argv)
    if not 1 <= args.parallel <= 256:
        ap.error(f"--parallel {args.parallel}: expected 1..256")
    if args.threads:
        moekit.set_num_threads(args.threads)
    try:
        model = moekit.Model(args.model, ctx=args.ctx, mode=args.mode)
    except (ValueError, RuntimeError, OSError) as e:
        ap.error(str(e))
    server = Server(model, model.info["path"].rstrip("/").split("/")[-1], args.parallel, args.api_key)
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(server))
    httpd.daemon_threads = True
    print(f"moekit serve: http://{args.host}:{httpd.server_address[1]} ({server.name}, parallel {args.parallel})",
          flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
