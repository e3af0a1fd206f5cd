#!/usr/bin/env python3
"""Generate with a Hugging Face MoE model whose experts run on moekit, beside transformers' grouped_mm.

    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=build/python build-peers/venv/bin/python \
        examples/transformers_generate.py --model /path/to/Qwen3-30B-A3B [--prompt "..."] [--tokens 64]

Without --model it builds a small random Qwen3-MoE (2 layers at Qwen3-30B-A3B's expert shape) and
generates from random token ids, so the example runs with no download. It loads the model once,
then generates greedily with experts_implementation "moekit" and with "grouped_mm" (same tokens
expected for a float32 model) and prints tokens/s of each.

Threads: moekit's pool and torch's OpenMP threads share the cores. OMP_WAIT_POLICY=PASSIVE (set
before torch is imported: OpenMP reads it once) keeps torch's idle threads from spinning on the
cores moekit's workers need; on the 2-core VM of docs/performance.md it made prefill 1.2x -> 1.7x
grouped_mm. Both pools get --threads.
"""
import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402

import moekit  # noqa: E402
import moekit.transformers  # noqa: E402,F401 - registers experts_implementation="moekit"


def random_model():
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=2048, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=768,
        vocab_size=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Hugging Face MoE model folder (default: a small random Qwen3-MoE)")
    ap.add_argument("--prompt", default="The mixture-of-experts layer")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    moekit.set_num_threads(a.threads)

    if a.model:
        tok = transformers.AutoTokenizer.from_pretrained(a.model)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            a.model, dtype=getattr(torch, a.dtype), experts_implementation="moekit")
        ids = tok(a.prompt, return_tensors="pt").input_ids
    else:
        model, tok = random_model()
        ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    model.eval()
    kw = dict(max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False,
              pad_token_id=getattr(model.generation_config, "pad_token_id", None) or 0)

    outputs = {}
    for impl in ("moekit", "grouped_mm"):
        model.set_experts_implementation(impl)
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=kw["pad_token_id"])  # warm-up
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            dt = time.perf_counter() - t0
        outputs[impl] = out
        new = out.shape[1] - ids.shape[1]
        print(f"{impl:>10}: {new} tokens in {dt:.2f} s = {new / dt:.1f} tokens/s")
    same = torch.equal(outputs["moekit"], outputs["grouped_mm"])
    print(f"same tokens: {same}")
    if tok is not None:
        print(tok.decode(outputs["moekit"][0], skip_special_tokens=True))


if __name__ == "__main__":
    main()
