#!/usr/bin/env python3
"""Tiny whole MoE models from transformers, their GGUFs as llama.cpp's converter writes them, and
transformers' own float64 output: the references for moekit's whole-model decoder.

    tests/goldens/models/make_model_goldens.sh            (sets up the tree, then runs this)
    $PYTHON tests/goldens/models/make_model_goldens.py \\
        --llama-cpp <llama-cpp-python sdist>/vendor/llama.cpp [--only qwen3moe,gpt-oss] [--facts]

For each family (families() below): a tiny transformers model (vocab 256, hidden 64, 4 query heads
over 2 key/value heads, 3 or 4 layers) with every parameter drawn anew from a seeded generator
(randomize; the constructors' init leaves some at 0 or 1), its values then made pairwise distinct
(unique_values), is written with save_pretrained to `<name>/` (float32 safetensors), converted
in-process by llama.cpp's converter classes to `<name>.f32.gguf` and `<name>.q8_0.gguf`, and
`<name>.ref.json` gets transformers' float64 output:

  prompt_ids      12 token ids drawn from a seeded generator
  logits          [12][256] logits of the prompt (one forward, eager attention)
  greedy_ids      16 tokens continued greedily one step at a time with the KV cache (the
                  transformers DynamicCache), checked against a full recompute of the whole sequence
  greedy_margins  top-1 minus top-2 logit at each of those 16 steps
  greedy_logits   [16][256] the logits each greedy step chose from (step 0: the prompt's last)
  logits_q8_0     the prompt's logits with every weight replaced by its value in the q8_0 GGUF,
                  dequantized by gguf-py (weights_from_gguf: no per-family mapping, the values
                  are found again because they are all distinct)
  not_in_gguf     config values that change the output but that the converter writes no key for
  *_gguf          (llama4: GGUF_SEMANTICS) logits, greedy_*, logits_q8_0 again with the config changed to
                  the constants llama.cpp hardcodes for that arch, same weights and prompt

"float64" means every operation: transformers casts to float32 in places even after
model.double() (RMSNorm, router softmax/sigmoid, attention softmax, RoPE tables, Llama 4's
complex RoPE); Float64 below is a TorchFunctionMode that turns each such float32 request into
float64 and checks that no operation of the forward returns a float32 tensor. The RoPE inverse
frequencies are recomputed under it too.

The one step not llama.cpp's: the tokenizer. The models have none, so the converter's set_vocab
is replaced by a stub writing a 256-entry gpt2 vocabulary <t0>..<t255> (moekit reads no vocab).
"""
import argparse
import copy
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

SEED = 20240611
V, D, T, STEPS = 256, 64, 12, 16
MIN_MARGIN = 0.01  # a prompt whose greedy continuation comes closer to a tie is replaced
LOW = (torch.float32, torch.float16, torch.bfloat16)


