#!/usr/bin/env python3
"""Whole-model figures of moekit as transformers' experts backend, against grouped_mm, same run.

A small Qwen3-MoE causal LM with random weights at Qwen3-30B-A3B's expert shape (D = 2048,
F = 768, 128 experts, top-8; --layers of them, a 1024-token vocabulary so the LM head stays
small) is timed with experts_implementation "grouped_mm" and "moekit", alternating (A B A B):
  prefill   model(input_ids) over --prefill tokens (batch 1), tokens/s
  decode    generate(max_new_tokens=--decode) greedy from an 8-token prompt, tokens/s of the new ones
  train     one fine-tuning step (forward + backward of the loss over --train-tokens tokens), s
and, for prefill and decode, the share of the time spent inside the experts calls (timed by
wrapping each backend's function). Run inside build-peers/venv (bench/peers/setup.sh), from the
repository root:
    PYTHONPATH=build/python build-peers/venv/bin/python bench/peers/transformers_backend.py \
        --dtype fp32 --threads 2 [--json-out FILE]
The thread setting is the one docs/python.md recommends: torch.set_num_threads(N),
moekit.set_num_threads(N), OMP_WAIT_POLICY=PASSIVE (set here before torch loads).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.integrations import moe as tmoe  # noqa: E402

import moekit  # noqa: E402
import moekit.transformers as mtf  # noqa: E402


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def build(layers, dtype):
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=768,
        norm_topk_prob=True, decoder_sparse_step=1, vocab_size=1024, max_position_embeddings=4096,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model.eval()


class ExpertsTimer:
    """Wraps every registered experts function to add up the seconds spent in it."""

    def __init__(self):
        self.seconds = 0.0
        self.saved = {}

    def __enter__(self):
        for name in ("grouped_mm", mtf.NAME):
            fn = tmoe.ALL_EXPERTS_FUNCTIONS[name]
            self.saved[name] = fn

            def timed(*a, _fn=fn, **k):
                t0 = time.perf_counter()
                out = _fn(*a, **k)
                self.seconds += time.perf_counter() - t0
                return out

            tmoe.ExpertsInterface._global_mapping[name] = timed
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            tmoe.ExpertsInterface._global_mapping[name] = fn


def timed(fn):
    with ExpertsTimer() as t:
        t0 = time.perf_counter()
        fn()
        total = time.perf_counter() - t0
    return total, t.seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--train-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per measurement (medians reported)")
    ap.add_argument("--skip", default="", help="comma list of prefill,decode,train to leave out")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    moekit.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    model = build(a.layers, dtype)
    skip = set(filter(None, a.skip.split(",")))
    backends = ["grouped_mm", mtf.NAME]
    gen = torch.Generator().manual_seed(1)
    rows = []

    def measure(what, run, count):
        per = {b: [] for b in backends}
        for _ in range(a.rounds):
            for b in backends:
                model.set_experts_implementation(b)
                per[b].append(timed(run))
        for b in backends:
            total = statistics.median(t for t, _ in per[b])
            experts = statistics.median(e for _, e in per[b])
            row = dict(what=what, backend=b, seconds=total, experts_share=experts / total if total else 0.0)
            if count:
                row["tokens_per_s"] = count / total
            rows.append(row)
            print(json.dumps(row), flush=True)

    if "prefill" not in skip:
        ids = torch.randint(0, 1024, (1, a.prefill), generator=gen)
        with torch.inference_mode():
            model(ids)  # warm-up (allocations, the first transposed copies)

            def prefill():
                model(ids)

            measure("prefill", prefill, a.prefill)
    if "decode" not in skip:
        prompt = torch.randint(0, 1024, (1, 8), generator=gen)
        kw = dict(max_new_tokens=a.decode, min_new_tokens=a.decode, do_sample=False, pad_token_id=0)

        def decode():
            with torch.inference_mode():
                model.generate(prompt, **kw)

        decode()
        measure("decode", decode, a.decode)
    if "train" not in skip:
        ids = torch.randint(0, 1024, (1, a.train_tokens), generator=gen)
        model.train()

        def step():
            model.zero_grad(set_to_none=True)
            model(ids, labels=ids).loss.backward()

        step()
        measure("train_step", step, 0)
        model.eval()
    for what in ("prefill", "decode", "train_step"):
        got = {r["backend"]: r for r in rows if r["what"] == what}
        if len(got) == 2:
            ratio = got["grouped_mm"]["seconds"] / got[mtf.NAME]["seconds"]
            print(f"{what}: moekit {ratio:.2f}x grouped_mm "
                  f"(experts share: grouped_mm {got['grouped_mm']['experts_share']:.0%}, "
                  f"moekit {got[mtf.NAME]['experts_share']:.0%})")
    meta = dict(cpu=cpu_name(), threads=a.threads, dtype=a.dtype, layers=a.layers, torch=torch.__version__,
                transformers=transformers.__version__, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    print(json.dumps(meta))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
