#!/usr/bin/env python3
"""Writes a GGUF of Qwen3-30B-A3B's (the default) or gpt-oss-20b's (`--model gpt-oss-20b`, below) exact
shapes and metadata with random weights and fewer layers, for the whole-model benchmark `moekit bench --e2e` against llama.cpp's `llama-bench` on the same file
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

gpt-oss-20b (`--model gpt-oss-20b`): the file llama.cpp's converter (GptOssModel, conversion/gpt_oss.py)
writes for openai/gpt-oss-20b, arch `gpt-oss`, `--layers` blocks (default 8 of the real 24): hidden
2880, 64 query heads, 8 KV heads, head_dim 64, q/k/v/o biases, per-head attention sinks
`blk.N.attn_sinks.weight`, `post_attention_norm` before the MoE, 32 experts top-4 of FFN 2880
(`ffn_{gate,up,down}_exps.weight` and `.bias`; router `ffn_gate_inp.weight` and `.bias`), sliding
window 128 on every other layer (llama.cpp's loader sets the pattern 2 itself: layers 0, 2, ... slide),
YaRN RoPE (type yarn, factor 32, original context 4096, beta_fast 32, beta_slow 1, theta 150000), RMS
eps 1e-5, context 131072, vocab 201088, untied `token_embd` and `output`. The key list is what
TextModel.set_gguf_parameters + GptOssModel write from the model's config.json (rope.scaling.*,
attention.key_length/value_length 64, attention.sliding_window, expert_feed_forward_length); the
swiglu clamp (limit 7, alpha 1.702: LLM_FFN_SWIGLU_OAI_MOE), the softmax over the selected experts'
logits and the sinks' use are hardcoded in llama.cpp's gpt-oss graph, not keys. Tensor types: matrices
F16; norms, every `.bias`, the sinks and the router weight F32, as the converter keeps them. One
difference: the real checkpoint's experts are MXFP4 and the converter copies them as MXFP4 blocks, so
its file has no F16 experts; this one writes F16 experts and `llama-quantize ... MXFP4_MOE` (the
default --types here) then makes what llama.cpp's own gpt-oss GGUFs hold: experts MXFP4, every other
matrix (attention, token_embd, output) Q8_0, the router and the 1-D/bias tensors F32. Weights as above
(std 0.02; biases and sinks N(0, 0.02); norms 1 + N(0, 0.02)); with hidden 2880 a unit-RMS input gives
projections of std ~1.07, within the clamp, nothing overflows F16. Tokenizer: there is no o200k vocab
in llama.cpp's models/, so the `tokenizer.*` keys of models/ggml-vocab-qwen2.gguf are copied (Qwen2's
BPE, bos/eos <|endoftext|> 151643, still valid ids) and the token list is padded from 151936 to 201088
with `[PAD151936]`..`[PAD201087]` of type USER_DEFINED; no text maps to those ids, and a benchmark,
which draws random token ids, never reads them. The output projection is the real 201088 wide.

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

gpt-oss-20b, 8 layers, same machine (nothing else running):

    python3 bench/models/make_bench_gguf.py --model gpt-oss-20b --layers 8 --out-dir /work/peers/models \\
        --vocab <llama.cpp>/models/ggml-vocab-qwen2.gguf \\
        --quantize /work/peers/llama-build/bin/llama-quantize --threads 2

writes gpt-oss-20b-8L-F16.gguf in 3.5 min (210 s), then llama-quantize MXFP4_MOE with 2 threads in
1.4 min (84 s), and deletes the F16 file: 5 min in all. Disk: F16 15.50 GB (7.74 G parameters: 1.65 GB
per layer + 1.16 GB for token_embd and output), MXFP4_MOE 4.86 GB (5.01 bits per weight: experts
MXFP4, attention/token_embd/output Q8_0); peak 20.4 GB. Peak memory: 4.0 GB (llama-quantize; the
writer 0.7 GB).
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

# openai/gpt-oss-20b config.json
OSS_HIDDEN = 2880
OSS_N_HEAD = 64
OSS_N_HEAD_KV = 8
OSS_HEAD_DIM = 64
OSS_N_EXPERT = 32
OSS_N_EXPERT_USED = 4
OSS_FF_EXP = 2880  # intermediate_size: written as both feed_forward_length and expert_feed_forward_length
OSS_ROPE_THETA = 150000.0
OSS_YARN_FACTOR = 32.0
OSS_YARN_ORIG_CTX = 4096
OSS_YARN_BETA_FAST = 32.0
OSS_YARN_BETA_SLOW = 1.0
OSS_RMS_EPS = 1e-5
OSS_CONTEXT = 131072
OSS_SLIDING_WINDOW = 128
OSS_VOCAB = 201088
OSS_REAL_LAYERS = 24

# deepseek-ai/DeepSeek-V2-Lite config.json
DSL_HIDDEN = 2048
DSL_N_HEAD = 16
DSL_KV_LORA = 512
DSL_NOPE = 128
DSL_ROPE = 64
DSL_V = 128
DSL_N_EXPERT = 64
DSL_N_EXPERT_USED = 6
DSL_N_SHARED = 2
DSL_FF_EXP = 1408
DSL_FF_DENSE = 10944  # layer 0 (first_k_dense_replace 1)
DSL_ROPE_THETA = 10000.0
DSL_YARN_FACTOR = 40.0
DSL_YARN_ORIG_CTX = 4096
DSL_MSCALE_ALL_DIM = 0.707
DSL_RMS_EPS = 1e-6
DSL_CONTEXT = 163840
DSL_VOCAB = 102400
DSL_REAL_LAYERS = 27

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


def gpt_oss_plan(layers):
    """gpt-oss-20b's tensors, as tensor_plan: matrices F16; norms, biases, attn_sinks and the router F32 (the
    converter keeps every 1-D tensor, every `.bias` and ffn_gate_inp F32)."""
    H, q, kv = OSS_HIDDEN, OSS_N_HEAD * OSS_HEAD_DIM, OSS_N_HEAD_KV * OSS_HEAD_DIM
    E, F = OSS_N_EXPERT, OSS_FF_EXP
    f16, f32 = np.float16, np.float32
    plan = [("token_embd.weight", (OSS_VOCAB, H), f16, "matrix", (0, 0))]
    for i in range(layers):
        b = f"blk.{i}."
        per = [
            ("attn_norm.weight", (H,), f32, "norm"),
            ("attn_q.weight", (q, H), f16, "matrix"),
            ("attn_q.bias", (q,), f32, "bias"),
            ("attn_k.weight", (kv, H), f16, "matrix"),
            ("attn_k.bias", (kv,), f32, "bias"),
            ("attn_v.weight", (kv, H), f16, "matrix"),
            ("attn_v.bias", (kv,), f32, "bias"),
            ("attn_output.weight", (H, q), f16, "matrix"),
            ("attn_output.bias", (H,), f32, "bias"),
            ("attn_sinks.weight", (OSS_N_HEAD,), f32, "bias"),
            ("post_attention_norm.weight", (H,), f32, "norm"),
            ("ffn_gate_inp.weight", (E, H), f32, "matrix"),
            ("ffn_gate_inp.bias", (E,), f32, "bias"),
            ("ffn_gate_exps.weight", (E, F, H), f16, "matrix"),
            ("ffn_gate_exps.bias", (E, F), f32, "bias"),
            ("ffn_up_exps.weight", (E, F, H), f16, "matrix"),
            ("ffn_up_exps.bias", (E, F), f32, "bias"),
            ("ffn_down_exps.weight", (E, H, F), f16, "matrix"),
            ("ffn_down_exps.bias", (E, H), f32, "bias"),
        ]
        plan += [(b + n, s, t, k, (1 + i, j)) for j, (n, s, t, k) in enumerate(per)]
    plan += [
        ("output_norm.weight", (H,), f32, "norm", (0, 1)),
        ("output.weight", (OSS_VOCAB, H), f16, "matrix", (0, 2)),
    ]
    return plan


def deepseek_v2_lite_plan(layers):
    """DeepSeek-V2-Lite's tensors as llama.cpp's converter (DeepseekV2Model) writes them: q projected directly
    (no q LoRA), attn_kv_a_mqa [latent 512 + rope key 64], kv_b_proj split per head into attn_k_b
    (ggml {nope, kv_lora, heads}) and attn_v_b ({kv_lora, v, heads}); layer 0 a dense FFN, the others 64
    experts plus 2 shared (one shexp tensor of 2 x 1408). Matrices F16; norms and the router F32."""
    H, L, E, F, FS = DSL_HIDDEN, DSL_KV_LORA, DSL_N_EXPERT, DSL_FF_EXP, DSL_FF_EXP * DSL_N_SHARED
    qk = DSL_NOPE + DSL_ROPE
    f16, f32 = np.float16, np.float32
    plan = [("token_embd.weight", (DSL_VOCAB, H), f16, "matrix", (0, 0))]
    for i in range(layers):
        b = f"blk.{i}."
        per = [
            ("attn_norm.weight", (H,), f32, "norm"),
            ("attn_q.weight", (DSL_N_HEAD * qk, H), f16, "matrix"),
            ("attn_kv_a_mqa.weight", (L + DSL_ROPE, H), f16, "matrix"),
            ("attn_kv_a_norm.weight", (L,), f32, "norm"),
            ("attn_k_b.weight", (DSL_N_HEAD, L, DSL_NOPE), f16, "matrix"),
            ("attn_v_b.weight", (DSL_N_HEAD, DSL_V, L), f16, "matrix"),
            ("attn_output.weight", (H, DSL_N_HEAD * DSL_V), f16, "matrix"),
            ("ffn_norm.weight", (H,), f32, "norm"),
        ]
        if i == 0:
            per += [
                ("ffn_gate.weight", (DSL_FF_DENSE, H), f16, "matrix"),
                ("ffn_up.weight", (DSL_FF_DENSE, H), f16, "matrix"),
                ("ffn_down.weight", (H, DSL_FF_DENSE), f16, "matrix"),
            ]
        else:
            per += [
                ("ffn_gate_inp.weight", (E, H), f32, "matrix"),
                ("ffn_gate_exps.weight", (E, F, H), f16, "matrix"),
                ("ffn_up_exps.weight", (E, F, H), f16, "matrix"),
                ("ffn_down_exps.weight", (E, H, F), f16, "matrix"),
                ("ffn_gate_shexp.weight", (FS, H), f16, "matrix"),
                ("ffn_up_shexp.weight", (FS, H), f16, "matrix"),
                ("ffn_down_shexp.weight", (H, FS), f16, "matrix"),
            ]
        plan += [(b + n, s, t, k, (1 + i, j)) for j, (n, s, t, k) in enumerate(per)]
    plan += [
        ("output_norm.weight", (H,), f32, "norm", (0, 1)),
        ("output.weight", (DSL_VOCAB, H), f16, "matrix", (0, 2)),
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


def copy_tokenizer(writer, vocab_path, gguf, vocab=VOCAB):
    """Copies vocab_path's tokenizer.* keys; pads the token list to `vocab` with `[PAD{i}]` USER_DEFINED tokens."""
    r = gguf.GGUFReader(vocab_path)
    keys = [k for k in r.fields if k.startswith("tokenizer.")]
    n = len(r.fields["tokenizer.ggml.tokens"].contents())
    if n > vocab:
        raise SystemExit(f"{vocab_path}: {n} tokens, more than {vocab}")
    if n != vocab and "tokenizer.ggml.scores" in r.fields:
        raise SystemExit(f"{vocab_path}: has scores, padding not supported")
    pad = vocab - n
    for k in keys:
        f = r.fields[k]
        v = f.contents()
        if k == "tokenizer.ggml.tokens" and pad:
            v = v + [f"[PAD{i}]" for i in range(n, vocab)]
        elif k == "tokenizer.ggml.token_type" and pad:
            v = v + [int(gguf.TokenType.USER_DEFINED)] * pad
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(k, v, gguf.GGUFValueType.ARRAY, sub_type=f.types[1])
        else:
            writer.add_key_value(k, v, f.types[0])
    return keys