def families():
    """name: (HF class, config, gguf architecture, features, HF config values not in the GGUF)."""
    import transformers as tf

    common = dict(vocab_size=V, hidden_size=D, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-6,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    no_head_dim = {k: v for k, v in common.items() if k != "head_dim"}  # these configs derive it: 64 / 4
    return {
        "qwen3moe": ("Qwen3MoeForCausalLM", tf.Qwen3MoeConfig(
            **common, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
            "qwen3moe", "per-head q/k RMSNorm; softmax top-2 of 8, renormalized; rope_theta 1e6; every layer MoE "
            "(the converter maps no dense FFN tensors for qwen3moe)", {"norm_topk_prob": True}),
        "qwen2moe": ("Qwen2MoeForCausalLM", tf.Qwen2MoeConfig(
            **no_head_dim, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=64,
            num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, qkv_bias=True,
            decoder_sparse_step=1, mlp_only_layers=[]),
            "qwen2moe", "q/k/v biases; softmax top-2 of 8, not renormalized; sigmoid-gated shared expert; "
            "every layer MoE (the converter maps no dense FFN tensors for qwen2moe)", {"norm_topk_prob": False}),
        "mixtral": ("MixtralForCausalLM", tf.MixtralConfig(
            **common, intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
            "llama", "plain GQA, rope_theta 1e6, softmax top-2 of 4 (renormalized); converter permutes Q/K rows",
            {"routing": "softmax over all experts, top-2 renormalized (Mixtral's; implied by llama + experts)"}),
        "olmoe": ("OlmoeForCausalLM", tf.OlmoeConfig(
            # rms_norm_eps 1e-5: the converter writes 1e-5 for olmoe whatever the config says
            **{**no_head_dim, "tie_word_embeddings": True, "rms_norm_eps": 1e-5}, intermediate_size=32, num_hidden_layers=3,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False),
            "olmoe", "q/k RMSNorm over the whole projection (64 and 32 wide); tied head (no output.weight); "
            "softmax top-2 of 8, not renormalized", {"norm_topk_prob": False}),
        "glm4moe": ("Glm4MoeForCausalLM", tf.Glm4MoeConfig(
            **common, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=1.5, n_group=1, topk_group=1,
            first_k_dense_replace=1, norm_topk_prob=True, attention_bias=True, use_qk_norm=True,
            num_nextn_predict_layers=0,  # the default 1 makes the converter count a 4th (MTP) block it has no tensors for
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
            "glm4moe", "partial rotary (8 of 16, NeoX halves), q/k/v biases, per-head q/k norm; sigmoid routing "
            "with e_score_correction_bias, renormalized, x1.5; shared expert; layer 0 dense (first_k_dense_replace)",
            {}),
        "gpt-oss": ("GptOssForCausalLM", tf.GptOssConfig(
            # head_dim 32: with 16 the YaRN ramp over original context 16 has no fractional dimension
            **{**common, "head_dim": 32}, intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=4, rope_parameters={
                "rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
            "gpt-oss", "attention sinks; sliding window 4 on layers 0 and 2, full on 1; YaRN (factor 4 over 16, "
            "truncate false: rotary pair 1 of 16 is 0.8 interpolated); head_dim 32 (q 128 wide); "
            "q/k/v/o biases; expert biases; clamped swiglu (limit 7, alpha 1.702); softmax over the top-2 of 4",
            {"rope_parameters.truncate": False, "layer_types": ["sliding_attention", "full_attention",
                                                                 "sliding_attention"],
             "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
             "routing": "top-2 of the router logits (with bias), softmax over those 2"}),
        "minimax-m2": ("MiniMaxM2ForCausalLM", tf.MiniMaxM2Config(
            **{**common, "head_dim": 32},
            intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
            rotary_dim=16, use_qk_norm=True, qk_norm_type="per_layer", use_routing_bias=True,
            scoring_func="sigmoid", rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}),
            "minimax-m2", "partial rotary (rotary_dim 16 of head_dim 32, NeoX halves); q/k RMSNorm over the whole "
            "projection (128 and 64 wide); sigmoid routing with e_score_correction_bias, renormalized",
            {"routing": "sigmoid, top-2 chosen on sigmoid + e_score_correction_bias, weights sigmoid renormalized"}),
        "deepseek-v2": ("DeepseekV2ForCausalLM", tf.DeepseekV2Config(
            # V2-Lite's shape: q projected directly (no q LoRA); all 4 heads share the cached latent
            **{**no_head_dim, "num_key_value_heads": 4}, intermediate_size=64, moe_intermediate_size=32,
            num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
            topk_method="greedy", scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0, q_lora_rank=None, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 0.707, "mscale_all_dim": 0.707}),
            "deepseek2", "MLA without q LoRA (V2-Lite): latent 32 + rope key 8 cached per token, nope 16, v 12; "
            "interleaved rope pairs (complex rope); YaRN x4 over 16 with mscale = mscale_all_dim 0.707 (softmax "
            "scale x mscale^2); softmax top-2 of 8 not renormalized; shared expert; layer 0 dense", {}),
        "deepseek-v3": ("DeepseekV3ForCausalLM", tf.DeepseekV3Config(
            **{**no_head_dim, "num_key_value_heads": 4}, intermediate_size=64, moe_intermediate_size=32,
            num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
            # scoring_func / topk_method as DeepSeek-V3's release config.json has them: transformers' class
            # does not save them, and without scoring_func the converter writes no expert_gating_func
            # (llama.cpp then takes softmax)
            scoring_func="sigmoid", topk_method="noaux_tc",
            n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, q_lora_rank=24, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 1.0}),
            "deepseek2", "MLA with q LoRA 24 (q_a -> RMSNorm -> q_b), latent 32 + rope key 8, nope 16, v 12; "
            "interleaved rope pairs; YaRN x4 over 16, mscale_all_dim 1 (softmax scale x mscale^2); sigmoid routing "
            "with e_score_correction_bias over 2 groups (top-1 group), renormalized, x2.5; shared expert; layer 0 "
            "dense", {}),
        "glm4-moe-lite": ("Glm4MoeLiteForCausalLM", tf.Glm4MoeLiteConfig(
            # GLM-4.7-Flash's layout: q LoRA, nope wider than v, mlp_layer_types instead of first_k_dense_replace
            # (its release config.json has both; the converter reads first_k_dense_replace), no rope scaling
            **{**no_head_dim, "num_key_value_heads": 4, "rms_norm_eps": 1e-5}, intermediate_size=64,
            moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"], first_k_dense_replace=1,
            scoring_func="sigmoid", topk_method="noaux_tc", n_group=1, topk_group=1, norm_topk_prob=True,
            routed_scaling_factor=1.8, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=20, qk_rope_head_dim=8,
            v_head_dim=16, rope_interleave=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
            "deepseek2", "GLM-4.7-Flash's MLA (q LoRA 24, latent 32 + rope key 8, nope 20, v 16), interleaved rope "
            "pairs, theta 1e6; layer 0 dense by mlp_layer_types; sigmoid routing with e_score_correction_bias, "
            "renormalized, x1.8; shared expert", {}),
        "llama4": ("Llama4ForCausalLM", tf.Llama4TextConfig(
            **{**common, "num_hidden_layers": 4}, intermediate_size=32, intermediate_size_mlp=64,
            num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
            attention_chunk_size=8, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.1, use_qk_norm=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
            "llama4", "4 layers: MoE on 1 and 3 (interleave 2), dense 0 and 2; layer 3 NoPE with full attention and "
            "attention temperature tuning (floor_scale 4); layers 0-2 RoPE with chunked attention (chunk 8) and "
            "weightless L2 q/k norm; llama3 rope scaling (rope_freqs); sigmoid top-2 of 4 scaling the expert input; "
            "shared expert",
            {"attention_chunk_size": 8, "floor_scale": 4, "attn_scale": 0.1, "no_rope_layers": [1, 1, 1, 0],
             "use_qk_norm": True, "rope_parameters": "llama3 (only as the rope_freqs tensor)",
             "routing": "sigmoid of the top-2 router logits, multiplying the expert's input; plus shared expert"}),
    }


class Float64(TorchFunctionMode):
    """Every float32/16 dtype asked for becomes float64 (.float() included, int -> float too), and
    any operation that still returns a low-precision float tensor is recorded in `low`."""

    def __init__(self):
        super().__init__()
        self.low = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16):
            func = torch.Tensor.double
        fix = lambda a: torch.float64 if isinstance(a, torch.dtype) and a in LOW else a  # noqa: E731
        args = tuple(fix(a) for a in args)
        kwargs = {k: fix(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor) and o.dtype in LOW + (torch.complex64,):
                self.low.add(getattr(func, "__name__", str(func)))
        return out


# Families whose GGUF llama.cpp reads with constants of its own where the config says otherwise:
# the config changes that give llama.cpp's model on the same weights, and why. ref.json then also
# gets logits_gguf, greedy_ids_gguf, greedy_margins_gguf, greedy_logits_gguf, logits_q8_0_gguf.
GGUF_SEMANTICS = {
    "llama4": ({"attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1},
               "the *_gguf fields: the same weights and prompt with the config changed to the constants "
               "llama.cpp (src/models/llama4.cpp) hardcodes for a llama4 GGUF, which has no keys for them: "
               "attention_chunk_size 8 -> 8192, floor_scale 4 -> 8192, attn_scale 0.1 (unchanged). Over 27 "
               "positions that is plain causal attention on layers 0-2 and an attention temperature of exactly "
               "1 on layer 3. no_rope_layers [1, 1, 1, 0] (NoPE every 4th layer) and use_qk_norm true (not a "
               "128-expert model) already match llama.cpp's rule; everything else unchanged."),
}


def check_llama_cpp_rules(name, config):
    """The settings llama.cpp derives rather than reads must already be its derivation."""
    if name == "llama4":
        n = config.num_hidden_layers
        assert list(config.no_rope_layers) == [int((i + 1) % 4 != 0) for i in range(n)], config.no_rope_layers
        assert config.use_qk_norm == (config.num_local_experts != 128), config.use_qk_norm
        assert config.attn_temperature_tuning and config.layer_types == [
            "chunked_attention" if (i + 1) % 4 else "full_attention" for i in range(n)], config.layer_types


def with_config(tf, model, changes):
    """The same weights in a model of the same class whose config has `changes`."""
    config = copy.deepcopy(model.config)
    for k, v in changes.items():
        setattr(config, k, v)
    m = type(model)(config)
    if hasattr(m, "set_experts_implementation"):
        m.set_experts_implementation("eager")
    m.load_state_dict(model.state_dict(), strict=True)
    m.eval()
    for mod in m.modules():  # the attention modules copied the config values at construction
        for k, v in changes.items():
            if hasattr(mod, k) and not isinstance(getattr(mod, k), torch.nn.Module):
                assert getattr(mod, k) == v, (type(mod), k)
    return m


# larger draws where a feature only shows on large values: gpt-oss's swiglu clamps at 7
WIDER = {"gpt-oss": {"mlp.experts.gate_up_proj": 0.45}}


def randomize(model, seed, wider=None):
    """Every parameter drawn anew (norm weights around 1, other vectors - biases, sinks - and
    matrices around 0), the routing-bias buffers too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if any(name.endswith(k) for k in (wider or {})):
                p.copy_(next(v for k, v in wider.items() if name.endswith(k)) * r)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * r)
            elif p.dim() == 1:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.15 * r)
        for name, b in model.named_buffers():
            if "bias" in name and b.dtype.is_floating_point:  # e_score_correction_bias
                b.copy_(0.5 * torch.randn(b.shape, generator=g, dtype=torch.float32))


def unique_values(model):
    """Nudges repeated parameter (and saved buffer) values apart by an ulp until no two are equal, so each value the
    converter writes can be traced back to its parameter (weights_from_gguf)."""
    saved = model.state_dict()
    params = list(model.parameters()) + [b for n, b in model.named_buffers() if n in saved]
    with torch.no_grad():
        while True:
            flat = np.concatenate([p.detach().numpy().ravel() for p in params])
            _, first, counts = np.unique(flat, return_index=True, return_counts=True)
            if counts.max() == 1:
                return
            taken = np.zeros(flat.size, bool)
            taken[first] = True
            at = 0
            for p in params:
                v = p.detach().numpy().ravel()
                move = ~taken[at:at + v.size]
                p.copy_(torch.from_numpy(np.where(move, np.nextafter(v, np.float32(np.inf)), v).reshape(p.shape)))
                at += v.size


def make_model(tf, hf_class, config, seed, wider=None):
    torch.manual_seed(seed)
    config.architectures = [hf_class]
    config._attn_implementation = "eager"
    model = getattr(tf, hf_class)(config)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    randomize(model, seed, wider)
    unique_values(model)
    model.eval()
    return model


def as_float64(model):
    """A float64 copy with the RoPE tables recomputed in float64."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    m = copy.deepcopy(model).double()
    with Float64(), torch.no_grad():
        for mod in m.modules():
            if hasattr(mod, "inv_freq") and hasattr(mod, "rope_type"):
                fn = (mod.compute_default_rope_parameters if mod.rope_type == "default"
                      else ROPE_INIT_FUNCTIONS[mod.rope_type])
                inv, scale = fn(mod.config, device=torch.device("cpu"))
                assert inv.dtype == torch.float64 and torch.allclose(inv, mod.inv_freq, rtol=1e-6), type(mod)
                mod.inv_freq = inv
                mod.original_inv_freq = inv.clone()
                mod.attention_scaling = scale
    return m


def forward64(model, ids, past=None):
    mode = Float64()
    with mode, torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), past_key_values=past, use_cache=True)
    assert not mode.low, f"operations still below float64: {sorted(mode.low)}"
    return out.logits[0].double(), out.past_key_values


def greedy(model, prompt):
    logits, past = forward64(model, prompt)
    ids, margins, chosen = [], [], []
    last = logits[-1]
    for step in range(STEPS):
        top = torch.topk(last, 2)
        ids.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        chosen.append(last.numpy())
        if step + 1 < STEPS:
            step_logits, past = forward64(model, [ids[-1]], past)
            last = step_logits[-1]
    if min(margins) < MIN_MARGIN:
        return logits.numpy(), ids, margins, np.stack(chosen), float("nan")
    # the same sequence without the cache: the chosen logits again, and the same argmax
    full, _ = forward64(model, prompt + ids[:-1])
    recompute = float(np.abs(full[T - 1:].numpy() - np.stack(chosen)).max())
    assert recompute < 1e-9 * max(1.0, float(np.abs(full).max())), recompute
    return logits.numpy(), ids, margins, np.stack(chosen), recompute


def convert(llama_cpp, hf_dir, hf_class, outtype, out, n_vocab):
    import gguf
    from conversion import get_model_class

    cls = get_model_class(hf_class)

    def stub_vocab(self):
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n_vocab)])
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n_vocab)
        self.gguf_writer.add_token_merges([])

    cls.set_vocab = stub_vocab
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    cls(hf_dir, ftype, out, eager=True).write()


