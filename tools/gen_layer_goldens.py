#!/usr/bin/python3
"""Frozen golden data for whole MoE blocks (router + routed experts + shared experts).

Regenerate everything (one command, from the repository root):

    /usr/bin/python3 tools/gen_layer_goldens.py

Interpreter: Debian /usr/bin/python3 (3.11) with torch 1.13, numpy 1.24, mlx 0.32.4 and
mlx-lm 0.32.2 (mlx runs on the CPU).  The safetensors files are written by the tiny writer
in this file (8-byte little-endian header length, JSON header padded with spaces to a multiple
of 8, then the raw data); the `safetensors` package is not used.

Output: tests/goldens/layers/manifest.json and one folder per case
tests/goldens/layers/<case>/ holding

    config.json                 HF-style config of a tiny model of that family
    model.safetensors           (or model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json)
                                the weights of ONE MoE layer under the family's real tensor names,
                                plus distractors: model.embed_tokens.weight, a dense layer's mlp
                                and/or another layer's router, which loaders must ignore
    input.npy   float32 [T, D]  x
    output.npy  float32 [T, D]  reference block output y
    ids.npy     int32   [T, K]  reference routing: expert ids, slots ordered by descending
                                selection score (the quantity top-k is taken over)
    weights.npy float32 [T, K]  reference combine weights (after renorm and scaling), same slots

Recipe: every case has its own fixed seed; numpy.random.default_rng(seed) (PCG64) draws, in a
fixed order, every weight as float32 N(0, 1) / sqrt(fan_in) (fan_in = the input width of that
projection) and x as float32 N(0, 1).  Biases (GPT-OSS) are N(0, 1) * 0.5; DeepSeek/GLM/MiniMax
e_score_correction_bias is U(-0.05, 0.3) (fp32, always).  Rows of x whose routing has a margin
<= 1e-4 (K-th vs (K+1)-th selection score, and Kg-th vs (Kg+1)-th group score) or (sigmoid +
bias families) a non-positive biased score are redrawn from the same generator until none is
left.  BF16 cases round the float32 draws to bf16 (round to nearest even) and compute the
reference in float32 on the rounded weights; x stays float32.

References: a float32 torch reimplementation of the Hugging Face modeling class (index_add over
experts, as HF does), reading the weights back from the files just written, under their HF
names and layouts.  Where mlx-lm has the block, mlx-lm's own module is also run on the same
weights (parameters set directly, stacked as its sanitize() would) and the generator asserts
agreement to 1e-5 relative (max|a-b| <= 1e-5 * max|ref|).  Cases whose "source" is mlx-lm
take the golden from mlx-lm and are cross-checked by the torch code with the mlx-lm quirks
("overrides") switched on.
"""

import hashlib
import json
import os
import platform
import shutil
import struct
import sys
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "goldens", "layers")
MARGIN = 1e-4
XCHECK_TOL = 1e-5
VOCAB = 64
DENSE_F = 32  # intermediate size of the dense (non-MoE) layers' mlp

torch.set_num_threads(1)

# --------------------------------------------------------------------------------------------
# safetensors writer / reader (self-contained)

_ST_DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "I32": (np.int32, 4)}