def qwen3_metadata(w, layers, seed, vocab_path, gguf):
    # arch "qwen3moe"
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
    copy_tokenizer(w, vocab_path, gguf, VOCAB)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def gpt_oss_metadata(w, layers, seed, vocab_path, gguf):
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("Gpt Oss 20b")
    w.add_basename("gpt-oss")
    w.add_size_label("20B")
    w.add_description(f"Random weights (seed {seed}), {layers} of {OSS_REAL_LAYERS} layers: a benchmark file "
                      "of gpt-oss-20b's shapes, written by moekit's bench/models/make_bench_gguf.py")
    # what TextModel.set_gguf_parameters + GptOssModel write from gpt-oss-20b's config.json
    w.add_block_count(layers)
    w.add_context_length(OSS_CONTEXT)
    w.add_embedding_length(OSS_HIDDEN)
    w.add_feed_forward_length(OSS_FF_EXP)
    w.add_head_count(OSS_N_HEAD)
    w.add_head_count_kv(OSS_N_HEAD_KV)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(OSS_YARN_FACTOR)
    w.add_rope_scaling_orig_ctx_len(OSS_YARN_ORIG_CTX)
    w.add_rope_scaling_yarn_beta_fast(OSS_YARN_BETA_FAST)
    w.add_rope_scaling_yarn_beta_slow(OSS_YARN_BETA_SLOW)
    w.add_rope_freq_base(OSS_ROPE_THETA)
    w.add_layer_norm_rms_eps(OSS_RMS_EPS)
    w.add_expert_count(OSS_N_EXPERT)
    w.add_expert_used_count(OSS_N_EXPERT_USED)
    w.add_key_length(OSS_HEAD_DIM)
    w.add_value_length(OSS_HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_sliding_window(OSS_SLIDING_WINDOW)
    w.add_expert_feed_forward_length(OSS_FF_EXP)
    copy_tokenizer(w, vocab_path, gguf, OSS_VOCAB)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def deepseek_v2_lite_metadata(w, layers, seed, vocab_path, gguf):
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("DeepSeek V2 Lite")
    w.add_basename("DeepSeek-V2")
    w.add_size_label("Lite")
    w.add_description(f"Random weights (seed {seed}), {layers} of {DSL_REAL_LAYERS} layers: a benchmark file "
                      "of DeepSeek-V2-Lite's shapes, written by moekit's bench/models/make_bench_gguf.py")
    # what TextModel.set_gguf_parameters + DeepseekV2Model write from DeepSeek-V2-Lite's config.json
    w.add_block_count(layers)
    w.add_context_length(DSL_CONTEXT)
    w.add_embedding_length(DSL_HIDDEN)
    w.add_feed_forward_length(DSL_FF_DENSE)
    w.add_head_count(DSL_N_HEAD)
    w.add_head_count_kv(1)  # MLA: one latent "head"
    w.add_rope_freq_base(DSL_ROPE_THETA)
    w.add_layer_norm_rms_eps(DSL_RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_leading_dense_block_count(1)
    w.add_vocab_size(DSL_VOCAB)
    # The converter writes no q_lora_rank for V2-Lite (its config has none); llama.cpp skips the key only
    # when block_count is 27 or 26 (its test for a Lite model), so a file of fewer layers carries 0,
    # which llama.cpp and moekit both read as "q projected directly".
    w.add_q_lora_rank(0)
    w.add_kv_lora_rank(DSL_KV_LORA)
    w.add_key_length(DSL_KV_LORA + DSL_ROPE)
    w.add_value_length(DSL_KV_LORA)
    w.add_key_length_mla(DSL_NOPE + DSL_ROPE)
    w.add_value_length_mla(DSL_V)
    w.add_expert_feed_forward_length(DSL_FF_EXP)
    w.add_expert_count(DSL_N_EXPERT)
    w.add_expert_used_count(DSL_N_EXPERT_USED)
    w.add_expert_shared_count(DSL_N_SHARED)
    w.add_expert_weights_scale(1.0)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_rope_dimension_count(DSL_ROPE)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(DSL_YARN_FACTOR)
    w.add_rope_scaling_orig_ctx_len(DSL_YARN_ORIG_CTX)
    w.add_rope_scaling_yarn_log_mul(0.1 * DSL_MSCALE_ALL_DIM)
    copy_tokenizer(w, vocab_path, gguf, DSL_VOCAB)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_f16(path, layers, seed, vocab_path, model="qwen3-30b-a3b"):
    import gguf

    spec = MODELS[model]
    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[spec["arch"](gguf)])
    spec["metadata"](w, layers, seed, vocab_path, gguf)

    plan = spec["plan"](layers)
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


MODELS = {
    "qwen3-30b-a3b": dict(arch=lambda g: g.MODEL_ARCH.QWEN3MOE, plan=tensor_plan, metadata=qwen3_metadata,
                          stem="qwen3moe-30b-a3b", real_layers=REAL_LAYERS, layers=16, types="Q4_K_M,Q8_0",
                          layer_bytes=1.33e9, other_bytes=1.25e9),
    "gpt-oss-20b": dict(arch=lambda g: g.MODEL_ARCH.GPT_OSS, plan=gpt_oss_plan, metadata=gpt_oss_metadata,
                        stem="gpt-oss-20b", real_layers=OSS_REAL_LAYERS, layers=8, types="MXFP4_MOE",
                        layer_bytes=1.65e9, other_bytes=1.17e9),
    "deepseek-v2-lite": dict(arch=lambda g: g.MODEL_ARCH.DEEPSEEK2, plan=deepseek_v2_lite_plan,
                             metadata=deepseek_v2_lite_metadata, stem="deepseek-v2-lite", real_layers=DSL_REAL_LAYERS,
                             layers=8, types="Q4_K_M", layer_bytes=1.17e9, other_bytes=0.84e9),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b",
                    help="which model's shapes and metadata (default qwen3-30b-a3b)")
    ap.add_argument("--layers", type=int,
                    help="blocks (default 16 of qwen3-30b-a3b's 48, 8 of gpt-oss-20b's 24, 8 of "
                         "deepseek-v2-lite's 27)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--vocab", required=True,
                    help="GGUF whose tokenizer.* keys are copied: llama.cpp's models/ggml-vocab-qwen2.gguf "
                         "(deepseek-v2-lite: models/ggml-vocab-deepseek-llm.gguf, its own 102400 tokens)")
    ap.add_argument("--quantize", metavar="LLAMA_QUANTIZE",
                    help="path of llama.cpp's llama-quantize: run it for each --types (else print the commands)")
    ap.add_argument("--types",
                    help="llama-quantize types, comma list (default Q4_K_M,Q8_0 for qwen3-30b-a3b, "
                         "MXFP4_MOE for gpt-oss-20b)")
    ap.add_argument("--threads", type=int, default=2, help="llama-quantize threads (default 2)")
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    ap.add_argument("--skip-f16", action="store_true", help="reuse an existing F16 file (only quantize)")
    args = ap.parse_args()
    spec = MODELS[args.model]
    if args.layers is None:
        args.layers = spec["layers"]
    if args.types is None:
        args.types = spec["types"]
    if not 1 <= args.layers <= spec["real_layers"]:
        ap.error(f"--layers: 1..{spec['real_layers']}")

    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"{spec['stem']}-{args.layers}L")
    f16 = stem + "-F16.gguf"
    types = [t for t in args.types.split(",") if t]

    if not args.skip_f16:
        free = shutil.disk_usage(args.out_dir).free
        need = spec["layer_bytes"] * args.layers + spec["other_bytes"]
        if free < need:
            sys.exit(f"{args.out_dir}: {free / 1e9:.1f} GB free, the F16 file needs {need / 1e9:.1f} GB")
        print(f"writing {f16} ({args.layers} layers, seed {args.seed})", flush=True)
        t0 = time.monotonic()
        nbytes = write_f16(f16 + ".part", args.layers, args.seed, os.path.abspath(args.vocab), args.model)
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
