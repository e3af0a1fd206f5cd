#!/usr/bin/python3
"""Frozen goldens for MLX affine-quantized MoE blocks, produced by mlx-lm itself.

Regenerate (from the repository root; needs scripts/setup.sh --goldens):

    /usr/bin/python3 tools/gen_quant_goldens.py

Interpreter: Debian /usr/bin/python3 (3.11) with numpy 1.24, mlx 0.32.4 and mlx-lm 0.32.2 (CPU).

For each case: the float weights are drawn exactly as tools/gen_layer_goldens.py draws them
(its draw_weights / make_config, same recipe), loaded into mlx-lm's own MoE module class
(gen_layer_goldens.mlx_block), and the module is quantized by mlx's nn.quantize with the
predicate mlx_lm.convert applies: every nn.Linear / SwitchLinear whose input dimension the group
size divides, with the model class's own quant_predicate (Qwen3-MoE: router 8 bits, group 64;
GPT-OSS: router 8 bits, group 64) and, for "mixed" recipes, per-module overrides.  Scales and
biases are then cast to the case's scale dtype (bf16 / f16 models store them in that dtype), so
the module computes with exactly the stored values.  The module's parameters are written under
the checkpoint's names (`<block>.<module path>.{weight,scales,biases}`, as mlx_lm.save writes
them) with config.json's `quantization` and `quantization_config` entries as mlx_lm.convert
writes them (top level + one entry per module whose parameters differ).  The golden output is
the quantized module's own forward on float32 x.

Output: tests/goldens/quantized/manifest.json and one folder per case with config.json,
model.safetensors, input.npy [T, D] f32, output.npy [T, D] f32 (mlx-lm's quantized module).
"""

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_layer_goldens as L  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.utils  # noqa: E402
import mlx_lm  # noqa: E402

OUT = os.path.join(L.ROOT, "tests", "goldens", "quantized")

# (name, family, seed, D, F, E, K, T, bits, group, scale dtype, extra case fields, overrides)
# overrides: module-path suffix -> {"bits", "group_size"} (mixed recipes).
CASES = [
    dict(name="qwen3_moe_q4_g64_bf16", family="qwen3_moe", seed=2001, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=64, scales="bf16", extra=dict(norm=True)),
    dict(name="qwen3_moe_mixed_f16", family="qwen3_moe", seed=2002, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=32, scales="f16", extra=dict(norm=True),
         overrides={"switch_mlp.down_proj": dict(bits=8, group_size=64),
                    "switch_mlp.gate_proj": dict(bits=3, group_size=32)}),
    dict(name="mixtral_q4_g32_f16", family="mixtral", seed=2003, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=32, scales="f16", extra={}),
    dict(name="deepseek_v3_q3_g64_bf16", family="deepseek_v3", seed=2004, D=128, F=64, E=8, K=2, T=16,
         bits=3, group=64, scales="bf16",
         extra=dict(n_group=4, topk_group=2, rsf=2.5, n_shared=1, norm=True)),
    dict(name="deepseek_v2_q6_g32_f32", family="deepseek_v2", seed=2005, D=128, F=64, E=8, K=2, T=16,
         bits=6, group=32, scales="f32",
         extra=dict(n_group=4, topk_group=2, rsf=16.0, n_shared=2, norm=False)),
    dict(name="gpt_oss_q4_g32_bf16", family="gpt_oss", seed=2006, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=32, scales="bf16", extra={}),
    dict(name="qwen2_moe_q8_g128_bf16", family="qwen2_moe", seed=2007, D=128, F=128, E=8, K=2, T=16,
         bits=8, group=128, scales="bf16", extra=dict(shared_F=128, norm=False)),
    dict(name="olmoe_q2_g32_bf16", family="olmoe", seed=2008, D=128, F=64, E=8, K=2, T=16,
         bits=2, group=32, scales="bf16", extra=dict(norm=False)),
    dict(name="minimax_m2_q5_g64_bf16", family="minimax_m2", seed=2009, D=128, F=64, E=8, K=2, T=16,
         bits=5, group=64, scales="bf16", extra={}),
    dict(name="glm4_moe_q4_g128_f16", family="glm4_moe", seed=2010, D=128, F=128, E=8, K=2, T=16,
         bits=4, group=128, scales="f16", extra=dict(n_group=1, topk_group=1, rsf=2.5, n_shared=1, norm=True)),
    dict(name="llama4_text_q8_g64_bf16", family="llama4_text", seed=2011, D=128, F=64, E=8, K=1, T=16,
         bits=8, group=64, scales="bf16", extra={}),
    # mlx's mxfp4 mode (e2m1 codes, e8m0 scales, no biases); the router stays 8-bit affine (the
    # model's predicate returns a per-module entry without "mode").
    dict(name="qwen3_moe_mxfp4", family="qwen3_moe", seed=2012, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=32, scales="e8m0", mode="mxfp4", extra=dict(norm=True)),
    dict(name="gpt_oss_mxfp4", family="gpt_oss", seed=2013, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=32, scales="e8m0", mode="mxfp4", extra={}),
    # nvfp4: e2m1 codes, groups of 16, e4m3 scales (uint8), no biases.
    dict(name="qwen3_moe_nvfp4", family="qwen3_moe", seed=2015, D=128, F=64, E=8, K=2, T=16,
         bits=4, group=16, scales="e4m3", mode="nvfp4", extra=dict(norm=True)),
    # mxfp8: e4m3 bytes, e8m0 scales, no biases.
    dict(name="qwen3_moe_mxfp8", family="qwen3_moe", seed=2014, D=128, F=64, E=8, K=2, T=16,
         bits=8, group=32, scales="e8m0", mode="mxfp8", extra=dict(norm=True)),
]

