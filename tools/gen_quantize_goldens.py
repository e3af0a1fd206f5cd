#!/usr/bin/python3
"""Frozen goldens for `moekit quantize`, produced by mlx and mlx-lm themselves.

Regenerate (from the repository root; needs scripts/setup.sh --goldens):

    /usr/bin/python3 tools/gen_quantize_goldens.py

Interpreter: Debian /usr/bin/python3 (3.11) with numpy 1.24, mlx 0.32.4 and mlx-lm 0.32.2 (CPU).

1. quantize_vectors.safetensors: rows chosen to hit the quantizer's edge cases (random, all
   zero, constant positive / negative, tiny, one spike, negative-dominant) as f32 and bf16, and
   for every bits x group size the codes, scales and biases mlx.core.quantize returns.

2. One case per family: a tiny but whole decoder model of mlx-lm's own model class (2 layers,
   attention, norms, embeddings, lm_head, E = 4 experts; DeepSeek-V2 and GLM-4-MoE with a dense
   first layer).  Its float checkpoint is written in the Hugging Face layout (per-expert tensors,
   `w1/w2/w3` for Mixtral and MiniMax), BF16 (a selection bias F32, as the real checkpoints
   store it; GPT-OSS in its fused, transposed, interleaved layout, which mlx-lm quantizes from
   the same values in its own layout since its loader reads only the MXFP4 release), every value
   drawn by `values()` below from the tensor's name, so the C++ test
   rebuilds the identical checkpoint from the manifest without it being checked in.  Then
   mlx_lm.convert's quantizing path runs on it unchanged: mlx_lm.utils.load_model, the
   torch_dtype cast with the model's cast_predicate, mlx_lm.utils.quantize_model (with the
   model's own quant_predicate, a mixed recipe from mlx_lm.convert, or a router-bits predicate),
   save_model and save_config.  The manifest records every tensor it wrote (name, dtype, shape,
   FNV-1a 64 of its bytes) and its `quantization` entry; output.npy is the converted model's MoE
   block (model.layers[L].mlp / block_sparse_moe) on input.npy.

The test (tests/io/quantize_test.cpp) runs `quantize_checkpoint` on the rebuilt checkpoint and
checks: the same tensors, byte for byte; the same quantization entries; and moekit's forward of
layer L on its own output equal to mlx-lm's module (<= 1e-5 relative).
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_layer_goldens as L  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.utils  # noqa: E402
import mlx_lm  # noqa: E402
import importlib  # noqa: E402
mlx_convert = importlib.import_module("mlx_lm.convert")
from mlx_lm import utils as mlx_utils  # noqa: E402

OUT = os.path.join(L.ROOT, "tests", "goldens", "quantize")
MASK = (1 << 64) - 1


# --- values drawn from a tensor's name (the C++ test has the twin: quantize_test.cpp) --------
def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & MASK
    return h


def values(name, n, amp_log2, offset):
    """Element i: splitmix64(fnv1a64(name) + i * golden) -> u = top 24 bits / 2^24 in [0, 1);
    v = offset + 2^amp_log2 * (2u - 1) in f32 (every step exact: no rounding to agree on)."""
    with np.errstate(over="ignore"):
        z = np.uint64(fnv1a64(name.encode())) + np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) / np.float32(1 << 24)
    return np.float32(offset) + np.float32(2.0 ** amp_log2) * (np.float32(2) * u - np.float32(1))


def draw_spec(name, shape):
    """(amp_log2, offset) of a tensor: norms around 1, biases and weights small."""
    if "norm" in name:
        return -4, 1.0
    if name.endswith("e_score_correction_bias"):
        return -3, 0.0
    if name.endswith(".bias"):
        return -5, 0.0
    return -3, 0.0


BASE = dict(vocab_size=64, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="bfloat16")
FAMILIES = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1,
                      mlp_only_layers=[], norm_topk_prob=True),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=128, decoder_sparse_step=1, mlp_only_layers=[],
                      norm_topk_prob=False),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False),
    "deepseek_v2": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
                        first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=64, q_lora_rank=None,
                        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64, n_group=2, topk_group=1,
                        topk_method="group_limited_greedy", routed_scaling_factor=1.0, scoring_func="softmax",
                        norm_topk_prob=False, rope_scaling={"type": "linear", "factor": 1.0}),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                     norm_topk_prob=True, partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True,
                     rope_scaling=None),
    "deepseek_v3": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
                        first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=64, q_lora_rank=96,
                        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64, n_group=2, topk_group=1,
                        topk_method="noaux_tc", routed_scaling_factor=2.5, scoring_func="sigmoid",
                        norm_topk_prob=True, rope_scaling=None),
    "gpt_oss": dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=128,
                    layer_types=["sliding_attention", "full_attention"], swiglu_limit=7.0, rope_scaling=None,
                    rms_norm_eps=1e-5, rope_theta=150000.0),
    "minimax": dict(num_local_experts=4, num_experts_per_tok=2, scoring_func="sigmoid", use_qk_norm=True,
                    rotary_dim=32, use_routing_bias=True, shared_intermediate_size=0),
}
# HF names of the per-expert projections (mlx-lm's sanitize maps them onto switch_mlp).
HF_PROJ = {"mixtral": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"},
           "minimax": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}}

# (name, family, bits, group, options): options as moekit quantize takes them.
CASES = [
    dict(name="qwen3_moe_q4_g64", family="qwen3_moe", bits=4, group=64),
    dict(name="qwen3_moe_mixed_3_6", family="qwen3_moe", bits=3, group=64, recipe="mixed_3_6"),
    dict(name="mixtral_q3_g32", family="mixtral", bits=3, group=32),
    dict(name="qwen2_moe_q8_g128_router4", family="qwen2_moe", bits=8, group=128, router_bits=4),
    dict(name="olmoe_q2_g64_f16", family="olmoe", bits=2, group=64, dtype="float16"),
    dict(name="deepseek_v2_q5_g64", family="deepseek_v2", bits=5, group=64),
    dict(name="glm4_moe_q6_g32", family="glm4_moe", bits=6, group=32),
    dict(name="deepseek_v3_q4_g32", family="deepseek_v3", bits=4, group=32),
    dict(name="gpt_oss_q4_g32", family="gpt_oss", bits=4, group=32),
    dict(name="minimax_q4_g128_router_float", family="minimax", bits=4, group=128, router_bits=0),
    # mlx's fp modes (mlx_lm.convert --q-mode): codes and uint8 scales; Qwen3's router stays
    # 8-bit affine through its entry without "mode".
    dict(name="qwen3_moe_mxfp4", family="qwen3_moe", bits=4, group=32, mode="mxfp4"),
    dict(name="deepseek_v3_nvfp4", family="deepseek_v3", bits=4, group=16, mode="nvfp4"),
    dict(name="qwen3_moe_mxfp8_f16", family="qwen3_moe", bits=8, group=32, mode="mxfp8", dtype="float16"),
]


def read_raw(path):
    """-> {name: (st_dtype, shape, raw bytes)}"""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (h["dtype"], h["shape"], data[h["data_offsets"][0]:h["data_offsets"][1]])
            for k, h in header.items() if k != "__metadata__"}


def model_config(family):
    return dict(BASE, model_type=family, **FAMILIES[family])


def hf_tensors(family, cfg):
    """The Hugging Face layout of mlx-lm's model: [(name, shape, st_dtype, amp_log2, offset)]."""
    Model, Args = mlx_utils._get_classes(cfg)
    model = Model(Args.from_dict(cfg))
    out = []
    for k, v in mlx.utils.tree_flatten(model.parameters()):
        shape = list(v.shape)
        if k.endswith("self_attn.unembed_out.weight"):
            continue  # the second half of kv_b_proj (below)
        if k.endswith("self_attn.embed_q.weight"):
            # Hugging Face stores DeepSeek-V3's kv_b_proj [H * (nope + v), kv_lora_rank]; mlx-lm's
            # sanitize splits it into embed_q / unembed_out.
            H = cfg["num_attention_heads"]
            n = k.replace("embed_q", "kv_b_proj")
            kv = [H * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]]
            out.append((n, kv, "BF16") + draw_spec(n, kv))
            continue
        if family == "gpt_oss" and ".mlp.experts." in k:
            # Hugging Face's GPT-OSS: gate_up_proj [E, D, 2F] (gate = even columns), its bias
            # [E, 2F], down_proj [E, F, D] transposed, down_proj_bias [E, D].
            ex = k[: k.index(".mlp.experts.") + len(".mlp.experts.")]
            E, F, D = cfg["num_local_experts"], cfg["intermediate_size"], cfg["hidden_size"]
            hf = {ex + "gate_proj.weight": (ex + "gate_up_proj", [E, D, 2 * F]),
                  ex + "gate_proj.bias": (ex + "gate_up_proj_bias", [E, 2 * F]),
                  ex + "down_proj.weight": (ex + "down_proj", [E, F, D]),
                  ex + "down_proj.bias": (ex + "down_proj_bias", [E, D])}
            if k in hf:
                n, shp = hf[k]
                out.append((n, shp, "BF16") + draw_spec(n, shp))
            continue
        if ".switch_mlp." in k:
            block, rest = k.split(".switch_mlp.")
            proj = rest.split(".")[0]
            hp = HF_PROJ.get(family, {}).get(proj, proj)
            for e in range(shape[0]):
                n = f"{block}.experts.{e}.{hp}.weight"
                out.append((n, shape[1:], "BF16") + draw_spec(n, shape[1:]))
        else:
            dt = "F32" if k.endswith("e_score_correction_bias") else "BF16"
            out.append((k, shape, dt) + draw_spec(k, shape))
    return out