def f32_to_bf16_bits(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = a.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def bf16_round(a):
    return bf16_bits_to_f32(f32_to_bf16_bits(a))


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, np.ndarray, st_dtype 'F32'|'BF16'|'F16'|'I32'|'U32'|'U8'); in name order."""
    header = {}
    blobs = []
    off = 0
    for name, arr, dt in sorted(tensors, key=lambda t: t[0]):
        if dt == "BF16":
            raw = f32_to_bf16_bits(arr).tobytes()
        elif dt == "F32":
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        elif dt == "I32":
            raw = np.ascontiguousarray(arr, dtype="<i4").tobytes()
        elif dt == "U32":
            raw = np.ascontiguousarray(arr, dtype="<u4").tobytes()
        elif dt == "F16":
            raw = np.ascontiguousarray(arr, dtype="<f2").tobytes()
        elif dt in ("U8", "F8_E4M3", "F8_E8M0"):
            raw = np.ascontiguousarray(arr, dtype="u1").tobytes()
        else:
            raise ValueError(dt)
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((-len(hb)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for raw in blobs:
            f.write(raw)
    return off


def read_safetensors(path):
    """-> {name: (np.float32 array, st_dtype)}"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        npdt, _ = _ST_DTYPES[h["dtype"]]
        a, b = h["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=npdt).reshape(h["shape"])
        if h["dtype"] == "BF16":
            arr = bf16_bits_to_f32(arr)
        out[name] = (arr.astype(np.float32) if h["dtype"] != "I32" else arr.copy(), h["dtype"])
    return out


def read_checkpoint(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for shard in sorted(set(wm.values())):
            part = read_safetensors(os.path.join(folder, shard))
            for k, v in part.items():
                assert wm[k] == shard, (k, shard)
            out.update(part)
        assert set(out) == set(wm)
        return out
    return read_safetensors(os.path.join(folder, "model.safetensors"))


# --------------------------------------------------------------------------------------------
# Case table

COMMON_ATTN = dict(vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                   tie_word_embeddings=False, hidden_act="silu", initializer_range=0.02)

CASES = [
    dict(name="deepseek_v3", family="deepseek_v3", seed=1001, D=32, F=16, E=16, K=4, T=32,
         layer=1, n_layers=3, layout="per_expert", dtype="f32", sharded=False,
         n_group=4, topk_group=2, rsf=2.5, n_shared=1, norm=True),
    dict(name="deepseek_v3_bf16", family="deepseek_v3", seed=1002, D=48, F=24, E=16, K=4, T=24,
         layer=1, n_layers=2, layout="per_expert", dtype="bf16", sharded=False,
         n_group=4, topk_group=2, rsf=2.5, n_shared=1, norm=True),
    dict(name="deepseek_v2", family="deepseek_v2", seed=1003, D=32, F=16, E=16, K=4, T=24,
         layer=1, n_layers=2, layout="per_expert", dtype="f32", sharded=False,
         n_group=4, topk_group=2, rsf=16.0, n_shared=2, norm=False),
    dict(name="mixtral", family="mixtral", seed=1004, D=40, F=24, E=8, K=2, T=33,
         layer=1, n_layers=2, layout="mixtral_w1w3w2", dtype="f32", sharded=False),
    dict(name="qwen2_moe", family="qwen2_moe", seed=1005, D=48, F=16, E=12, K=4, T=20,
         layer=1, n_layers=2, layout="per_expert", dtype="f32", sharded=False,
         shared_F=32, norm=False),
    dict(name="qwen3_moe_fused", family="qwen3_moe", seed=1006, D=32, F=20, E=16, K=4, T=40,
         layer=3, n_layers=4, layout="fused_gate_up", dtype="f32", sharded=False, norm=True),
    dict(name="olmoe", family="olmoe", seed=1007, D=32, F=16, E=16, K=4, T=17,
         layer=1, n_layers=2, layout="per_expert", dtype="f32", sharded=False, norm=False),
    dict(name="glm4_moe_sharded", family="glm4_moe", seed=1008, D=32, F=16, E=16, K=4, T=24,
         layer=2, n_layers=3, layout="per_expert", dtype="f32", sharded=True,
         n_group=1, topk_group=1, rsf=2.5, n_shared=1, norm=True),
    dict(name="gpt_oss", family="gpt_oss", seed=1009, D=32, F=16, E=16, K=4, T=24,
         layer=1, n_layers=2, layout="gpt_oss_interleaved_transposed", dtype="f32", sharded=False),
    dict(name="llama4_text", family="llama4_text", seed=1010, D=48, F=24, E=8, K=1, T=20,
         layer=1, n_layers=2, layout="llama4_fused_transposed", dtype="f32", sharded=False),
    dict(name="minimax_m2", family="minimax_m2", seed=1011, D=32, F=16, E=16, K=4, T=28,
         layer=1, n_layers=2, layout="mixtral_w1w3w2", dtype="f32", sharded=False),
    dict(name="qwen3_moe_switch_mlp", family="qwen3_moe", seed=1012, D=64, F=16, E=8, K=2, T=16,
         layer=1, n_layers=2, layout="switch_mlp_stacked", dtype="f32", sharded=False, norm=True,
         source="mlx"),
    dict(name="deepseek_v3_k1_mlx", family="deepseek_v3", seed=1013, D=32, F=16, E=8, K=1, T=16,
         layer=1, n_layers=2, layout="switch_mlp_stacked", dtype="f32", sharded=False,
         n_group=4, topk_group=2, rsf=2.5, n_shared=1, norm=True, source="mlx",
         overrides={"mask_fill": "legacy_zero", "renorm_only_if_k_gt_1": True, "renorm": "sum"}),
]

# router knobs per family, as HF transformers / the reference code compute them
HF_KNOBS = dict(mask_fill="neg_inf", renorm_only_if_k_gt_1=False)


def make_config(c):
    fam, D, F_, E, K, nl = c["family"], c["D"], c["F"], c["E"], c["K"], c["n_layers"]
    torch_dtype = "bfloat16" if c["dtype"] == "bf16" else "float32"
    if fam in ("deepseek_v3", "deepseek_v2"):
        v3 = fam == "deepseek_v3"
        cfg = dict(architectures=["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
                   model_type=fam, hidden_size=D, intermediate_size=DENSE_F,
                   moe_intermediate_size=F_, num_hidden_layers=nl, **COMMON_ATTN,
                   n_routed_experts=E, num_experts_per_tok=K, n_shared_experts=c["n_shared"],
                   routed_scaling_factor=c["rsf"],
                   topk_method="noaux_tc" if v3 else "group_limited_greedy",
                   n_group=c["n_group"], topk_group=c["topk_group"],
                   scoring_func="sigmoid" if v3 else "softmax", norm_topk_prob=c["norm"],
                   first_k_dense_replace=1, moe_layer_freq=1,
                   kv_lora_rank=16, q_lora_rank=24 if v3 else None, qk_rope_head_dim=8,
                   qk_nope_head_dim=8, v_head_dim=8, attention_bias=False, aux_loss_alpha=0.001,
                   seq_aux=True)
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    elif fam == "glm4_moe":
        # real GLM-4.5 configs carry no scoring_func / topk_method: sigmoid + noaux_tc implied
        cfg = dict(architectures=["Glm4MoeForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=DENSE_F, moe_intermediate_size=F_, num_hidden_layers=nl,
                   **COMMON_ATTN, head_dim=8, partial_rotary_factor=0.5, use_qk_norm=False,
                   attention_bias=True, rope_scaling=None,
                   n_routed_experts=E, num_experts_per_tok=K, n_shared_experts=c["n_shared"],
                   routed_scaling_factor=c["rsf"], n_group=c["n_group"],
                   topk_group=c["topk_group"], norm_topk_prob=c["norm"],
                   first_k_dense_replace=c["layer"], num_nextn_predict_layers=1)
    elif fam == "mixtral":
        cfg = dict(architectures=["MixtralForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=F_, num_hidden_layers=nl, **COMMON_ATTN,
                   num_local_experts=E, num_experts_per_tok=K, router_aux_loss_coef=0.02,
                   sliding_window=None, output_router_logits=False)
    elif fam == "qwen2_moe":
        cfg = dict(architectures=["Qwen2MoeForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=DENSE_F, moe_intermediate_size=F_,
                   shared_expert_intermediate_size=c["shared_F"], num_hidden_layers=nl,
                   **COMMON_ATTN, num_experts=E, num_experts_per_tok=K,
                   norm_topk_prob=c["norm"], decoder_sparse_step=1, mlp_only_layers=[0],
                   use_sliding_window=False, router_aux_loss_coef=0.001)
    elif fam == "qwen3_moe":
        cfg = dict(architectures=["Qwen3MoeForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=DENSE_F, moe_intermediate_size=F_, num_hidden_layers=nl,
                   **COMMON_ATTN, head_dim=8, num_experts=E, num_experts_per_tok=K,
                   norm_topk_prob=c["norm"],
                   decoder_sparse_step=2 if nl == 4 else 1,
                   mlp_only_layers=[] if nl == 4 else [0],
                   attention_bias=False, router_aux_loss_coef=0.001)
    elif fam == "olmoe":
        cfg = dict(architectures=["OlmoeForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=F_, num_hidden_layers=nl, **COMMON_ATTN,
                   num_experts=E, num_experts_per_tok=K, norm_topk_prob=c["norm"],
                   clip_qkv=None, router_aux_loss_coef=0.01)
    elif fam == "gpt_oss":
        cfg = dict(architectures=["GptOssForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=F_, num_hidden_layers=nl, **COMMON_ATTN, head_dim=8,
                   num_local_experts=E, num_experts_per_tok=K, experts_per_token=K,
                   swiglu_limit=7.0, sliding_window=16, attention_bias=True,
                   layer_types=["sliding_attention", "full_attention"][:nl],
                   router_aux_loss_coef=0.9)
    elif fam == "llama4_text":
        cfg = dict(architectures=["Llama4ForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=F_, intermediate_size_mlp=DENSE_F, num_hidden_layers=nl,
                   **COMMON_ATTN, head_dim=12, num_local_experts=E, num_experts_per_tok=K,
                   interleave_moe_layer_step=2, moe_layers=[1], use_qk_norm=True,
                   no_rope_layers=[1, 0], attention_chunk_size=64, attention_bias=False)
    elif fam == "minimax_m2":
        cfg = dict(architectures=["MiniMaxM2ForCausalLM"], model_type=fam, hidden_size=D,
                   intermediate_size=F_, num_hidden_layers=nl, **COMMON_ATTN, head_dim=8,
                   rotary_dim=4, num_local_experts=E, num_experts_per_tok=K,
                   scoring_func="sigmoid", use_routing_bias=True, shared_intermediate_size=0,
                   use_qk_norm=True, router_jitter_noise=0.0)
    else:
        raise ValueError(fam)
    cfg["torch_dtype"] = torch_dtype
    return cfg


# --------------------------------------------------------------------------------------------
# Weight drawing

def normal(rng, shape, fan_in):
    return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))).astype(np.float32)


def draw_weights(c, rng):
    D, F_, E = c["D"], c["F"], c["E"]
    fam = c["family"]
    w = {}
    w["router"] = normal(rng, (E, D), D)
    if fam in ("deepseek_v3", "glm4_moe", "minimax_m2"):
        w["bias"] = rng.uniform(-0.05, 0.3, size=E).astype(np.float32)
    if fam == "gpt_oss":
        w["router_bias"] = (rng.standard_normal(E, dtype=np.float32) * 0.5).astype(np.float32)
    gain = 4.0 if fam == "gpt_oss" else 1.0  # GPT-OSS: wide pre-activations exercise the clamps
    w["gate"] = normal(rng, (E, F_, D), D) * np.float32(gain)
    w["up"] = normal(rng, (E, F_, D), D) * np.float32(gain)
    w["down"] = normal(rng, (E, D, F_), F_)
    if fam == "gpt_oss":
        w["gate_b"] = (rng.standard_normal((E, F_), dtype=np.float32) * 0.5).astype(np.float32)
        w["up_b"] = (rng.standard_normal((E, F_), dtype=np.float32) * 0.5).astype(np.float32)
        w["down_b"] = (rng.standard_normal((E, D), dtype=np.float32) * 0.5).astype(np.float32)
    sF = None
    if fam in ("deepseek_v3", "deepseek_v2", "glm4_moe"):
        sF = F_ * c["n_shared"]
    elif fam == "qwen2_moe":
        sF = c["shared_F"]
    elif fam == "llama4_text":
        sF = F_
    if sF is not None:
        w["sh_gate"] = normal(rng, (sF, D), D)
        w["sh_up"] = normal(rng, (sF, D), D)
        w["sh_down"] = normal(rng, (D, sF), sF)
    if fam == "qwen2_moe":
        w["sh_gate_w"] = normal(rng, (1, D), D)
    # distractors
    w["embed"] = normal(rng, (VOCAB, D), D)
    w["dense_gate"] = normal(rng, (DENSE_F, D), D)
    w["dense_up"] = normal(rng, (DENSE_F, D), D)
    w["dense_down"] = normal(rng, (D, DENSE_F), DENSE_F)
    w["other_router"] = normal(rng, (E, D), D)
    if c["dtype"] == "bf16":
        for k in list(w):
            if k != "bias":  # e_score_correction_bias stays fp32, as in real checkpoints
                w[k] = bf16_round(w[k])
    return w


def emit_tensors(c, w):
    """Canonical weights -> [(hf_name, array, st_dtype)] in the case's layout."""
    fam, L, E, F_ = c["family"], c["layer"], c["E"], c["F"]
    wd = "BF16" if c["dtype"] == "bf16" else "F32"
    t = []

    def add(n, a, dt=wd):
        t.append((n, np.ascontiguousarray(a, dtype=np.float32), dt))

    add("model.embed_tokens.weight", w["embed"])
    if fam in ("mixtral", "minimax_m2"):
        blk = f"model.layers.{L}.block_sparse_moe"
    elif fam == "llama4_text":
        blk = f"model.layers.{L}.feed_forward"
    else:
        blk = f"model.layers.{L}.mlp"

    # router
    if fam == "gpt_oss":
        add(f"{blk}.router.weight", w["router"])
        add(f"{blk}.router.bias", w["router_bias"])
    elif fam == "llama4_text":
        add(f"{blk}.router.weight", w["router"])
    else:
        add(f"{blk}.gate.weight", w["router"])
    if "bias" in w:
        if fam == "minimax_m2":
            add(f"{blk}.e_score_correction_bias", w["bias"], "F32")
        else:
            add(f"{blk}.gate.e_score_correction_bias", w["bias"], "F32")

    # routed experts
    lay = c["layout"]
    if lay == "per_expert":
        for e in range(E):
            add(f"{blk}.experts.{e}.gate_proj.weight", w["gate"][e])
            add(f"{blk}.experts.{e}.up_proj.weight", w["up"][e])
            add(f"{blk}.experts.{e}.down_proj.weight", w["down"][e])
    elif lay == "mixtral_w1w3w2":
        for e in range(E):
            add(f"{blk}.experts.{e}.w1.weight", w["gate"][e])
            add(f"{blk}.experts.{e}.w3.weight", w["up"][e])
            add(f"{blk}.experts.{e}.w2.weight", w["down"][e])
    elif lay == "fused_gate_up":
        add(f"{blk}.experts.gate_up_proj", np.concatenate([w["gate"], w["up"]], axis=1))
        add(f"{blk}.experts.down_proj", w["down"])
    elif lay == "llama4_fused_transposed":
        add(f"{blk}.experts.gate_up_proj",
            np.concatenate([w["gate"], w["up"]], axis=1).transpose(0, 2, 1))
        add(f"{blk}.experts.down_proj", w["down"].transpose(0, 2, 1))
    elif lay == "gpt_oss_interleaved_transposed":
        gu = np.empty((E, 2 * F_, c["D"]), np.float32)
        gu[:, 0::2] = w["gate"]
        gu[:, 1::2] = w["up"]
        gub = np.empty((E, 2 * F_), np.float32)
        gub[:, 0::2] = w["gate_b"]
        gub[:, 1::2] = w["up_b"]
        add(f"{blk}.experts.gate_up_proj", gu.transpose(0, 2, 1))
        add(f"{blk}.experts.gate_up_proj_bias", gub)
        add(f"{blk}.experts.down_proj", w["down"].transpose(0, 2, 1))
        add(f"{blk}.experts.down_proj_bias", w["down_b"])
    elif lay == "switch_mlp_stacked":
        add(f"{blk}.switch_mlp.gate_proj.weight", w["gate"])
        add(f"{blk}.switch_mlp.up_proj.weight", w["up"])
        add(f"{blk}.switch_mlp.down_proj.weight", w["down"])
    else:
        raise ValueError(lay)

    # shared experts
    if "sh_gate" in w:
        sh = {"qwen2_moe": "shared_expert", "llama4_text": "shared_expert"}.get(fam, "shared_experts")
        add(f"{blk}.{sh}.gate_proj.weight", w["sh_gate"])
        add(f"{blk}.{sh}.up_proj.weight", w["sh_up"])
        add(f"{blk}.{sh}.down_proj.weight", w["sh_down"])
    if "sh_gate_w" in w:
        add(f"{blk}.shared_expert_gate.weight", w["sh_gate_w"])

    # distractors: layer 0's dense mlp (families with a dense layer), another layer's router
    dense_ff = "feed_forward" if fam == "llama4_text" else "mlp"
    if fam in ("deepseek_v3", "deepseek_v2", "glm4_moe", "qwen2_moe", "qwen3_moe", "llama4_text"):
        add(f"model.layers.0.{dense_ff}.gate_proj.weight", w["dense_gate"])
        add(f"model.layers.0.{dense_ff}.up_proj.weight", w["dense_up"])
        add(f"model.layers.0.{dense_ff}.down_proj.weight", w["dense_down"])
    other = {"qwen3_moe": 1 if c["n_layers"] == 4 else None, "mixtral": 0, "olmoe": 0,
             "gpt_oss": 0, "minimax_m2": 0}.get(fam)
    if other is not None:
        ob = blk.replace(f"model.layers.{L}.", f"model.layers.{other}.")
        add(f"{ob}.router.weight" if fam == "gpt_oss" else f"{ob}.gate.weight", w["other_router"])
    return t, blk


# --------------------------------------------------------------------------------------------
# torch reference (reimplementation of the HF modeling classes), reading HF names

def t_(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def swiglu_mlp(x, g, u, d):
    return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)


def route_torch(c, logits, bias, knobs):
    """-> ids [T,K] (slots by descending selection score), weights [T,K], margin info."""
    fam, K, E = c["family"], c["K"], c["E"]
    T = logits.shape[0]
    group_gap = None
    if fam in ("deepseek_v3", "glm4_moe", "minimax_m2"):
        scores = logits.sigmoid()
        sel = scores + bias
        G = c.get("n_group", 1)
        if G > 1:
            gs = sel.view(T, G, E // G).topk(2, dim=-1)[0].sum(-1)
            gsorted = gs.sort(dim=-1, descending=True)[0]
            group_gap = gsorted[:, c["topk_group"] - 1] - gsorted[:, c["topk_group"]]
            gidx = torch.topk(gs, k=c["topk_group"], dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
            smask = gmask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
            fill = 0.0 if knobs["mask_fill"] == "legacy_zero" else float("-inf")
            sel_m = sel.masked_fill(~smask.bool(), fill)
            sel_gap_vec = sel.masked_fill(~smask.bool(), float("-inf"))
        else:
            sel_m = sel_gap_vec = sel
        ids = torch.topk(sel_m, k=K, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        norm = c.get("norm", True) if fam != "minimax_m2" else True
        if norm and not (knobs["renorm_only_if_k_gt_1"] and K == 1):
            mode = knobs.get("renorm", "sum_eps")
            if mode == "sum_eps":
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            elif mode == "sum":
                w = w / w.sum(-1, keepdim=True)
        w = w * c.get("rsf", 1.0)
        selv = sel_m
    elif fam == "deepseek_v2":
        scores = logits.softmax(dim=-1)
        G = c["n_group"]
        gs = scores.view(T, G, E // G).max(dim=-1).values
        gsorted = gs.sort(dim=-1, descending=True)[0]
        group_gap = gsorted[:, c["topk_group"] - 1] - gsorted[:, c["topk_group"]]
        gidx = torch.topk(gs, k=c["topk_group"], dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        selv = scores.masked_fill(~smask.bool(), 0.0)  # HF uses 0.0 (softmax > 0: harmless)
        sel_gap_vec = scores.masked_fill(~smask.bool(), float("-inf"))
        w, ids = torch.topk(selv, k=K, dim=-1, sorted=False)
        w = w * c["rsf"]  # HF/mlx: no renorm at all for V2, always x rsf (norm_topk_prob false)
    elif fam in ("qwen2_moe", "qwen3_moe", "olmoe", "mixtral"):
        probs = F.softmax(logits, dim=1, dtype=torch.float)
        w, ids = torch.topk(probs, K, dim=-1)
        if fam == "mixtral" or c.get("norm"):
            w = w / w.sum(dim=-1, keepdim=True)
        selv = sel_gap_vec = probs
    elif fam == "gpt_oss":
        top, ids = torch.topk(logits, K, dim=-1)
        w = F.softmax(top, dim=1)
        selv = sel_gap_vec = logits
    elif fam == "llama4_text":
        top, ids = torch.topk(logits, K, dim=1)
        w = torch.sigmoid(top.float())
        selv = sel_gap_vec = logits
    else:
        raise ValueError(fam)
    # slot order: descending selection score, ties -> lower id (moekit's canonical order)
    sv = selv.gather(1, ids)
    order = sorted_slots(sv, ids)
    ids = ids.gather(1, order)
    w = w.gather(1, order)
    s = sel_gap_vec.sort(dim=-1, descending=True)[0]
    gap = s[:, K - 1] - s[:, K]
    return ids, w, gap, group_gap


def sorted_slots(sv, ids):
    T, K = ids.shape
    order = torch.empty_like(ids)
    for t in range(T):
        o = sorted(range(K), key=lambda k: (-float(sv[t, k]), int(ids[t, k])))
        order[t] = torch.tensor(o)
    return order


def reference_torch(c, st, x, knobs):
    """st: {hf_name: (array, dtype)} read back from disk. Returns y, ids, weights, gaps, stats."""
    fam, L, E, F_ = c["family"], c["layer"], c["E"], c["F"]
    g = lambda n: t_(st[n][0])
    blk = {"mixtral": f"model.layers.{L}.block_sparse_moe",
           "minimax_m2": f"model.layers.{L}.block_sparse_moe",
           "llama4_text": f"model.layers.{L}.feed_forward"}.get(fam, f"model.layers.{L}.mlp")
    xt = t_(x)
    T = xt.shape[0]
    stats = {}
    # --- router
    if fam == "gpt_oss":
        logits = F.linear(xt, g(f"{blk}.router.weight"), g(f"{blk}.router.bias"))
    elif fam == "llama4_text":
        logits = F.linear(xt, g(f"{blk}.router.weight"))
    else:
        logits = F.linear(xt.float(), g(f"{blk}.gate.weight").float())
    bias = None
    if fam in ("deepseek_v3", "glm4_moe"):
        bias = g(f"{blk}.gate.e_score_correction_bias")
    elif fam == "minimax_m2":
        bias = g(f"{blk}.e_score_correction_bias")
    ids, w, gap, ggap = route_torch(c, logits, bias, knobs)
    if bias is not None:
        stats["row_min_biased"] = (logits.sigmoid() + bias).min(-1).values
        stats["min_biased_score"] = float(stats["row_min_biased"].min())
        unb = torch.topk(logits.sigmoid(), c["K"], dim=-1)[1].sort(-1)[0]
        stats["tokens_where_bias_changes_selection"] = int(
            (unb != ids.sort(-1)[0]).any(-1).sum())

    # --- routed experts
    lay = c["layout"]
    y = torch.zeros_like(xt)
    if fam == "llama4_text":
        # HF Llama4TextMoe: dense scores (-inf elsewhere -> sigmoid 0) scale the expert INPUT
        gu = g(f"{blk}.experts.gate_up_proj")  # [E, D, 2F]
        dn = g(f"{blk}.experts.down_proj")  # [E, F, D]
        full = torch.full_like(logits, float("-inf")).scatter_(1, ids, logits.gather(1, ids))
        rs = torch.sigmoid(full.float())  # [T, E]
        routed_in = xt.repeat(E, 1) * rs.transpose(0, 1).reshape(-1, 1)
        hs = routed_in.view(E, -1, xt.shape[1])
        gate_up = torch.bmm(hs, gu)
        gate, up = gate_up.chunk(2, dim=-1)
        routed = torch.bmm(up * F.silu(gate), dn).view(-1, xt.shape[1])
        y = swiglu_mlp(xt, g(f"{blk}.shared_expert.gate_proj.weight"),
                       g(f"{blk}.shared_expert.up_proj.weight"),
                       g(f"{blk}.shared_expert.down_proj.weight"))
        y = y + routed.view(E, T, -1).sum(0)
        return y, ids, w, gap, ggap, stats

    def expert(e, xs):
        if lay == "per_expert":
            p = f"{blk}.experts.{e}"
            return swiglu_mlp(xs, g(f"{p}.gate_proj.weight"), g(f"{p}.up_proj.weight"),
                              g(f"{p}.down_proj.weight"))
        if lay == "mixtral_w1w3w2":  # w1 = gate, w3 = up, w2 = down
            p = f"{blk}.experts.{e}"
            return F.linear(F.silu(F.linear(xs, g(f"{p}.w1.weight"))) * F.linear(xs, g(f"{p}.w3.weight")),
                            g(f"{p}.w2.weight"))
        if lay == "fused_gate_up":  # HF v5 fused experts: linear(x, gate_up[e]).chunk(2)
            gate, up = F.linear(xs, g(f"{blk}.experts.gate_up_proj")[e]).chunk(2, dim=-1)
            return F.linear(F.silu(gate) * up, g(f"{blk}.experts.down_proj")[e])
        if lay == "switch_mlp_stacked":
            p = f"{blk}.switch_mlp"
            return swiglu_mlp(xs, g(f"{p}.gate_proj.weight")[e], g(f"{p}.up_proj.weight")[e],
                              g(f"{p}.down_proj.weight")[e])
        if lay == "gpt_oss_interleaved_transposed":  # HF GptOssExperts
            gate_up = xs @ g(f"{blk}.experts.gate_up_proj")[e] + g(f"{blk}.experts.gate_up_proj_bias")[e]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            stats["gate_clamped"] = stats.get("gate_clamped", 0) + int((gate > 7.0).sum())
            stats["up_clamped"] = stats.get("up_clamped", 0) + int((up.abs() > 7.0).sum())
            gate = gate.clamp(min=None, max=7.0)
            up = up.clamp(min=-7.0, max=7.0)
            glu = gate * torch.sigmoid(gate * 1.702)
            return ((up + 1) * glu) @ g(f"{blk}.experts.down_proj")[e] + g(f"{blk}.experts.down_proj_bias")[e]
        raise ValueError(lay)

    # HF: loop over hit experts, index_add weighted outputs
    mask = F.one_hot(ids, num_classes=E).permute(2, 1, 0)  # [E, K, T]
    for e in range(E):
        kpos, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        out = expert(e, xt[tok]) * w[tok, kpos, None]
        y.index_add_(0, tok, out)

    if fam in ("deepseek_v3", "deepseek_v2", "glm4_moe"):
        p = f"{blk}.shared_experts"
        y = y + swiglu_mlp(xt, g(f"{p}.gate_proj.weight"), g(f"{p}.up_proj.weight"),
                           g(f"{p}.down_proj.weight"))
    elif fam == "qwen2_moe":
        p = f"{blk}.shared_expert"
        sh = swiglu_mlp(xt, g(f"{p}.gate_proj.weight"), g(f"{p}.up_proj.weight"),
                        g(f"{p}.down_proj.weight"))
        sh = torch.sigmoid(F.linear(xt, g(f"{blk}.shared_expert_gate.weight"))) * sh
        y = y + sh
    return y, ids, w, gap, ggap, stats


# --------------------------------------------------------------------------------------------
# mlx-lm (its own module classes, parameters set directly)

def mlx_block(c, cfg, w):
    import mlx.core as mx
    import mlx.utils  # noqa: F401
    fam = c["family"]
    a = SimpleNamespace(**cfg)
    A = lambda v: mx.array(np.ascontiguousarray(v, dtype=np.float32))
    sw = lambda pre: [(f"{pre}.gate_proj.weight", A(w["gate"])), (f"{pre}.up_proj.weight", A(w["up"])),
                      (f"{pre}.down_proj.weight", A(w["down"]))]
    shared = lambda pre: [(f"{pre}.gate_proj.weight", A(w["sh_gate"])),
                          (f"{pre}.up_proj.weight", A(w["sh_up"])),
                          (f"{pre}.down_proj.weight", A(w["sh_down"]))]
    if fam == "deepseek_v3":
        from mlx_lm.models import deepseek_v3 as m
        mod, mname = m.DeepseekV3MoE(a), "mlx_lm.models.deepseek_v3.DeepseekV3MoE"
        params = [("gate.weight", A(w["router"])), ("gate.e_score_correction_bias", A(w["bias"]))] \
            + sw("switch_mlp") + shared("shared_experts")
    elif fam == "deepseek_v2":
        from mlx_lm.models import deepseek_v2 as m
        mod, mname = m.DeepseekV2MoE(a), "mlx_lm.models.deepseek_v2.DeepseekV2MoE"
        params = [("gate.weight", A(w["router"]))] + sw("switch_mlp") + shared("shared_experts")
    elif fam == "glm4_moe":
        from mlx_lm.models import glm4_moe as m
        a.topk_method = "noaux_tc"
        mod, mname = m.MoE(a), "mlx_lm.models.glm4_moe.MoE"
        params = [("gate.weight", A(w["router"])), ("gate.e_score_correction_bias", A(w["bias"]))] \
            + sw("switch_mlp") + shared("shared_experts")
    elif fam == "mixtral":
        from mlx_lm.models import mixtral as m
        mod, mname = m.MixtralSparseMoeBlock(a), "mlx_lm.models.mixtral.MixtralSparseMoeBlock"
        params = [("gate.weight", A(w["router"]))] + sw("switch_mlp")
    elif fam == "qwen2_moe":
        from mlx_lm.models import qwen2_moe as m
        mod, mname = m.Qwen2MoeSparseMoeBlock(a), "mlx_lm.models.qwen2_moe.Qwen2MoeSparseMoeBlock"
        params = [("gate.weight", A(w["router"])), ("shared_expert_gate.weight", A(w["sh_gate_w"]))] \
            + sw("switch_mlp") + shared("shared_expert")
    elif fam == "qwen3_moe":
        from mlx_lm.models import qwen3_moe as m
        mod, mname = m.Qwen3MoeSparseMoeBlock(a), "mlx_lm.models.qwen3_moe.Qwen3MoeSparseMoeBlock"
        params = [("gate.weight", A(w["router"]))] + sw("switch_mlp")
    elif fam == "olmoe":
        from mlx_lm.models import olmoe as m
        a.mlp_bias = False
        mod, mname = m.OlmoeSparseMoeBlock(a), "mlx_lm.models.olmoe.OlmoeSparseMoeBlock"
        params = [("gate.weight", A(w["router"]))] + sw("switch_mlp")
    elif fam == "gpt_oss":
        from mlx_lm.models import gpt_oss as m
        mod, mname = m.MLPBlock(a), "mlx_lm.models.gpt_oss.MLPBlock"
        params = [("router.weight", A(w["router"])), ("router.bias", A(w["router_bias"])),
                  ("experts.gate_proj.weight", A(w["gate"])), ("experts.gate_proj.bias", A(w["gate_b"])),
                  ("experts.up_proj.weight", A(w["up"])), ("experts.up_proj.bias", A(w["up_b"])),
                  ("experts.down_proj.weight", A(w["down"])), ("experts.down_proj.bias", A(w["down_b"]))]
    elif fam == "llama4_text":
        from mlx_lm.models import llama4 as m
        mod, mname = m.MoE(a), "mlx_lm.models.llama4.MoE"
        params = [("router.weight", A(w["router"]))] + sw("experts") + shared("shared_expert")
    elif fam == "minimax_m2":
        from mlx_lm.models import minimax as m
        mod, mname = m.MiniMaxSparseMoeBlock(a), "mlx_lm.models.minimax.MiniMaxSparseMoeBlock"
        params = [("gate.weight", A(w["router"])), ("e_score_correction_bias", A(w["bias"]))] \
            + sw("switch_mlp")
    else:
        return None
    mod.load_weights(params, strict=True)
    mod.eval()

    def run(x):
        y = mod(mx.array(x)[None])
        mx.eval(y)
        return np.array(y, dtype=np.float32)[0]

    gate = None
    if fam in ("deepseek_v3", "glm4_moe", "deepseek_v2"):
        def gate(x):
            inds, sc = mod.gate(mx.array(x)[None])
            mx.eval(inds, sc)
            return np.array(inds)[0], np.array(sc, dtype=np.float32)[0]
    return SimpleNamespace(run=run, gate=gate, name=mname, module=mod)


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


# --------------------------------------------------------------------------------------------

def build_case(c, versions):
    name = c["name"]
    d = os.path.join(OUT, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    rng = np.random.default_rng(c["seed"])
    cfg = make_config(c)
    w = draw_weights(c, rng)
    tensors, blk = emit_tensors(c, w)

    # write checkpoint
    if c["sharded"]:
        def shard_of(n):
            if n.startswith("model.embed_tokens") or ".layers.0." in n or ".gate." in n:
                return 0
            if ".experts." in n:
                return 0 if int(n.split(".experts.")[1].split(".")[0]) < c["E"] // 2 else 1
            return 1
        files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        total = 0
        wm = {}
        for s in (0, 1):
            part = [t for t in tensors if shard_of(t[0]) == s]
            total += write_safetensors(os.path.join(d, files[s]), part, {"format": "pt"})
            wm.update({t[0]: files[s] for t in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": dict(sorted(wm.items()))}, f, indent=2)
            f.write("\n")
    else:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    st = read_checkpoint(d)
    assert set(st) == {t[0] for t in tensors}

    # draw x, redraw rows until every routing margin holds
    T, D, K = c["T"], c["D"], c["K"]
    x = rng.standard_normal((T, D), dtype=np.float32)
    overrides = c.get("overrides", {})
    knobs = dict(HF_KNOBS)
    if c.get("source") == "mlx":
        knobs.update(overrides)
    redrawn = 0
    for _ in range(1000):
        y, ids, wts, gap, ggap, stats = reference_torch(c, st, x, knobs)
        bad = gap <= MARGIN
        if ggap is not None:
            bad |= ggap <= MARGIN
        if "row_min_biased" in stats:
            bad |= stats["row_min_biased"] <= 0
        rows = np.nonzero(bad.numpy())[0]
        if len(rows) == 0:
            break
        for r in rows:
            x[r] = rng.standard_normal(D, dtype=np.float32)
        redrawn += len(rows)
    else:
        raise RuntimeError(f"{name}: could not satisfy routing margins")
    assert float(gap.min()) > MARGIN
    if "min_biased_score" in stats:
        assert stats["min_biased_score"] > 0, name
        assert stats["tokens_where_bias_changes_selection"] > 0, name
    if c["family"] == "gpt_oss":
        assert stats.get("gate_clamped", 0) > 0 and stats.get("up_clamped", 0) > 0, stats

    y_t = y.numpy().astype(np.float32)
    ids_t = ids.numpy().astype(np.int32)
    w_t = wts.numpy().astype(np.float32)

    # mlx-lm
    mb = mlx_block(c, cfg, w)
    xcheck = None
    if mb is not None:
        y_m = mb.run(x)
        err = rel_err(y_m, y_t)
        if mb.gate is not None:
            mi, ms = mb.gate(x)
            for t in range(T):
                assert set(mi[t].tolist()) == set(ids_t[t].tolist()), (name, t)
                order = np.argsort(mi[t])
                ref_order = np.argsort(ids_t[t])
                np.testing.assert_allclose(ms[t][order], w_t[t][ref_order], rtol=XCHECK_TOL,
                                           atol=1e-7)
        assert err <= XCHECK_TOL, f"{name}: mlx-lm vs torch rel err {err:.3g}"
        xcheck = dict(module=mb.name, rel_err=err)

    if c.get("source") == "mlx":
        assert mb is not None
        y_out = y_m
        src = f"mlx-lm {versions['mlx_lm']} {mb.name}"
        xby = "torch reimplementation with the overrides applied (rel err %.2g)" % xcheck["rel_err"]
    else:
        y_out = y_t
        src = f"torch reimplementation of {HF_CLASS[c['family']]}"
        xby = ("mlx-lm %s %s (rel err %.2g)" % (versions["mlx_lm"], xcheck["module"], xcheck["rel_err"])
               if xcheck else "none")

    np.save(os.path.join(d, "input.npy"), x.astype(np.float32))
    np.save(os.path.join(d, "output.npy"), y_out.astype(np.float32))
    np.save(os.path.join(d, "ids.npy"), ids_t)
    np.save(os.path.join(d, "weights.npy"), w_t)

    names = sorted(t[0] for t in tensors)
    notes = NOTES.get(c["name"], "")
    notes += (" Rows of x redrawn for margins: %d." % redrawn)
    notes += " Min K-th vs (K+1)-th selection gap: %.3g." % float(gap.min())
    if ggap is not None:
        notes += " Min group gap: %.3g." % float(ggap.min())
    for k, v in stats.items():
        if k == "row_min_biased":
            continue
        notes += " %s: %s." % (k, round(v, 4) if isinstance(v, float) else v)
    return {
        "name": name, "dir": name, "family": c["family"], "model_type": cfg["model_type"],
        "layer": c["layer"], "block_prefix": blk,
        "source": src, "cross_checked_by": xby,
        "layout": c["layout"], "dtype": c["dtype"], "sharded": c["sharded"],
        "overrides": overrides, "tolerance": 1e-4,
        "sizes": {"T": T, "D": D, "F": c["F"], "E": c["E"], "K": K},
        "seed": c["seed"],
        "tensors": compress_names(tensors, c["E"]),
        "distractors": [n for n in names if not n.startswith(blk + ".")],
        "notes": notes.strip(),
    }


def compress_names(tensors, E):
    """{name: [dtype, shape]} with per-expert names folded to '...experts.{e}...' (e = 0..E-1)."""
    out = {}
    for n, a, dt in sorted(tensors, key=lambda t: t[0]):
        if ".experts." in n and n.split(".experts.")[1].split(".")[0].isdigit():
            head, tail = n.split(".experts.")
            e, rest = tail.split(".", 1)
            key = f"{head}.experts.{{e}}.{rest}"
            if key in out:
                continue
            n = key
            shape = list(a.shape)
            out[n] = [dt, shape, f"e = 0..{E - 1}"]
        else:
            out[n] = [dt, list(a.shape)]
    return out


HF_CLASS = {
    "deepseek_v3": "transformers DeepseekV3MoE/DeepseekV3TopkRouter (= DeepSeek-V3 reference MoEGate)",
    "deepseek_v2": "transformers DeepseekV2Moe/DeepseekV2TopkRouter",
    "glm4_moe": "transformers Glm4MoeMoE/Glm4MoeTopkRouter",
    "mixtral": "transformers MixtralSparseMoeBlock",
    "qwen2_moe": "transformers Qwen2MoeSparseMoeBlock",
    "qwen3_moe": "transformers Qwen3MoeSparseMoeBlock",
    "olmoe": "transformers OlmoeSparseMoeBlock",
    "gpt_oss": "transformers GptOssMLP (GptOssTopKRouter + GptOssExperts)",
    "llama4_text": "transformers Llama4TextMoe",
    "minimax_m2": "transformers MiniMaxM2SparseMoeBlock (+1e-20 in the renorm as MiniMax's reference and mlx-lm)",
}

NOTES = {
    "deepseek_v3": "sigmoid scores, fp32 e_score_correction_bias ~U(-0.05,0.3) (selection only), "
                   "groups: top-2 sum, G=4 Kg=2, masked with -inf; weights = unbiased sigmoid, "
                   "/(sum+1e-20), x2.5 once; 1 shared expert (width F) ungated.",
    "deepseek_v3_bf16": "Same semantics as deepseek_v3. All weights BF16 except "
                        "e_score_correction_bias (F32). Reference = fp32 math on the bf16 values.",
    "deepseek_v2": "softmax scores, group_limited_greedy (group score = max), G=4 Kg=2; "
                   "norm_topk_prob=false -> no renorm; x rsf=16 once; 2 shared experts fused "
                   "into one MLP of width 2F.",
    "mixtral": "softmax over E then top-2 and renorm (== softmax over the 2 selected logits).",
    "qwen2_moe": "softmax, top-4, norm_topk_prob=false (no renorm); shared expert width 32 "
                 "gated per token by sigmoid(x . shared_expert_gate.weight[0]). Layer 0 is "
                 "dense (mlp_only_layers=[0]).",
    "qwen3_moe_fused": "HF v5 fused layout: gate_up_proj [E,2F,D], gate = rows 0..F-1, up = rows "
                       "F..2F-1; down_proj [E,D,F]. decoder_sparse_step=2 -> layers 1 and 3 are "
                       "MoE; layer 1's router is a distractor.",
    "olmoe": "softmax, top-4, norm_topk_prob=false.",
    "glm4_moe_sharded": "deepseek_v3 semantics with n_group=1 (no group limit), rsf 2.5, "
                        "first_k_dense_replace=2 (layers 0,1 dense). config.json has no "
                        "scoring_func/topk_method (as real GLM-4.5 configs). Two shards + "
                        "model.safetensors.index.json; experts split across shards.",
    "gpt_oss": "top-4 on raw logits (router has a bias), softmax over the 4; gate_up_proj "
               "[E,D,2F] columns interleaved (gate = 0,2,4..., up = 1,3,5...), bias likewise; "
               "g=min(gate,7), u=clamp(up,-7,7), h=g*sigmoid(1.702g)*(u+1); down_proj [E,F,D] "
               "+ bias. gate/up weights drawn x4 so both clamps engage. mlx-lm's sanitize() "
               "slices axis -2 (the original [E,2F,D] MXFP4 layout), so the mlx-lm cross-check "
               "sets its SwitchGLU parameters directly.",
    "llama4_text": "top-1 on raw logits, w = sigmoid(logit) multiplied into the expert INPUT "
                   "(not the output); always-on shared expert (width F). gate_up_proj [E,D,2F] "
                   "gate = first F columns. interleave_moe_layer_step=2 -> layer 1 MoE, layer 0 "
                   "dense (feed_forward.*, width intermediate_size_mlp).",
    "minimax_m2": "sigmoid + e_score_correction_bias (at block_sparse_moe.e_score_correction_bias, "
                  "not under gate), weights from unbiased sigmoid, /(sum+1e-20), no scale, no shared.",
    "qwen3_moe_switch_mlp": "mlx-lm stacked layout switch_mlp.{gate,up,down}_proj.weight [E,out,in]; "
                            "semantics identical to HF qwen3_moe (renorm plain sum).",
    "deepseek_v3_k1_mlx": "mlx-lm quirk case: K=1 with norm_topk_prob=true. HF/DeepSeek renorm "
                          "(weight = rsf exactly); mlx-lm skips renorm when K=1, so the golden "
                          "weight is sigmoid(logit)*2.5. Apply the overrides to reproduce. Biased "
                          "scores are all positive, so legacy_zero vs -inf masking does not change "
                          "the selection here.",
}


def main():
    import importlib.metadata as md
    import mlx.core as mx
    versions = {
        "python": platform.python_version(), "interpreter": sys.executable,
        "torch": torch.__version__, "numpy": np.__version__, "mlx": mx.__version__,
        "mlx_lm": md.version("mlx-lm"),
    }
    os.makedirs(OUT, exist_ok=True)
    for entry in os.listdir(OUT):
        p = os.path.join(OUT, entry)
        if os.path.isdir(p):
            shutil.rmtree(p)
    cases = []
    for c in CASES:
        cases.append(build_case(c, versions))
        print("ok", c["name"], cases[-1]["cross_checked_by"])
    manifest = {
        "recipe": {
            "command": "/usr/bin/python3 tools/gen_layer_goldens.py",
            "interpreter": versions["interpreter"], "python": versions["python"],
            "torch": versions["torch"], "numpy": versions["numpy"], "mlx": versions["mlx"],
            "mlx_lm": versions["mlx_lm"],
            "mlx_device": "cpu",
            "safetensors_writer": "own minimal writer in tools/gen_layer_goldens.py (no safetensors package)",
            "seeds": {c["name"]: c["seed"] for c in CASES},
            "rng": "numpy.random.default_rng(seed) (PCG64), one generator per case, fixed draw order",
            "draw": "weights float32 N(0,1)/sqrt(fan_in) (GPT-OSS gate/up x4); GPT-OSS biases "
                    "N(0,1)*0.5; e_score_correction_bias U(-0.05,0.3) fp32; x float32 N(0,1); "
                    "rows of x redrawn until every token's K-th vs (K+1)-th selection score (and "
                    "Kg-th vs (Kg+1)-th group score) differ by > 1e-4 and biased sigmoid scores "
                    "are > 0; bf16 cases round weights to bf16 (RNE), reference in fp32",
            "ids_order": "slots ordered by descending selection score, ties by lower id",
            "tolerance_meaning": "max|y - y_ref| <= tolerance * max|y_ref|",
            "mlx_crosscheck": "asserted max|y_mlx - y_torch| <= 1e-5 * max|y_torch|",
        },
        "cases": cases,
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    total = 0
    for dp, _, fs in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(dp, f)) for f in fs)
    print("total bytes", total)
    assert total < 2 * 1024 * 1024, total


if __name__ == "__main__":
    main()
