#!/usr/bin/env python3
"""Goldens for the weight formats of released checkpoints, decoded by the references' own code.

    /usr/bin/python3 tools/gen_format_goldens.py      # rewrites tests/goldens/formats/

mxfp4_gpt_oss/ — one GPT-OSS MoE block as OpenAI ships it (quantization_config.quant_method
"mxfp4"): `experts.{gate_up,down}_proj_blocks` U8 [E, out, in / 32, 16] and `_scales` U8
[E, out, in / 32], gate and up rows interleaved; router and biases BF16. The weights are decoded by
transformers' own `_convert_moe_packed_tensors` (integrations/mxfp4.py, run in float32 with this
interpreter's torch; from the installed transformers, or from the transformers wheel on PyPI when
it is not importable — the function's source is taken from the wheel and run as it is, with
`on_device` a no-op as it is on a CPU), and the block's output is transformers' GptOssMLP math on
those weights (tools/gen_layer_goldens.py's reference, fp32). Written: model.safetensors,
config.json, input.npy, output.npy, ids.npy, weights.npy, and decoded.safetensors (the reference's
decode of every blocks tensor, [E, out, in] F32, for a bit-for-bit test of moekit's decode).

fp8_deepseek_v3/ — one DeepSeek-V3 MoE block as DeepSeek ships it (quantization_config.quant_method
"fp8", weight_block_size [128, 128]): every routed and shared expert projection `W.weight`
F8_E4M3 [out, in] with `W.weight_scale_inv` F32 [ceil(out / 128), ceil(in / 128)]; D = 160 and
F = 96 leave ragged edge blocks in both dimensions. The FP8 bytes are decoded to float32 by
ml_dtypes' float8_e4m3fn (JAX's FP8 types, PyPI) and the block scales applied by transformers' own
`_dequantize_fp8_weight` (integrations/finegrained_fp8.py, float32, run as it is). The block's
output is tools/gen_layer_goldens.py's DeepSeek-V3 reference on those weights.

fp8_channel_qwen3/ — one Qwen3-MoE block as compressed-tensors writes FP8 per channel
(quant_method "compressed-tensors", format "float-quantized", strategy "channel"): `W.weight`
F8_E4M3 [out, in] with `W.weight_scale` BF16 [out, 1]; the router is in `ignore`. Decoded by the
compressed-tensors package's own `_dequantize` (quantization/lifecycle/forward_helpers.py, run as it
is: the weight times its scale in the scale's dtype, bf16).

int4_kimi_k2/ — one DeepSeek-V3 block in Kimi-K2-Thinking's layout (compressed-tensors
"pack-quantized", symmetric int4, group 32, BF16 scales; shared experts BF16 by an `re:` ignore
entry). int4_asym_qwen3/ — one Qwen3-MoE block in the asymmetric scheme (group 32, F16 scales,
`weight_zero_point` I32 packed along the rows; F = 100 for ragged groups and part-filled
zero-point words). Both decoded by compressed-tensors' own `unpack_from_int32` and `_dequantize`.

Each FP8 and int4 folder also holds reference/decoded.safetensors (a folder of its own, so that the
checkpoint's tensors are not shadowed): the reference's decode of every quantized projection
as F32 under its stored name, for a bit-for-bit test of moekit's decode.

Deterministic for the same numpy / torch / transformers / ml_dtypes / compressed-tensors versions
(manifest.json records them).
"""
import ast
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_layer_goldens as lg  # noqa: E402  (safetensors writer, GPT-OSS reference, routing margins)

OUT = os.path.join(lg.ROOT, "tests", "goldens", "formats")
TRANSFORMERS_PIN = "5.25.0"  # the wheel fetched when transformers is not importable
COMPRESSED_TENSORS_PIN = "0.20.1"


class _WideIndexLut(torch.Tensor):
    """A tensor whose indexing widens int32 index tensors to int64: torch < 2 indexes only with
    int64 (or bool/byte), the reference indexes its lookup table with int32. The same elements."""

    def __getitem__(self, idx):
        if isinstance(idx, torch.Tensor) and idx.dtype == torch.int32:
            idx = idx.long()
        return torch.Tensor.__getitem__(self.as_subclass(torch.Tensor), idx)


