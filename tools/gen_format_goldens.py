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

Deterministic for the same numpy / torch / transformers versions (manifest.json records them).
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
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
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


def main():
    os.makedirs(OUT, exist_ok=True)
    convert, source = mxfp4_reference()
    cases = [build_mxfp4(convert, source)]
    recipe = dict(command="/usr/bin/python3 tools/gen_format_goldens.py", python=sys.version.split()[0],
                  numpy=np.__version__, torch=torch.__version__, mxfp4_decode=source)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(dict(recipe=recipe, cases=cases), f, indent=2)
        f.write("\n")
    print(f"wrote {len(cases)} case(s) to {OUT}")


if __name__ == "__main__":
    main()