SCALE_DTYPES = {"bf16": (mx.bfloat16, "BF16"), "f16": (mx.float16, "F16"), "f32": (mx.float32, "F32")}

# The model classes' own quant_predicate (mlx_lm.models.<family>.Model.quant_predicate).
MODEL_PREDICATES = {
    "qwen3_moe": lambda path: {"group_size": 64, "bits": 8} if path.endswith("mlp.gate") else True,
    "gpt_oss": lambda path: {"group_size": 64, "bits": 8} if path.endswith("router") else True,
}


def case_dict(c):
    base = dict(name=c["name"], family=c["family"], seed=c["seed"], D=c["D"], F=c["F"], E=c["E"],
                K=c["K"], T=c["T"], layer=1, n_layers=2, layout="switch_mlp_stacked", dtype="f32",
                sharded=False)
    base.update(c["extra"])
    return base


def block_prefix(family, layer):
    return f"model.layers.{layer}." + {"mixtral": "block_sparse_moe", "minimax_m2": "block_sparse_moe",
                                       "llama4_text": "feed_forward"}.get(family, "mlp")


def build(c):
    lc = case_dict(c)
    cfg = L.make_config(lc)
    rng = np.random.default_rng(c["seed"])
    w = L.draw_weights(lc, rng)
    mb = L.mlx_block(lc, cfg, w)
    mod = mb.module
    block = block_prefix(c["family"], lc["layer"])
    group, bits = c["group"], c["bits"]
    model_pred = MODEL_PREDICATES.get(c["family"], lambda path: True)
    overrides = c.get("overrides", {})
    entries = {}

    def predicate(path, m):
        if not hasattr(m, "to_quantized"):
            return False
        if m.weight.shape[-1] % group != 0:
            return False
        full = f"{block}.{path}"
        for suffix, o in overrides.items():
            if path.endswith(suffix):
                entries[full] = dict(group_size=o["group_size"], bits=o["bits"])
                return dict(entries[full])
        r = model_pred(full)
        if isinstance(r, dict):
            entries[full] = dict(r)
            # A per-module entry whose group does not divide the input stays unquantized.
            if m.weight.shape[-1] % r["group_size"] != 0:
                del entries[full]
                return False
            return dict(r)
        return r

    mode = c.get("mode", "affine")
    nn.quantize(mod, group_size=group, bits=bits, mode=mode, class_predicate=predicate)
    sdt, st_name = SCALE_DTYPES.get(c["scales"], (None, None))
    params = dict(mlx.utils.tree_flatten(mod.parameters()))
    # Float scales and biases to the case's dtype; mxfp4's e8m0 scales (uint8) stay as they are.
    cast = {k: v.astype(sdt) for k, v in params.items()
            if sdt is not None and (k.endswith(".scales") or k.endswith(".biases")) and v.dtype != mx.uint8}
    mod.load_weights(list(cast.items()), strict=False)
    params = dict(mlx.utils.tree_flatten(mod.parameters()))
    mx.eval(params)

    tensors = []
    n_quant = 0
    for k, v in params.items():
        name = f"{block}.{k}"
        if v.dtype == mx.uint8:  # mxfp4's / mxfp8's e8m0 and nvfp4's e4m3 scales, stored as U8
            tensors.append((name, np.array(v), "U8"))
        elif k.endswith(".scales") or k.endswith(".biases"):
            a = np.array(v.astype(mx.float32))
            st_name = {mx.float32: "F32", mx.bfloat16: "BF16", mx.float16: "F16"}[v.dtype]  # as stored
            tensors.append((name, a if st_name != "F16" else a.astype(np.float16), st_name))
        elif v.dtype == mx.uint32:
            tensors.append((name, np.array(v), "U32"))
            n_quant += 1
        else:
            tensors.append((name, np.array(v.astype(mx.float32)), "F32"))
    assert n_quant > 0, c["name"]
    # A distractor outside the block, as in the float goldens.
    tensors.append(("model.embed_tokens.weight", w["embed"], "F32"))

    quant = dict(group_size=group, bits=bits, mode=mode)
    quant.update(entries)
    cfg = dict(cfg)
    cfg["quantization"] = quant
    cfg["quantization_config"] = quant
    d = os.path.join(OUT, c["name"])
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    L.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    x = rng.standard_normal((c["T"], c["D"]), dtype=np.float32)
    y = mb.run(x)
    np.save(os.path.join(d, "input.npy"), x)
    np.save(os.path.join(d, "output.npy"), y.astype(np.float32))
    quantized = sorted(k[: -len(".scales")] for k in params if k.endswith(".scales"))
    return dict(name=c["name"], family=c["family"], layer=lc["layer"], block_prefix=block, bits=bits,
                group_size=group, scale_dtype=c["scales"], mode=mode, overrides=entries, quantized_modules=quantized,
                sizes=dict(T=c["T"], D=c["D"], F=c["F"], E=c["E"], K=c["K"]), seed=c["seed"],
                source=f"{mb.name} quantized by mlx.nn.quantize (mlx {mx.__version__}, mlx-lm {mlx_lm.__version__})")


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = [build(c) for c in CASES]
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(dict(recipe=__doc__.strip().splitlines()[0], cases=cases), f, indent=2)
    for c in cases:
        print(c["name"], "quantized:", ", ".join(c["quantized_modules"]))


if __name__ == "__main__":
    main()