def _torch_for_reference():
    """torch as the reference sees it; on torch < 2 its lookup table is a _WideIndexLut."""
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch
    import types
    shim = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    shim.tensor = lambda *a, **k: torch.tensor(*a, **k).as_subclass(_WideIndexLut)
    return shim


def mxfp4_reference():
    """transformers' _convert_moe_packed_tensors and FP4_VALUES, and where they came from."""
    try:
        from transformers.integrations import mxfp4 as m  # noqa: F401
        import transformers
        return m._convert_moe_packed_tensors, f"transformers {transformers.__version__} (installed)"
    except Exception:
        pass
    tmp = tempfile.mkdtemp()
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp,
                        f"transformers=={TRANSFORMERS_PIN}"], check=True)
        wheel = glob.glob(os.path.join(tmp, "transformers-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            src = z.read("transformers/integrations/mxfp4.py").decode()
    finally:
        shutil.rmtree(tmp)
    tree = ast.parse(src)
    keep = [n for n in tree.body
            if (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "FP4_VALUES" for t in n.targets))
            or (isinstance(n, ast.FunctionDef) and n.name == "_convert_moe_packed_tensors")]
    assert len(keep) == 2, "transformers' mxfp4.py no longer has FP4_VALUES and _convert_moe_packed_tensors"
    ns = {"torch": _torch_for_reference(), "on_device": lambda device: contextlib.nullcontext()}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "transformers/integrations/mxfp4.py", "exec"), ns)
    return ns["_convert_moe_packed_tensors"], f"transformers {TRANSFORMERS_PIN} (wheel from PyPI, mxfp4.py)"


