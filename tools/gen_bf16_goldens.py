#!/usr/bin/python3
"""The torch-bf16 golden of a bf16 MoE block: what torch computes when the model runs in bf16.

Regenerate (from the repository root, after tools/gen_layer_goldens.py, whose case folder and
routing this script reuses):

    /usr/bin/python3 tools/gen_bf16_goldens.py

Interpreter: Debian /usr/bin/python3 (3.11) with torch 1.13 and numpy 1.24.

For the bf16 layer golden tests/goldens/layers/deepseek_v3_bf16/ it writes, into torch_bf16/,

    input.npy   float32 [T, D]  the case's input.npy rounded to bf16 (round to nearest even)
    output.npy  float32 [T, D]  y of the block run by torch in bf16 (bf16 values, widened)
    ids.npy     int32   [T, K]  the routing torch used (fp32 router, as Hugging Face runs it)

The dtype flow is Hugging Face's DeepseekV3MoE run as a bf16 model: the router in fp32
(`F.linear(x.float(), W.float())`), sigmoid scores, the fp32 e_score_correction_bias, fp32
routing weights; every expert MLP in bf16 (`F.linear` on bf16 tensors: torch's CPU bf16 matmul
accumulates in fp32 and rounds its output to bf16; SiLU and the product in bf16); each expert's
bf16 output times its fp32 weight summed into an fp32 buffer, which is rounded to bf16; the
shared expert in bf16; the two added in bf16. So y carries a bf16 rounding after every
operation, where moekit's bf16 compute mode rounds only the rows entering each projection
(docs/numerics.md). The C++ test (tests/layer/bf16_golden_test.cpp) reports both modes' distance
from this golden.
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_layer_goldens as G  # noqa: E402

CASE = "deepseek_v3_bf16"


def bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).bfloat16()


def mlp(x, p, st):
    g = lambda n: bf16(st[f"{p}.{n}.weight"][0])
    return F.linear(F.silu(F.linear(x, g("gate_proj"))) * F.linear(x, g("up_proj")), g("down_proj"))


def main():
    c = next(c for c in G.CASES if c["name"] == CASE)
    d = os.path.join(G.OUT, CASE)
    st = G.read_checkpoint(d)
    blk = f"model.layers.{c['layer']}.mlp"
    x = bf16(np.load(os.path.join(d, "input.npy")))
    logits = F.linear(x.float(), torch.from_numpy(st[f"{blk}.gate.weight"][0]).float())
    bias = torch.from_numpy(st[f"{blk}.gate.e_score_correction_bias"][0]).float()
    ids, w, _, _ = G.route_torch(c, logits, bias, dict(G.HF_KNOBS))
    y = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for k in range(c["K"]):
            e = int(ids[t, k])
            out = mlp(x[t:t + 1], f"{blk}.experts.{e}", st)
            y[t] += (out.float() * w[t, k])[0]
    y = y.bfloat16() + mlp(x, f"{blk}.shared_experts", st)
    out = os.path.join(d, "torch_bf16")
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "input.npy"), x.float().numpy())
    np.save(os.path.join(out, "output.npy"), y.float().numpy())
    np.save(os.path.join(out, "ids.npy"), ids.numpy().astype(np.int32))
    print("ok", CASE, "torch", torch.__version__, "max|y|", float(y.float().abs().max()))


if __name__ == "__main__":
    main()
