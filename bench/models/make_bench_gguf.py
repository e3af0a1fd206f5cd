#!/usr/bin/env python3
"""Writes a GGUF of Qwen3-30B-A3B's exact shapes and metadata with random weights and fewer layers,
for the whole-model benchmark `moekit bench --e2e` against llama.cpp's `llama-bench` on the same file
(bench/models/README.md). Not a test; never in CI.

What it makes: the file llama.cpp's convert_hf_to_gguf.py writes for Qwen/Qwen3-30B-A3B
(arch `qwen3moe`, --outtype f16) -- the same keys, tensor names, shapes and tensor types (matrices
F16; norms and the router `ffn_gate_inp` F32, as the converter keeps them) -- except that it has
`--layers` blocks (default 16 of the real 48) and seeded random weights: hidden 2048, 32 query heads,
4 KV heads, head_dim 128 (per-head `attn_q_norm`/`attn_k_norm`), 128 experts, top-8, expert FFN 768
(the softmax router's top-8 weights are renormalised: llama.cpp's qwen3moe graph always does so, as
`norm_topk_prob: true` asks), RoPE theta 1e6, RMS eps 1e-6, context 40960, vocab 151936, untied
`token_embd` and `output`. The `tokenizer.*` keys are copied as stored from llama.cpp's
models/ggml-vocab-qwen2.gguf, which has 151936 tokens already (151643 BPE tokens, 3 CONTROL tokens,
then `[PAD151646]`..`[PAD151935]` of type USER_DEFINED), so nothing is padded. It is Qwen2's
tokenizer: Qwen3's added tokens (<think> and the like, 151646..151668) are pads there, and its EOS is
<|endoftext|> 151643 where Qwen3's own GGUF says <|im_end|> 151645; a benchmark never looks at them.

Why: the real model (48 layers, 61 GB in BF16, 18 GB in Q4_K_M) does not fit a small benchmark
machine, and no download is needed: each layer is the real layer, so per-layer time, the bytes read
per token and the work outside the MoE blocks (attention, embedding, 151936-wide output) are the real
ones; a model of 48 layers takes about 48/N times as long per token in the blocks.

Weights: normal, std 0.02 (token_embd, attention, router, experts, output); norms 1 + N(0, 0.02).
With these the hidden state stays O(1), the router's logits on a unit-RMS input have std ~0.9 (so
the softmax top-8 is spread, not one expert everywhere), and nothing overflows F16; llama.cpp's
perplexity on the 16-layer Q4_K_M file is ~2.1e5, near the uniform 151936: finite, unpeaked logits. Each tensor draws from its own stream, numpy
default_rng([seed, layer, tensor]), so a tensor's values do not depend on --layers.

Memory stays small: the tensors are written one by one (GGUFWriter: add_tensor_info for all, then
write_tensor_data one at a time); the largest, token_embd/output, takes ~0.6 GB in F16.

How to run (needs numpy and gguf; use llama.cpp's own gguf-py, `pip install <llama.cpp>/gguf-py`,
so that the file matches the llama-quantize it goes through):

    python3 bench/models/make_bench_gguf.py --out-dir /work/peers/models \\
        --vocab <llama.cpp>/models/ggml-vocab-qwen2.gguf \\
        --quantize /work/peers/llama-build/bin/llama-quantize --types Q4_K_M,Q8_0 --threads 2

writes OUT_DIR/qwen3moe-30b-a3b-<N>L-F16.gguf, then with --quantize runs
`llama-quantize F16 OUT_DIR/qwen3moe-30b-a3b-<N>L-<TYPE>.gguf TYPE THREADS` for each type and deletes
the F16 file (unless --keep-f16). Without --quantize it prints those commands.

Time and disk, 16 layers, on a 2-core AMD EPYC VM (AVX2; another build sharing the machine):
generating the F16 file took 10 min (597 s; single-threaded numpy), llama-quantize with 2 threads
18 min for Q4_K_M (1064 s) and 2 min for Q8_0 (119 s). Disk: F16 21.2 GB (10.59 G parameters: 1.27 GB
per layer + 1.25 GB for token_embd and output), Q4_K_M 6.48 GB (4.89 bits per weight; llama-quantize's
mix gives ffn_down_exps and attn_v Q6_K in 8 of the 16 layers -- the same half as in the 48-layer
file -- and output Q6_K), Q8_0 11.27 GB; with the default --types the peak is F16 + both, 39 GB.
Peak memory: 1.2 GB (resident set).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np

# Qwen/Qwen3-30B-A3B config.json
HIDDEN = 2048
N_HEAD = 32
N_HEAD_KV = 4
HEAD_DIM = 128
N_EXPERT = 128
N_EXPERT_USED = 8
FF_EXP = 768
FF_DENSE = 6144  # config's intermediate_size: written as feed_forward_length, no dense FFN in any layer
ROPE_THETA = 1e6
RMS_EPS = 1e-6
CONTEXT = 40960
VOCAB = 151936
REAL_LAYERS = 48

STD = 0.02
CHUNK = 1 << 24  # elements drawn at a time


def tensor_plan(layers):
    """(name, numpy shape (ggml's ne reversed), F16 or F32, kind, stream id), in the file's order."""
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    plan = [("token_embd.weight", (VOCAB, HIDDEN), np.float16, "matrix", (0, 0))]
    for i in range(layers):
        b = f"blk.{i}."
        per = [
            ("attn_norm.weight", (HIDDEN,), np.float32, "norm"),
            ("attn_q.weight", (q, HIDDEN), np.float16, "matrix"),
            ("attn_k.weight", (kv, HIDDEN), np.float16, "matrix"),
            ("attn_v.weight", (kv, HIDDEN), np.float16, "matrix"),
            ("attn_output.weight", (HIDDEN, q), np.float16, "matrix"),
            ("attn_q_norm.weight", (HEAD_DIM,), np.float32, "norm"),
            ("attn_k_norm.weight", (HEAD_DIM,), np.float32, "norm"),
            ("ffn_norm.weight", (HIDDEN,), np.float32, "norm"),
            ("ffn_gate_inp.weight", (N_EXPERT, HIDDEN), np.float32, "matrix"),
            ("ffn_gate_exps.weight", (N_EXPERT, FF_EXP, HIDDEN), np.float16, "matrix"),
            ("ffn_up_exps.weight", (N_EXPERT, FF_EXP, HIDDEN), np.float16, "matrix"),
            ("ffn_down_exps.weight", (N_EXPERT, HIDDEN, FF_EXP), np.float16, "matrix"),
        ]
        plan += [(b + n, s, t, k, (1 + i, j)) for j, (n, s, t, k) in enumerate(per)]
    plan += [
        ("output_norm.weight", (HIDDEN,), np.float32, "norm", (0, 1)),
        ("output.weight", (VOCAB, HIDDEN), np.float16, "matrix", (0, 2)),
    ]
    return plan


def make_tensor(seed, stream, shape, dtype, kind):
    rng = np.random.default_rng([seed, *stream])
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    buf = np.empty(min(CHUNK, flat.size), dtype=np.float32)
    for s in range(0, flat.size, CHUNK):
        n = min(CHUNK, flat.size - s)
        x = buf[:n]
        rng.standard_normal(out=x, dtype=np.float32)
        x *= STD
        if kind == "norm":
            x += 1.0
        flat[s:s + n] = x
    return out


def copy_tokenizer(writer, vocab_path, gguf):
    r = gguf.GGUFReader(vocab_path)
    keys = [k for k in r.fields if k.startswith("tokenizer.")]
    for k in keys:
        f = r.fields[k]
        v = f.contents()
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(k, v, gguf.GGUFValueType.ARRAY, sub_type=f.types[1])
        else:
            writer.add_key_value(k, v, f.types[0])
    n = len(r.fields["tokenizer.ggml.tokens"].contents())
    if n != VOCAB:
        raise SystemExit(f"{vocab_path}: {n} tokens, expected {VOCAB}")
    return keys


def write_f16(path, layers, seed, vocab_path):
    import gguf

    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3MOE]  # "qwen3moe"
    w = gguf.GGUFWriter(path=None, arch=arch)
    # general.* as the converter writes them for the real model (name/basename/size_label from its model card)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("Qwen3 30B A3B")
    w.add_basename("Qwen3")
    w.add_size_label("30B-A3B")
    w.add_description(f"Random weights (seed {seed}), {layers} of {REAL_LAYERS} layers: a benchmark file "
                      "of Qwen3-30B-A3B's shapes, written by moekit's bench/models/make_bench_gguf.py")
    # what TextModel.set_gguf_parameters + Qwen2MoeModel write from Qwen3-30B-A3B's config.json
    w.add_block_count(layers)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF_DENSE)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_expert_feed_forward_length(FF_EXP)
    copy_tokenizer(w, vocab_path, gguf)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    plan = tensor_plan(layers)
    for name, shape, dtype, _, _ in plan:
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = sum(int(np.prod(s)) * np.dtype(t).itemsize for _, s, t, _, _ in plan)
    done, t0 = 0, time.monotonic()
    for name, shape, dtype, kind, stream in plan:
        t = make_tensor(seed, stream, shape, dtype, kind)
        if not np.isfinite(t).all():
            raise SystemExit(f"{name}: non-finite values")
        w.write_tensor_data(t)
        done += t.nbytes
        if name.endswith("ffn_down_exps.weight") or name == "output.weight":
            print(f"  {name:28s} {done / 2**30:6.1f} / {total / 2**30:.1f} GiB  {time.monotonic() - t0:6.0f} s",
                  flush=True)
        del t
    w.close()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16, help="blocks (default 16; the real model has 48)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--vocab", required=True,
                    help="GGUF whose tokenizer.* keys are copied: llama.cpp's models/ggml-vocab-qwen2.gguf")
    ap.add_argument("--quantize", metavar="LLAMA_QUANTIZE",
                    help="path of llama.cpp's llama-quantize: run it for each --types (else print the commands)")
    ap.add_argument("--types", default="Q4_K_M,Q8_0", help="llama-quantize types, comma list (default Q4_K_M,Q8_0)")
    ap.add_argument("--threads", type=int, default=2, help="llama-quantize threads (default 2)")
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    ap.add_argument("--skip-f16", action="store_true", help="reuse an existing F16 file (only quantize)")
    args = ap.parse_args()
    if not 1 <= args.layers <= REAL_LAYERS:
        ap.error(f"--layers: 1..{REAL_LAYERS}")

    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"qwen3moe-30b-a3b-{args.layers}L")
    f16 = stem + "-F16.gguf"
    types = [t for t in args.types.split(",") if t]

    if not args.skip_f16:
        free = shutil.disk_usage(args.out_dir).free
        need = 1.33e9 * args.layers + 1.25e9
        if free < need:
            sys.exit(f"{args.out_dir}: {free / 1e9:.1f} GB free, the F16 file needs {need / 1e9:.1f} GB")
        print(f"writing {f16} ({args.layers} layers, seed {args.seed})", flush=True)
        t0 = time.monotonic()
        nbytes = write_f16(f16 + ".part", args.layers, args.seed, os.path.abspath(args.vocab))
        os.replace(f16 + ".part", f16)
        print(f"wrote {f16}: {os.path.getsize(f16) / 1e9:.2f} GB ({nbytes / 1e9:.2f} GB of tensors) "
              f"in {time.monotonic() - t0:.0f} s", flush=True)

    for t in types:
        out = f"{stem}-{t}.gguf"
        cmd = [args.quantize or "llama-quantize", f16, out, t, str(args.threads)]
        if not args.quantize:
            print(" ".join(cmd))
            continue
        print("running: " + " ".join(cmd), flush=True)
        t0 = time.monotonic()
        subprocess.run(cmd, check=True)
        print(f"wrote {out}: {os.path.getsize(out) / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s", flush=True)
    if args.quantize and types and not args.keep_f16:
        os.remove(f16)
        print(f"removed {f16} (--keep-f16 keeps it)")


if __name__ == "__main__":
    main()