def fresh_dir(name):
    """tests/goldens/formats/<name>, emptied."""
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def draw_mxfp4(rng, E, out, inp):
    """Blocks: every byte value (so every nibble, -0 included); scales: e8m0 around 2^-5, plus the
    extremes 0 (2^-127, an f32 subnormal) and 2^3 on a few groups."""
    blocks = rng.integers(0, 256, size=(E, out, inp // 32, 16), dtype=np.uint8)
    scales = rng.integers(119, 125, size=(E, out, inp // 32), dtype=np.uint8)
    flat = scales.reshape(-1)
    flat[rng.choice(flat.size, 3, replace=False)] = 0
    flat[rng.choice(flat.size, 3, replace=False)] = 130
    return blocks, scales


def build_mxfp4(convert, source):
    name = "mxfp4_gpt_oss"
    d = fresh_dir(name)
    c = dict(name=name, family="gpt_oss", seed=2028, D=64, F=32, E=8, K=4, T=16, layer=1, n_layers=2,
             layout="gpt_oss_interleaved_transposed", dtype="bf16", sharded=False)
    rng = np.random.default_rng(c["seed"])
    D, F, E, L = c["D"], c["F"], c["E"], c["layer"]
    cfg = lg.make_config(c)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    blk = f"model.layers.{L}.mlp"
    gu_blocks, gu_scales = draw_mxfp4(rng, E, 2 * F, D)
    dn_blocks, dn_scales = draw_mxfp4(rng, E, D, F)
    bf = lg.bf16_round
    router = bf(rng.standard_normal((E, D)).astype(np.float32) / np.sqrt(D))
    router_bias = bf(0.5 * rng.standard_normal(E).astype(np.float32))
    gu_bias = bf(0.5 * rng.standard_normal((E, 2 * F)).astype(np.float32))
    dn_bias = bf(0.5 * rng.standard_normal((E, D)).astype(np.float32))
    tensors = [
        (f"{blk}.router.weight", router, "BF16"), (f"{blk}.router.bias", router_bias, "BF16"),
        (f"{blk}.experts.gate_up_proj_blocks", gu_blocks, "U8"), (f"{blk}.experts.gate_up_proj_scales", gu_scales, "U8"),
        (f"{blk}.experts.gate_up_proj_bias", gu_bias, "BF16"),
        (f"{blk}.experts.down_proj_blocks", dn_blocks, "U8"), (f"{blk}.experts.down_proj_scales", dn_scales, "U8"),
        (f"{blk}.experts.down_proj_bias", dn_bias, "BF16"),
    ]
    lg.write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # The reference decode: [E, in, out] (transformers transposes for GptOssExperts), in float32.
    gate_up = convert(torch.from_numpy(gu_blocks), torch.from_numpy(gu_scales), dtype=torch.float32)
    down = convert(torch.from_numpy(dn_blocks), torch.from_numpy(dn_scales), dtype=torch.float32)
    assert tuple(gate_up.shape) == (E, D, 2 * F) and tuple(down.shape) == (E, F, D)
    lg.write_safetensors(os.path.join(d, "decoded.safetensors"), [
        (f"{blk}.experts.gate_up_proj", gate_up.transpose(1, 2).contiguous().numpy(), "F32"),
        (f"{blk}.experts.down_proj", down.transpose(1, 2).contiguous().numpy(), "F32")])

    st = {f"{blk}.router.weight": (router, "BF16"), f"{blk}.router.bias": (router_bias, "BF16"),
          f"{blk}.experts.gate_up_proj": (gate_up.numpy(), "F32"),
          f"{blk}.experts.gate_up_proj_bias": (gu_bias, "BF16"),
          f"{blk}.experts.down_proj": (down.numpy(), "F32"), f"{blk}.experts.down_proj_bias": (dn_bias, "BF16")}
    x = rng.standard_normal((c["T"], D), dtype=np.float32)
    for _ in range(1000):
        y, ids, wts, gap, _, _ = lg.reference_torch(c, st, x, dict(lg.HF_KNOBS))
        rows = np.nonzero((gap <= lg.MARGIN).numpy())[0]
        if len(rows) == 0:
            break
        for r in rows:
            x[r] = rng.standard_normal(D, dtype=np.float32)
    else:
        raise RuntimeError("could not satisfy the routing margins")
    np.save(os.path.join(d, "input.npy"), x)
    np.save(os.path.join(d, "output.npy"), y.numpy().astype(np.float32))
    np.save(os.path.join(d, "ids.npy"), ids.numpy().astype(np.int32))
    np.save(os.path.join(d, "weights.npy"), wts.numpy().astype(np.float32))
    return dict(name=name, layer=L, format="mxfp4", decoded_by=f"_convert_moe_packed_tensors from {source}",
                reference="transformers GptOssMLP math in float32 (tools/gen_layer_goldens.py reference_torch)",
                margin=lg.MARGIN)


def _wheel_source(package, pin, member):
    """The text of `member` inside `package`'s wheel `pin`, fetched from PyPI."""
    tmp = tempfile.mkdtemp()
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp,
                        f"{package}=={pin}"], check=True)
        wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            return z.read(member).decode()
    finally:
        shutil.rmtree(tmp)


def _function_from(src, filename, name, ns):
    """Function `name` of module source `src`, compiled alone into namespace `ns`."""
    tree = ast.parse(src)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(keep) == 1, f"{filename} no longer defines {name}"
    exec(compile(ast.Module(body=keep, type_ignores=[]), filename, "exec"), ns)
    return ns[name]


def fp8_references():
    """transformers' _dequantize_fp8_weight and compressed-tensors' _dequantize, from their wheels."""
    tf = _wheel_source("transformers", TRANSFORMERS_PIN, "transformers/integrations/finegrained_fp8.py")
    ct = _wheel_source("compressed-tensors", COMPRESSED_TENSORS_PIN,
                       "compressed_tensors/quantization/lifecycle/forward_helpers.py")
    block = _function_from(tf, "transformers/integrations/finegrained_fp8.py", "_dequantize_fp8_weight",
                           {"torch": torch})
    channel = _function_from(ct, "compressed_tensors/quantization/lifecycle/forward_helpers.py", "_dequantize",
                             {"torch": torch})
    return block, channel, (f"transformers {TRANSFORMERS_PIN} _dequantize_fp8_weight, compressed-tensors "
                            f"{COMPRESSED_TENSORS_PIN} _dequantize (wheels from PyPI); e4m3 bytes by ml_dtypes")


def e4m3_values(codes):
    """FP8 e4m3fn bytes as float32, by ml_dtypes (an independent decoder)."""
    import ml_dtypes
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def draw_e4m3(rng, shape, scale=1.0):
    """Every e4m3 byte but the two NaNs (0x7F, 0xFF), subnormals included."""
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] ^= 1
    return codes


def settle_routing(c, st, x, rng):
    """Redraws rows of x until every token's routing clears the margins (top-k and group)."""
    for _ in range(1000):
        y, ids, wts, gap, ggap, _ = lg.reference_torch(c, st, x, dict(lg.HF_KNOBS))
        bad = gap <= lg.MARGIN
        if ggap is not None:
            bad = bad | (ggap <= lg.MARGIN)
        rows = np.nonzero(bad.numpy())[0]
        if len(rows) == 0:
            return y, ids, wts
        for r in rows:
            x[r] = rng.standard_normal(x.shape[1], dtype=np.float32)
    raise RuntimeError("could not satisfy the routing margins")


def save_io(d, x, y, ids, wts):
    np.save(os.path.join(d, "input.npy"), x)
    np.save(os.path.join(d, "output.npy"), y.numpy().astype(np.float32))
    np.save(os.path.join(d, "ids.npy"), ids.numpy().astype(np.int32))
    np.save(os.path.join(d, "weights.npy"), wts.numpy().astype(np.float32))


def write_release(d, cfg, c, tensors, decoded, st, rng):
    """A release folder: model.safetensors, reference/decoded.safetensors, config.json, and the
    block's input (redrawn until its routing clears the margins), output, ids and weights."""
    lg.write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    os.makedirs(os.path.join(d, "reference"))
    lg.write_safetensors(os.path.join(d, "reference", "decoded.safetensors"), decoded)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    x = rng.standard_normal((c["T"], c["D"]), dtype=np.float32)
    save_io(d, x, *settle_routing(c, st, x, rng))


def bf16_router(rng, blk, E, D):
    """A plain BF16 router (Qwen3-MoE's `mlp.gate`): tensors, and the reference's view."""
    router = lg.bf16_round(rng.standard_normal((E, D)).astype(np.float32) / np.sqrt(D))
    return [(f"{blk}.gate.weight", router, "BF16")], {f"{blk}.gate.weight": (router, "BF16")}


def compressed_tensors_config(fmt, weights, ignore, activations=None, group_format=False):
    """A compressed-tensors quantization_config with one config group (`format` repeated in the group
    where the release writes it there)."""
    group = {"targets": ["Linear"], "weights": weights}
    if group_format:
        group["format"] = fmt
    group["input_activations"] = activations
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": ignore}


def deepseek_router(rng, blk, E, D):
    """A DeepSeek-V3 router as released: BF16 weight, F32 selection bias (tensors, and the reference's view)."""
    router = lg.bf16_round(rng.standard_normal((E, D)).astype(np.float32) / np.sqrt(D))
    bias = rng.uniform(-0.05, 0.3, E).astype(np.float32)
    tensors = [(f"{blk}.gate.weight", router, "BF16"), (f"{blk}.gate.e_score_correction_bias", bias, "F32")]
    st = {f"{blk}.gate.weight": (router, "BF16"), f"{blk}.gate.e_score_correction_bias": (bias, "F32")}
    return tensors, st


def build_fp8_deepseek(dequant, source):
    name = "fp8_deepseek_v3"
    d = fresh_dir(name)
    c = dict(name=name, family="deepseek_v3", seed=2029, D=160, F=96, E=8, K=2, T=16, layer=1, n_layers=2,
             layout="per_expert", dtype="bf16", sharded=False, n_shared=1, rsf=2.5, n_group=2, topk_group=1,
             norm=True)
    rng = np.random.default_rng(c["seed"])
    D, F, E, L = c["D"], c["F"], c["E"], c["layer"]
    cfg = lg.make_config(c)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [128, 128]}
    blk = f"model.layers.{L}.mlp"
    tensors, st = deepseek_router(rng, blk, E, D)
    decoded = []
    projections = [(f"{blk}.experts.{e}.{p}", (D, F) if p == "down_proj" else (F, D))
                   for e in range(E) for p in ("gate_proj", "up_proj", "down_proj")]
    projections += [(f"{blk}.shared_experts.{p}", (D, F) if p == "down_proj" else (F, D))
                    for p in ("gate_proj", "up_proj", "down_proj")]
    for module, (out, inp) in projections:
        codes = draw_e4m3(rng, (out, inp))
        srows, scols = -(-out // 128), -(-inp // 128)
        # Scales of real releases' magnitude (max |w| / 448 for |w| ~ 0.05), one block extreme.
        scale = (rng.uniform(0.5, 2.0, (srows, scols)) * 2.0 ** -12).astype(np.float32)
        w = dequant(torch.from_numpy(e4m3_values(codes)), torch.from_numpy(scale), [128, 128], torch.float32)
        w = w.numpy()
        tensors += [(f"{module}.weight", codes, "F8_E4M3"), (f"{module}.weight_scale_inv", scale, "F32")]
        decoded.append((f"{module}.weight", w, "F32"))
        st[f"{module}.weight"] = (w, "F32")
    write_release(d, cfg, c, tensors, decoded, st, rng)
    return dict(name=name, layer=L, format="fp8 e4m3, 128 x 128 blocks, f32 scale_inv",
                decoded_by=source, reference="tools/gen_layer_goldens.py reference_torch (DeepseekV3MoE) in float32",
                margin=lg.MARGIN)


def build_fp8_channel(dequant, source):
    name = "fp8_channel_qwen3"
    d = fresh_dir(name)
    c = dict(name=name, family="qwen3_moe", seed=2030, D=64, F=32, E=8, K=2, T=16, layer=1, n_layers=2,
             layout="per_expert", dtype="bf16", sharded=False, norm=True)
    rng = np.random.default_rng(c["seed"])
    D, F, E, L = c["D"], c["F"], c["E"], c["layer"]
    cfg = lg.make_config(c)
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "group_size": None,
               "block_structure": None, "dynamic": False, "observer": "minmax"}
    cfg["quantization_config"] = compressed_tensors_config(
        "float-quantized", weights, ["lm_head", "re:.*mlp.gate$"],
        activations={"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True},
        group_format=True)
    blk = f"model.layers.{L}.mlp"
    bf = lg.bf16_round
    tensors, st = bf16_router(rng, blk, E, D)
    decoded = []
    for e in range(E):
        for p in ("gate_proj", "up_proj", "down_proj"):
            module = f"{blk}.experts.{e}.{p}"
            out, inp = (D, F) if p == "down_proj" else (F, D)
            codes = draw_e4m3(rng, (out, inp))
            scale = bf((rng.uniform(0.5, 2.0, (out, 1)) * 2.0 ** -12).astype(np.float32))
            s_bf16 = torch.from_numpy(scale).to(torch.bfloat16)
            w = dequant(torch.from_numpy(e4m3_values(codes)), s_bf16).to(torch.float32).numpy()
            tensors += [(f"{module}.weight", codes, "F8_E4M3"), (f"{module}.weight_scale", scale, "BF16")]
            decoded.append((f"{module}.weight", w, "F32"))
            st[f"{module}.weight"] = (w, "F32")
    write_release(d, cfg, c, tensors, decoded, st, rng)
    return dict(name=name, layer=L, format="fp8 e4m3, a bf16 scale per row (compressed-tensors channel)",
                decoded_by=source, reference="tools/gen_layer_goldens.py reference_torch (Qwen3MoeSparseMoeBlock)",
                margin=lg.MARGIN)


def int4_references():
    """compressed-tensors' unpack_from_int32 and _dequantize, from its wheel."""
    import sys as _sys
    helpers = _wheel_source("compressed-tensors", COMPRESSED_TENSORS_PIN,
                            "compressed_tensors/compressors/pack_quantized/helpers.py")
    fwd = _wheel_source("compressed-tensors", COMPRESSED_TENSORS_PIN,
                        "compressed_tensors/quantization/lifecycle/forward_helpers.py")
    import typing
    ns = {"torch": torch, "sys": _sys, "Literal": typing.Literal}
    unpack = _function_from(helpers, "compressed_tensors/compressors/pack_quantized/helpers.py", "unpack_from_int32",
                            ns)
    dequant = _function_from(fwd, "compressed_tensors/quantization/lifecycle/forward_helpers.py", "_dequantize",
                             {"torch": torch})
    return unpack, dequant, (f"compressed-tensors {COMPRESSED_TENSORS_PIN} unpack_from_int32 + _dequantize "
                             "(wheel from PyPI)")


def build_int4_kimi(unpack, dequant, source):
    """Kimi-K2-Thinking's layout: routed experts int4 (group 32, BF16 scales), shared experts BF16 by
    an `re:` ignore entry."""
    name = "int4_kimi_k2"
    d = fresh_dir(name)
    c = dict(name=name, family="deepseek_v3", seed=2031, D=128, F=64, E=8, K=2, T=16, layer=1, n_layers=2,
             layout="per_expert", dtype="bf16", sharded=False, n_shared=1, rsf=2.827, n_group=1, topk_group=1,
             norm=True)
    rng = np.random.default_rng(c["seed"])
    D, F, E, L = c["D"], c["F"], c["E"], c["layer"]
    cfg = lg.make_config(c)
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
               "block_structure": None, "dynamic": False, "observer": "minmax", "actorder": None}
    cfg["quantization_config"] = compressed_tensors_config(
        "pack-quantized", weights,
        ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"])
    blk = f"model.layers.{L}.mlp"
    bf = lg.bf16_round
    tensors, st = deepseek_router(rng, blk, E, D)
    for p in ("gate_proj", "up_proj", "down_proj"):
        out, inp = (D, F) if p == "down_proj" else (F, D)
        w = bf(rng.standard_normal((out, inp)).astype(np.float32) / np.sqrt(inp))
        tensors.append((f"{blk}.shared_experts.{p}.weight", w, "BF16"))
        st[f"{blk}.shared_experts.{p}.weight"] = (w, "BF16")
    decoded = []
    for e in range(E):
        for p in ("gate_proj", "up_proj", "down_proj"):
            module = f"{blk}.experts.{e}.{p}"
            out, inp = (D, F) if p == "down_proj" else (F, D)
            nib = rng.integers(0, 16, size=(out, inp), dtype=np.uint8)  # q + 8, every value
            packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8).view("<i4").reshape(out, inp // 8)
            scale = bf((rng.uniform(0.5, 2.0, (out, inp // 32)) * 2.0 ** -6).astype(np.float32))
            s_bf16 = torch.from_numpy(scale).to(torch.bfloat16)
            q = unpack(torch.from_numpy(packed.copy()), 4, torch.Size([out, inp]))
            g = q.reshape(out, inp // 32, 32).to(torch.bfloat16)
            w = dequant(g, s_bf16.unsqueeze(-1)).reshape(out, inp).to(torch.float32).numpy()
            tensors += [(f"{module}.weight_packed", packed, "I32"), (f"{module}.weight_scale", scale, "BF16"),
                        (f"{module}.weight_shape", np.array([out, inp], dtype=np.int32), "I32")]
            decoded.append((f"{module}.weight", w, "F32"))
            st[f"{module}.weight"] = (w, "F32")
    write_release(d, cfg, c, tensors, decoded, st, rng)
    return dict(name=name, layer=L, format="int4 symmetric, group 32, bf16 scales (compressed-tensors pack-quantized)",
                decoded_by=source, reference="tools/gen_layer_goldens.py reference_torch (DeepseekV3MoE) in float32",
                margin=lg.MARGIN)


def build_int4_asym(unpack, dequant, source):
    """compressed-tensors' asymmetric int4 (pack-quantized, as its AWQ converter writes it): group 32,
    F16 scales, a zero point per group packed along the rows (`weight_zero_point` I32
    [ceil(out / 8), groups]). F = 100: ragged last groups (down's 100 inputs) and zero-point words
    holding fewer than 8 rows (gate/up's 100 outputs)."""
    name = "int4_asym_qwen3"
    d = fresh_dir(name)
    c = dict(name=name, family="qwen3_moe", seed=2032, D=128, F=100, E=8, K=2, T=16, layer=1, n_layers=2,
             layout="per_expert", dtype="bf16", sharded=False, norm=True)
    rng = np.random.default_rng(c["seed"])
    D, F, E, L = c["D"], c["F"], c["E"], c["layer"]
    G = 32
    cfg = lg.make_config(c)
    weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": G,
               "block_structure": None, "dynamic": False, "observer": "minmax", "actorder": None}
    cfg["quantization_config"] = compressed_tensors_config("pack-quantized", weights, ["lm_head", "re:.*mlp.gate$"])
    blk = f"model.layers.{L}.mlp"
    tensors, st = bf16_router(rng, blk, E, D)
    decoded = []

    def pack_nibbles(nib, axis):
        """Nibbles (value + 8) packed 8 to an int32 along `axis`, zero-padded (compressed-tensors' layout)."""
        a = np.moveaxis(nib, axis, -1)
        pad = -a.shape[-1] % 8
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (pad,), np.uint8)], axis=-1)
        words = (a[..., 0::2] | (a[..., 1::2] << 4)).astype(np.uint8).copy().view("<i4")
        return np.ascontiguousarray(np.moveaxis(words, -1, axis))

    for e in range(E):
        for p in ("gate_proj", "up_proj", "down_proj"):
            module = f"{blk}.experts.{e}.{p}"
            out, inp = (D, F) if p == "down_proj" else (F, D)
            groups = -(-inp // G)
            nib = rng.integers(0, 16, size=(out, inp), dtype=np.uint8)  # q + 8, every value
            znib = rng.integers(0, 16, size=(out, groups), dtype=np.uint8)  # zero point + 8, every value
            packed, zpacked = pack_nibbles(nib, 1), pack_nibbles(znib, 0)
            scale = (rng.uniform(0.5, 2.0, (out, groups)) * 2.0 ** -6).astype(np.float16)
            q = unpack(torch.from_numpy(packed), 4, torch.Size([out, inp]))
            zp = unpack(torch.from_numpy(zpacked), 4, torch.Size([out, groups]), packed_dim=0)
            expand = lambda t: t.repeat_interleave(G, dim=1)[:, :inp]  # noqa: E731  (a group's value per input)
            w = dequant(q, expand(torch.from_numpy(scale)), expand(zp)).to(torch.float32).numpy()
            tensors += [(f"{module}.weight_packed", packed, "I32"), (f"{module}.weight_scale", scale, "F16"),
                        (f"{module}.weight_zero_point", zpacked, "I32"),
                        (f"{module}.weight_shape", np.array([out, inp], dtype=np.int32), "I32")]
            decoded.append((f"{module}.weight", w, "F32"))
            st[f"{module}.weight"] = (w, "F32")
    write_release(d, cfg, c, tensors, decoded, st, rng)
    return dict(name=name, layer=L,
                format="int4 asymmetric, group 32, f16 scales, zero points packed along rows (pack-quantized)",
                decoded_by=source, reference="tools/gen_layer_goldens.py reference_torch (Qwen3MoeSparseMoeBlock)",
                margin=lg.MARGIN)


def main():
    os.makedirs(OUT, exist_ok=True)
    convert, source = mxfp4_reference()
    block, channel, fp8_source = fp8_references()
    cases = [build_mxfp4(convert, source), build_fp8_deepseek(block, fp8_source),
             build_fp8_channel(channel, fp8_source)]
    unpack, dequant, int4_source = int4_references()
    cases.append(build_int4_kimi(unpack, dequant, int4_source))
    cases.append(build_int4_asym(unpack, dequant, int4_source))
    import ml_dtypes
    recipe = dict(command="/usr/bin/python3 tools/gen_format_goldens.py", python=sys.version.split()[0],
                  numpy=np.__version__, torch=torch.__version__, ml_dtypes=ml_dtypes.__version__,
                  mxfp4_decode=source, fp8_decode=fp8_source, int4_decode=int4_source)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(dict(recipe=recipe, cases=cases), f, indent=2)
        f.write("\n")
    print(f"wrote {len(cases)} case(s) to {OUT}")


if __name__ == "__main__":
    main()