def f32_array(spec):
    name, shape, dt, amp, off = spec
    a = values(name, int(np.prod(shape)), amp, off).reshape(shape)
    return a if dt == "F32" else L.bf16_round(a)


def gpt_oss_mlx_tensors(cfg, specs):
    """mlx-lm's GPT-OSS layout of the Hugging Face tensors (mlx-lm's own loader cannot read the
    Hugging Face bf16 layout: its sanitize handles the MXFP4 release only)."""
    out = []
    for s in specs:
        a = f32_array(s)
        n = s[0]
        if n.endswith("experts.gate_up_proj"):
            b = n[: -len("gate_up_proj")]
            out.append((b + "gate_proj.weight", np.ascontiguousarray(a[..., ::2].transpose(0, 2, 1)), "BF16"))
            out.append((b + "up_proj.weight", np.ascontiguousarray(a[..., 1::2].transpose(0, 2, 1)), "BF16"))
        elif n.endswith("experts.gate_up_proj_bias"):
            b = n[: -len("gate_up_proj_bias")]
            out.append((b + "gate_proj.bias", np.ascontiguousarray(a[..., ::2]), "BF16"))
            out.append((b + "up_proj.bias", np.ascontiguousarray(a[..., 1::2]), "BF16"))
        elif n.endswith("experts.down_proj"):
            out.append((n + ".weight", np.ascontiguousarray(a.transpose(0, 2, 1)), "BF16"))
        elif n.endswith("experts.down_proj_bias"):
            out.append((n[: -len("down_proj_bias")] + "down_proj.bias", a, "BF16"))
        else:
            out.append((n, a, s[2]))
    return out


