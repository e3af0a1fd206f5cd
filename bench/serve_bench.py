#!/usr/bin/env python3
"""Aggregate decode throughput and time to first token of an OpenAI-compatible server: `moekit serve`
or `llama-server`, measured by the same client. Not a test; never in CI.

    python3 bench/serve_bench.py --url http://127.0.0.1:8080 --clients 1,4,8 --prompt-tokens 16,128 \
        --max-tokens 64 --ttft-tokens 512

For each prompt length and client count: one warm-up request, then N concurrent requests to
/v1/completions (the prompt as token ids, so both servers see the same tokens; temperature 0,
`ignore_eos`), each a different prompt; tokens/s = the completion tokens summed over the N requests
(their `usage`) divided by the wall time from the first request sent to the last answer (prefill and
HTTP included). Time to first token: one streamed request of --ttft-tokens prompt tokens, from sending
to the first chunk with text (--reps times, the median). Standard library only.
"""
import argparse
import json
import random
import statistics
import threading
import time
import urllib.request


def post(url, body, stream=False):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=3600)


ID_RANGE = (1000, 20000)  # prompt token ids: ordinary tokens of a large vocabulary (--ids)


def prompt(rng, n):
    return [rng.randrange(*ID_RANGE) for _ in range(n)]


def completion(url, ids, max_tokens):
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    with post(url, body) as r:
        out = json.loads(r.read())
    return out["usage"]["completion_tokens"]


def aggregate(url, clients, prompt_tokens, max_tokens, rng):
    completion(url, prompt(rng, prompt_tokens), 4)  # warm-up
    prompts = [prompt(rng, prompt_tokens) for _ in range(clients)]
    counts = [0] * clients
    errors = []

    def run(i):
        try:
            counts[i] = completion(url, prompts[i], max_tokens)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"serve_bench: a request failed: {errors[0]}")
    if any(c != max_tokens for c in counts):
        raise SystemExit(f"serve_bench: completion tokens {counts}, expected {max_tokens} each (ignore_eos?)")
    return sum(counts) / wall


def ttft(url, n, rng):
    body = {"prompt": prompt(rng, n), "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    with post(url, body, stream=True) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter() - t0
                for _ in r:  # let the request finish
                    pass
                return first
    raise SystemExit("serve_bench: the stream carried no text")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--prompt-tokens", default="16,128")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-tokens", type=int, default=512, help="0: no time-to-first-token run")
    ap.add_argument("--reps", type=int, default=3, help="time-to-first-token runs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="server")
    ap.add_argument("--ids", default="1000,20000", help="the range prompt token ids are drawn from")
    args = ap.parse_args()
    global ID_RANGE
    ID_RANGE = tuple(int(x) for x in args.ids.split(","))
    rng = random.Random(args.seed)
    print(f"| {args.label} | prompt tokens | clients | tokens/s |")
    print("|---|---:|---:|---:|")
    for p in (int(x) for x in args.prompt_tokens.split(",")):
        for c in (int(x) for x in args.clients.split(",")):
            print(f"| {args.label} | {p} | {c} | {aggregate(args.url, c, p, args.max_tokens, rng):.2f} |", flush=True)
    if args.ttft_tokens:
        times = [ttft(args.url, args.ttft_tokens, rng) for _ in range(args.reps)]
        print(f"\n{args.label}: time to first token, {args.ttft_tokens}-token prompt: median "
              f"{statistics.median(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
