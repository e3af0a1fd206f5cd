#!/usr/bin/python3
"""Live check of `moekit quantize` against mlx-lm, both directions (registered by
tests/CMakeLists.txt only when /usr/bin/python3 imports mlx_lm: scripts/setup.sh --goldens).

For every model of tools/gen_quantize_goldens.py and, on its Qwen3-MoE model, every bits x group
size the format has:
  1. moekit quantize writes a folder; mlx-lm's own loader (mlx_lm.utils.load_model, strict) loads
     it, and mlx-lm's MoE module on it equals `moekit forward` on it (<= 1e-5 relative);
  2. mlx-lm's own quantizing path writes a folder from the same float checkpoint; moekit
     forward on it equals mlx-lm's module on it;
  3. the two folders hold the same tensors, byte for byte.

usage: quantize_roundtrip.py MOEKIT_BINARY
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gen_quantize_goldens as G  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm import utils as mlx_utils  # noqa: E402


def moekit(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"moekit {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def check(binary, c, tmp):
    cfg = G.model_config(c["family"])
    specs = G.hf_tensors(c["family"], cfg)
    hf = os.path.join(tmp, c["name"] + "_hf")
    G.write_hf(hf, cfg, specs)
    ours = os.path.join(tmp, c["name"] + "_moekit")
    args = ["quantize", "--model", hf, "--out", ours, "--bits", str(c["bits"]), "--group-size", str(c["group"])]
    if "recipe" in c:
        args += ["--recipe", c["recipe"]]
    if "router_bits" in c:
        args += ["--router-bits", str(c["router_bits"])]
    if "dtype" in c:
        args += ["--dtype", c["dtype"]]
    if "mode" in c:
        args += ["--q-mode", c["mode"]]
    moekit(binary, *args)
    theirs = os.path.join(tmp, c["name"] + "_mlx")
    G.convert(G.mlx_input(c, cfg, specs, hf, tmp), theirs, c, cfg)

    x = G.values("input", 5 * cfg["hidden_size"], 0, 0.0).reshape(5, cfg["hidden_size"])
    xf = os.path.join(tmp, c["name"] + "_x.npy")
    np.save(xf, x)
    worst = 0.0
    for folder in (ours, theirs):
        model, _ = mlx_utils.load_model(Path(folder), strict=True)
        y_mlx = np.array(G.moe_module(model, 1)(mx.array(x)[None])[0].astype(mx.float32))
        yf = os.path.join(tmp, c["name"] + "_y.npy")
        moekit(binary, "forward", "--model", folder, "--layer", "1", "--input", xf, "--output", yf)
        e = rel_err(np.load(yf), y_mlx)
        worst = max(worst, e)
        if not e <= 1e-5:
            raise SystemExit(f"{c['name']}: moekit forward vs mlx-lm on {folder}: rel err {e:.3g}")
    a = G.read_raw(os.path.join(ours, "model.safetensors"))
    b = G.read_raw(os.path.join(theirs, "model.safetensors"))
    if a.keys() != b.keys():
        raise SystemExit(f"{c['name']}: tensor names differ: {sorted(set(a) ^ set(b))[:8]}")
    for k in a:
        if a[k] != b[k]:
            raise SystemExit(f"{c['name']}: tensor {k} differs from mlx-lm's ({a[k][0]} {a[k][1]} vs {b[k][0]} {b[k][1]})")
    print(f"{c['name']}: {len(a)} tensors identical to mlx-lm's; forward rel err <= {worst:.2g} both ways")


def main():
    binary = sys.argv[1]
    cases = list(G.CASES)
    for bits in (2, 3, 4, 5, 6, 8):
        for group in (32, 64, 128):
            cases.append(dict(name=f"sweep_qwen3_moe_b{bits}_g{group}", family="qwen3_moe", bits=bits, group=group))
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases:
            check(binary, c, tmp)
    print(f"{len(cases)} models: moekit quantize == mlx-lm, loads in mlx-lm, forwards agree")


if __name__ == "__main__":
    main()