def legacy_kv_b(f32_path, out_path):
    """The f32 GGUF as llama.cpp's converter wrote deepseek2 before it split kv_b_proj (an "old legacy" file to
    llama.cpp's loader, which still runs it): one `attn_kv_b` [heads (nope + v), kv_lora] per layer in place of
    `attn_k_b` / `attn_v_b`, key_length / value_length the per-head nope + rope and v, no *_mla keys, one kv
    head per query head. The same weights: the output must not change."""
    import gguf

    r = gguf.GGUFReader(str(f32_path))
    arch = r.fields["general.architecture"].contents()
    f = {k: v.contents() for k, v in r.fields.items()}
    heads = f[f"{arch}.attention.head_count"]
    w = gguf.GGUFWriter(str(out_path), arch)
    for k, field in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = field.contents()
        if k == f"{arch}.attention.key_length":
            v = f[f"{arch}.attention.key_length_mla"]
        elif k == f"{arch}.attention.value_length":
            v = f[f"{arch}.attention.value_length_mla"]
        elif k == f"{arch}.attention.head_count_kv":
            v = heads
        elif k.endswith("_mla"):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, v, gguf.GGUFValueType.ARRAY, sub_type=field.types[1])
        else:
            w.add_key_value(k, v, field.types[0])
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    for t in r.tensors:
        if t.name.endswith("attn_v_b.weight"):
            continue
        if t.name.endswith("attn_k_b.weight"):
            k_b = tensors[t.name]  # [heads, kv_lora, nope]
            v_b = tensors[t.name.replace("attn_k_b", "attn_v_b")]  # [heads, v, kv_lora]
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(-1, k_b.shape[1])
            w.add_tensor(t.name.replace("attn_k_b", "attn_kv_b"), np.ascontiguousarray(kv_b, dtype=np.float32))
        else:
            w.add_tensor(t.name, tensors[t.name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def weights_from_gguf(model, f32_path, q_path):
    """A copy of `model` with every parameter replaced by its value in the quantized file,
    dequantized by gguf-py: each parameter value is found in the converter's f32 file (the values
    are distinct: unique_values), and the quantized file's tensor of that name, at that position,
    gives the new value. The converter's renaming, stacking, splitting, transposing and Q/K
    permutation are undone by the values themselves."""
    import gguf
    from gguf import quants

    f32 = gguf.GGUFReader(str(f32_path))
    quantized = {t.name: t for t in gguf.GGUFReader(str(q_path)).tensors}
    vals, deq, types = [], [], {}
    for t in f32.tensors:
        if t.name == "rope_freqs.weight":  # computed from the config, not a parameter
            continue
        q = quantized[t.name]
        types[t.name] = q.tensor_type.name
        vals.append(np.asarray(t.data, dtype=np.float32).ravel())
        deq.append(np.asarray(quants.dequantize(q.data, q.tensor_type), dtype=np.float32).ravel())
        assert vals[-1].size == deq[-1].size, t.name
    vals, deq = np.concatenate(vals), np.concatenate(deq)
    order = np.argsort(vals, kind="stable")
    sorted_vals = vals[order]
    assert np.all(sorted_vals[1:] != sorted_vals[:-1]), "a value written twice"
    m = copy.deepcopy(model)
    used = np.zeros(vals.size, bool)
    with torch.no_grad():
        saved = m.state_dict()  # the persistent buffers (e_score_correction_bias) are in the file too
        tensors = list(m.named_parameters()) + [(n, b) for n, b in m.named_buffers() if n in saved]
        for name, p in tensors:
            v = p.detach().numpy().ravel()
            i = np.minimum(np.searchsorted(sorted_vals, v), sorted_vals.size - 1)
            assert np.all(sorted_vals[i] == v), f"{name}: values not in the converted file"
            used[order[i]] = True
            p.copy_(torch.from_numpy(deq[order[i]].reshape(p.shape)))
    assert used.all(), f"{int((~used).sum())} values in the GGUF that are no parameter's"
    return m, types


# DeepSeek-V3's release layouts, made from the tiny deepseek-v3 model: FP8 (DeepSeek-V3 / R1 / V3.1:
# every Linear of the decoder e4m3 with one f32 scale_inv per block; lm_head, embeddings, routers and
# norms as they were) and int4 (Kimi-K2-Thinking: compressed-tensors pack-quantized routed experts,
# symmetric, group 32, bf16 scales; attention, shared experts and dense MLP bf16). The tiny model's
# matrices are 24..112 wide, so the FP8 blocks are 16 x 16 (weight_block_size), partial blocks
# included, where the releases have 128 x 128.
FP8_BLOCK = 16
INT4_GROUP = 32


def fp8_quantize(w, ue8m0=False):
    """(e4m3 codes as torch.float8_e4m3fn, f32 scale_inv [ceil(out/B), ceil(in/B)], the decoded f32 weight).
    ue8m0 (DeepSeek-V3.1's scale_fmt): each scale rounded up to a power of two, still stored as f32."""
    out, inp = w.shape
    rb, cb = -(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)
    scale = torch.zeros(rb, cb, dtype=torch.float32)
    codes = torch.zeros(out, inp, dtype=torch.float8_e4m3fn)
    deq = torch.zeros(out, inp, dtype=torch.float32)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK].float()
            s = (blk.abs().max() / 448.0).clamp(min=1e-12)
            if ue8m0:
                s = torch.exp2(torch.ceil(torch.log2(s)))
            c = (blk / s).to(torch.float8_e4m3fn)
            scale[i, j] = s
            codes[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = c
            deq[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = c.float() * s
    return codes, scale, deq


def int4_quantize(w):
    """(packed int32 [out, in/8], bf16 scales [out, in/32], the decoded f32 weight: q * scale rounded to
    bf16, as compressed-tensors' _dequantize computes it in the scale's dtype)."""
    out, inp = w.shape
    g = w.float().reshape(out, inp // INT4_GROUP, INT4_GROUP)
    scale = (g.abs().amax(-1) / 7.0).clamp(min=1e-12).to(torch.bfloat16)
    q = torch.clamp(torch.round(g / scale.float().unsqueeze(-1)), -8, 7).to(torch.int64)
    deq = (q.to(torch.bfloat16) * scale.unsqueeze(-1)).reshape(out, inp).float()
    nib = (q.reshape(out, inp) + 8).numpy().astype(np.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8).view("<i4").reshape(out, inp // 8)
    return torch.from_numpy(packed.copy()), scale, deq


def release_layouts(model, hf_dir, out, name, prompt):
    """Writes <name>-fp8/ and <name>-int4/ beside <name>/ and returns their reference fields."""
    from safetensors.torch import load_file, save_file

    src = load_file(str(hf_dir / "model.safetensors"))
    config = json.loads((hf_dir / "config.json").read_text())
    fields = {}
    for kind in ("fp8", "fp8_ue8m0", "int4"):
        d = out / f"{name}-{kind.replace('_', '-')}"
        d.mkdir(exist_ok=True)
        tensors, decoded = {}, {}
        for k, w in src.items():
            linear = k.endswith(".weight") and w.dim() == 2 and "norm" not in k and not k.startswith(
                ("lm_head", "model.embed_tokens")) and not k.endswith("mlp.gate.weight")
            routed = ".mlp.experts." in k
            if kind.startswith("fp8") and linear:
                codes, scale, deq = fp8_quantize(w, ue8m0=kind == "fp8_ue8m0")
                tensors[k], tensors[k + "_scale_inv"] = codes, scale
                decoded[k] = deq
            elif kind == "int4" and linear and routed:
                packed, scale, deq = int4_quantize(w)
                base = k[:-len(".weight")]
                tensors[base + ".weight_packed"], tensors[base + ".weight_scale"] = packed, scale
                tensors[base + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int32)
                decoded[k] = deq
            elif kind == "int4" and linear:  # attention, shared experts, the dense MLP: bf16
                tensors[k] = w.to(torch.bfloat16)
                decoded[k] = tensors[k].float()
            else:
                tensors[k] = w
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        c = dict(config)
        if kind.startswith("fp8"):
            c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                        "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
            if kind == "fp8_ue8m0":
                c["quantization_config"]["scale_fmt"] = "ue8m0"
        else:
            c["quantization_config"] = {
                "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
                    "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP,
                    "block_structure": None, "dynamic": False, "observer": "minmax", "actorder": None}}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}
        (d / "config.json").write_text(json.dumps(c, indent=2) + "\n")
        # the reference: the same folder with the decoded weights in float32, loaded by transformers
        with tempfile.TemporaryDirectory() as tmp:
            save_file({k: decoded.get(k, v) for k, v in src.items()}, str(Path(tmp) / "model.safetensors"),
                      metadata={"format": "pt"})
            (Path(tmp) / "config.json").write_text(json.dumps(config))
            m = type(model).from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
        if hasattr(m, "set_experts_implementation"):
            m.set_experts_implementation("eager")
        m.eval()
        m64 = as_float64(m)
        logits, ids, margins, _, _ = greedy(m64, prompt)
        fields.update({f"logits_{kind}": logits.tolist(), f"greedy_ids_{kind}": ids,
                       f"greedy_margins_{kind}": margins})
        print(f"{name}-{kind.replace('_', '-')}: min greedy margin {min(margins):.4g}; greedy {ids}", flush=True)
    return fields


RELEASE_LAYOUTS = {"deepseek-v3"}
LEGACY_KV_B = {"deepseek-v2"}  # also writes <name>.kv_b.f32.gguf (legacy_kv_b)


def facts(out):
    """Markdown, per file pair: the metadata keys (tokenizer and general.* left out), the tensors
    outside the blocks and those of each distinct kind of block, with their GGUF shapes (ne: the
    fastest-varying dimension first) and their types in the q8_0 file."""
    import gguf

    for name in families():
        f32 = gguf.GGUFReader(str(out / f"{name}.f32.gguf"))
        q8 = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out / f"{name}.q8_0.gguf")).tensors}
        arch = f32.fields["general.architecture"].contents()
        print(f"### {name} (`{arch}`)\n")
        keys = [f"`{f.name.removeprefix(arch + '.')}` = {f.contents()!r}" for f in f32.fields.values()
                if not f.name.startswith(("tokenizer.", "GGUF.", "general."))]
        print("keys (`" + arch + ".` left out): " + ", ".join(keys) + "\n")
        blocks, seen = {}, {}
        for t in f32.tensors:
            parts = t.name.split(".")
            b = int(parts[1]) if parts[0] == "blk" else None
            blocks.setdefault(b, []).append(t)
        print("| tensor | ne (GGUF order) | q8_0 file |\n|---|---|---|")
        for b, ts in sorted(blocks.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            kind = tuple(sorted(".".join(t.name.split(".")[2:]) for t in ts)) if b is not None else None
            if kind is not None and kind in seen:
                continue
            if kind is not None:
                seen[kind] = b
            for t in sorted(ts, key=lambda t: t.name):
                print(f"| `{t.name}` | {[int(x) for x in t.shape]} | {q8[t.name]} |")
        others = sorted(b for b in blocks if b is not None and b not in seen.values())
        kinds = {b: next(v for k, v in seen.items() if k == tuple(sorted(
            ".".join(t.name.split(".")[2:]) for t in blocks[b]))) for b in others}
        if kinds:
            print("\n" + ", ".join(f"blk.{b} as blk.{k}" for b, k in kinds.items()) + ".")
        print()


def reload_check(tf, hf_dir, model, prompt):
    """The saved folder loads to the same float32 logits."""
    loaded = tf.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    loaded.eval()
    with torch.no_grad():
        a = model(input_ids=torch.tensor([prompt])).logits
        b = loaded(input_ids=torch.tensor([prompt])).logits
    return float((a - b).abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("--facts", action="store_true", help="print the GGUFs' keys and tensors (README) and stop")
    args = ap.parse_args()
    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
    sys.path.insert(0, str(args.llama_cpp))
    import transformers as tf

    if args.facts:
        return facts(args.out)

    torch.set_num_threads(1)
    logging.getLogger("hf-to-gguf").setLevel(logging.WARNING)
    for k, (name, (hf_class, config, gguf_arch, features, not_in_gguf)) in enumerate(families().items()):
        if args.only and name not in args.only.split(","):
            continue
        seed = SEED + 101 * k
        model = make_model(tf, hf_class, config, seed, WIDER.get(name))
        hf_dir = args.out / name
        model.save_pretrained(hf_dir)
        f32_path, q_path = args.out / f"{name}.f32.gguf", args.out / f"{name}.q8_0.gguf"
        for outtype, path in (("f32", f32_path), ("q8_0", q_path)):
            convert(args.llama_cpp, hf_dir, hf_class, outtype, path, V)
        if name in LEGACY_KV_B:
            legacy_kv_b(f32_path, args.out / f"{name}.kv_b.f32.gguf")
        m64 = as_float64(model)
        for attempt in range(20):  # the first prompt whose greedy steps are all clear of ties
            g = torch.Generator().manual_seed(seed + 1 + attempt)
            prompt = [int(i) for i in torch.randint(0, V, (T,), generator=g)]
            logits, ids, margins, chosen, recompute = greedy(m64, prompt)
            if min(margins) >= MIN_MARGIN:
                break
        else:
            sys.exit(f"{name}: no prompt in 20 with every greedy margin >= {MIN_MARGIN}")
        reload = reload_check(tf, hf_dir, model, prompt)
        assert reload < 1e-4, reload
        mq, types = weights_from_gguf(model, f32_path, q_path)
        logits_q, _ = forward64(as_float64(mq), prompt)
        ref = {
            "family": name, "hf_class": hf_class, "gguf_arch": gguf_arch, "features": features,
            "prompt_ids": prompt,
            "logits": logits.tolist(),
            "greedy_ids": ids,
            "greedy_margins": margins,
            "greedy_logits": chosen.tolist(),
            "logits_q8_0": logits_q.numpy().tolist(),
            "not_in_gguf": not_in_gguf,
            "notes": (
                f"transformers {tf.__version__}, torch {torch.__version__}; seed {seed}, prompt seed {seed + 1 + attempt} "
                f"(prompts tried: {attempt + 1}; every greedy margin >= {MIN_MARGIN}); eager attention; every "
                "operation in float64 (make_model_goldens.py: Float64). greedy: one step at a time with "
                f"transformers' KV cache; a full recompute of the {T + STEPS - 1}-token sequence gives the same "
                f"logits within {recompute:.2g}. logits_q8_0: the weights dequantized from {name}.q8_0.gguf "
                "(F32 tensors there - norms, biases, routers, sinks - unchanged), then the same float64 forward. "
                f"The saved folder reloads to the same float32 logits within {reload:.2g}."),
        }
        if name in RELEASE_LAYOUTS:
            notes = ref.pop("notes")
            ref.update(release_layouts(model, hf_dir, args.out, name, prompt))
            ref["notes"] = notes + (
                f" logits_fp8 / greedy_*_fp8: {name}-fp8/ (every decoder Linear e4m3, f32 scale_inv per "
                f"{FP8_BLOCK}x{FP8_BLOCK} block) decoded, same float64 forward; *_fp8_ue8m0: {name}-fp8-ue8m0/, the "
                "same with each scale a power of two (scale_fmt ue8m0, DeepSeek-V3.1's); logits_int4 / greedy_*_int4: "
                f"{name}-int4/ (routed experts compressed-tensors int4 group {INT4_GROUP}, bf16 scales; the rest "
                "bf16) decoded.")
        if name in GGUF_SEMANTICS:
            changes, why = GGUF_SEMANTICS[name]
            check_llama_cpp_rules(name, model.config)
            mg = with_config(tf, model, changes)
            logits_g, ids_g, margins_g, chosen_g, recompute_g = greedy(as_float64(mg), prompt)
            if min(margins_g) < MIN_MARGIN:  # the prompt is fixed by the fields above: reported, not replaced
                print(f"{name}: WARNING gguf-semantics greedy margin {min(margins_g):.4g} < {MIN_MARGIN}", flush=True)
            logits_qg, _ = forward64(as_float64(with_config(tf, mq, changes)), prompt)
            notes = ref.pop("notes")
            del ref["not_in_gguf"]  # kept last, with notes
            ref.update({
                "gguf_semantics": why,
                "logits_gguf": logits_g.tolist(),
                "greedy_ids_gguf": ids_g,
                "greedy_margins_gguf": margins_g,
                "greedy_logits_gguf": chosen_g.tolist(),
                "logits_q8_0_gguf": logits_qg.numpy().tolist(),
                "not_in_gguf": not_in_gguf,
            })
            rc = "not checked (margin under the minimum)" if recompute_g != recompute_g else f"within {recompute_g:.2g}"
            gguf_note = (f" *_gguf: the same forward and greedy steps with {changes} (gguf_semantics); min greedy "
                         f"margin {min(margins_g):.4g}; full recompute {rc}; they differ from logits by up to "
                         f"{np.abs(logits_g - logits).max():.3g}.")
            ref["notes"] = notes + gguf_note
            print(f"{name}: gguf semantics {changes}: min margin {min(margins_g):.4g} at step "
                  f"{int(np.argmin(margins_g))}; greedy {ids_g}; logits_gguf - logits max "
                  f"{np.abs(logits_g - logits).max():.3g} (first differing position "
                  f"{int(np.argmax(np.abs(logits_g - logits).max(1) > 0))}); logits_q8_0_gguf - logits_q8_0 max "
                  f"{np.abs(logits_qg.numpy() - logits_q.numpy()).max():.3g}; recompute {recompute_g:.2g}", flush=True)
        (args.out / f"{name}.ref.json").write_text(json.dumps(ref) + "\n")
        dq = float(np.abs(logits_q.numpy() - logits).max())
        print(f"{name}: min margin {min(margins):.4g} at step {int(np.argmin(margins))}; "
              f"greedy {ids}; q8_0 moves logits by {dq:.3g} (max |logit| {np.abs(logits).max():.3g}); "
              f"reload {reload:.2g}; recompute {recompute:.2g}; q8_0 types {sorted(set(types.values()))}", flush=True)


if __name__ == "__main__":
    main()