def write_hf(folder, cfg, specs):
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    L.write_safetensors(os.path.join(folder, "model.safetensors"),
                        [(s[0], f32_array(s), s[2]) for s in specs])


def router_bits_predicate(cfg, router_bits, group):
    """moekit's --router-bits as an mlx-lm quant_predicate: routers at that many bits (0: float),
    every other module at the defaults."""
    suffix = "block_sparse_moe.gate" if cfg["model_type"] in ("mixtral", "minimax") else "mlp.gate"

    def predicate(path, _):
        if path.endswith(suffix):
            return False if router_bits == 0 else {"group_size": group, "bits": router_bits}
        return True

    return predicate


def mlx_input(c, cfg, specs, hf, tmp):
    """The float folder mlx-lm quantizes: the Hugging Face one, or for GPT-OSS the same values in
    mlx-lm's layout (gpt_oss_mlx_tensors)."""
    if c["family"] != "gpt_oss":
        return hf
    src = os.path.join(tmp, c["name"] + "_mlx_float")
    os.makedirs(src)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    L.write_safetensors(os.path.join(src, "model.safetensors"), gpt_oss_mlx_tensors(cfg, specs))
    return src


def convert(hf, dst, c, cfg):
    """mlx_lm.convert.convert's quantizing path without the tokenizer (the tiny models have none)."""
    model, config = mlx_utils.load_model(Path(hf), lazy=False, strict=True)
    dtype = c.get("dtype") or config.get("torch_dtype")
    dt = getattr(mx, dtype)
    cast_predicate = getattr(model, "cast_predicate", lambda _: True)
    model.update(mlx.utils.tree_map_with_path(
        lambda k, v: v.astype(dt) if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating) else v,
        model.parameters()))
    pred = None
    if c.get("recipe"):
        pred = mlx_convert.mixed_quant_predicate_builder(c["recipe"], model, c["group"])
    elif "router_bits" in c:
        pred = router_bits_predicate(cfg, c["router_bits"], c["group"])
    model, config = mlx_utils.quantize_model(model, config, c["group"], c["bits"], mode=c.get("mode", "affine"),
                                             quant_predicate=pred)
    mlx_utils.save_model(Path(dst), model, donate_model=False)
    mlx_utils.save_config(config, config_path=Path(dst) / "config.json")
    return model, config


def moe_module(model, layer):
    lay = model.model.layers[layer]
    return getattr(lay, "block_sparse_moe", None) or lay.mlp


def build_case(c, tmp):
    cfg = model_config(c["family"])
    specs = hf_tensors(c["family"], cfg)
    hf = os.path.join(tmp, c["name"] + "_hf")
    dst = os.path.join(tmp, c["name"] + "_mlx")
    write_hf(hf, cfg, specs)
    model, config = convert(mlx_input(c, cfg, specs, hf, tmp), dst, c, cfg)
    written = read_raw(os.path.join(dst, "model.safetensors"))
    with open(os.path.join(dst, "model.safetensors.index.json")) as f:
        index = json.load(f)
    with open(os.path.join(dst, "config.json")) as f:
        saved = json.load(f)
    tensors = []
    for name in sorted(written):
        dt, shape, raw = written[name]
        tensors.append(dict(name=name, dtype=dt, shape=shape, fnv1a64="%016x" % fnv1a64(raw)))
    layer = 1
    T = 5
    x = values("input", T * cfg["hidden_size"], 0, 0.0).reshape(T, cfg["hidden_size"])
    y = moe_module(model, layer)(mx.array(x)[None])[0]
    y = np.array(y.astype(mx.float32))
    d = os.path.join(OUT, c["name"])
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    np.save(os.path.join(d, "input.npy"), x)
    np.save(os.path.join(d, "output.npy"), y)
    options = {k: c[k] for k in ("recipe", "router_bits", "dtype", "mode") if k in c}
    return dict(name=c["name"], family=c["family"], bits=c["bits"], group_size=c["group"], options=options,
                layer=layer, config=cfg,
                inputs=[dict(name=s[0], shape=s[1], dtype=s[2], amp_log2=s[3], offset=s[4]) for s in specs],
                outputs=tensors, quantization=saved["quantization"],
                index_metadata=index["metadata"],
                source=(f"mlx_lm.utils.load_model + quantize_model + save_model (mlx {mx.__version__}, "
                        f"mlx-lm {mlx_lm.__version__}); output.npy: model.layers[{layer}] MoE block"))


def write_vectors():
    rows = [values("vectors.random", 128, 0, 0.0),
            np.zeros(128, np.float32),
            np.full(128, 0.3, np.float32),
            np.full(128, -0.7, np.float32),
            values("vectors.tiny", 128, -20, 0.0),
            np.where(np.arange(128) == 37, np.float32(5.0), np.float32(0.01)).astype(np.float32),
            values("vectors.negative", 128, -1, -0.6),
            values("vectors.wide", 128, 6, 3.0)]
    w = np.stack(rows).astype(np.float32)
    tensors = [("w.f32", w, "F32"), ("w.bf16", w, "BF16")]
    for dname, mdt in (("f32", mx.float32), ("bf16", mx.bfloat16)):
        wm = mx.array(w).astype(mdt)
        for bits in (2, 3, 4, 5, 6, 8):
            for group in (32, 64, 128):
                q, s, b = mx.quantize(wm, group_size=group, bits=bits)
                st = "F32" if dname == "f32" else "BF16"
                key = f"{dname}.b{bits}.g{group}"
                tensors.append((key + ".codes", np.array(q), "U32"))
                tensors.append((key + ".scales", np.array(s.astype(mx.float32)), st))
                tensors.append((key + ".biases", np.array(b.astype(mx.float32)), st))
    # mlx's fp modes (mx.quantize(..., mode=M): codes and uint8 scales, no biases), from f32, bf16
    # and f16 weights: the CPU quantizer composes ops evaluated in the weights' dtype.
    # Beside the edge rows: 56 rows of random magnitudes from 2^-30 to 2^30 (f16 overflows and
    # underflows at the ends, as mlx's arithmetic does).
    extra = [values(f"vectors.fp{i}", 128, int(i) - 28, 0.0) for i in range(0, 56)]
    wfp = np.concatenate([w, np.stack(extra).astype(np.float32)])
    tensors += [("wfp.f32", wfp, "F32"), ("wfp.bf16", wfp, "BF16"), ("wfp.f16", wfp.astype(np.float16), "F16")]
    for dname, mdt in (("f32", mx.float32), ("bf16", mx.bfloat16), ("f16", mx.float16)):
        wm = mx.array(wfp).astype(mdt)
        for mode, group, bits in (("mxfp4", 32, 4), ("nvfp4", 16, 4), ("mxfp8", 32, 8)):
            q, s = mx.quantize(wm, group_size=group, bits=bits, mode=mode)
            key = f"{dname}.{mode}"
            tensors.append((key + ".codes", np.array(q), "U32"))
            tensors.append((key + ".scales", np.array(s), "U8"))
    L.write_safetensors(os.path.join(OUT, "quantize_vectors.safetensors"), tensors)


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    write_vectors()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [build_case(c, tmp) for c in CASES]
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(dict(recipe=__doc__.strip().splitlines()[0], mlx=mx.__version__, mlx_lm=mlx_lm.__version__,
                       cases=cases), f, indent=1)
    for c in cases:
        q = [k for k in c["quantization"] if isinstance(c["quantization"][k], dict)]
        print(c["name"], len(c["outputs"]), "tensors;", len(q), "per-module entries")


if __name__ == "__main__":
    main()
