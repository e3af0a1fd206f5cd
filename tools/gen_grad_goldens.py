#!/usr/bin/python3
"""Golden gradients of whole MoE blocks, from torch autograd, for the layer goldens.

Regenerate (from the repository root, after tools/gen_layer_goldens.py, whose case folders and
torch reference this script reuses):

    /usr/bin/python3 tools/gen_grad_goldens.py

Interpreter: Debian /usr/bin/python3 (3.11) with torch 1.13 and numpy 1.24 (mlx is not needed).

For every case folder tests/goldens/layers/<case>/ it writes, into its subfolder grad/ (beside
the checkpoint, not in it: a checkpoint folder's *.safetensors are all read as its shards),

    grad_output.npy    float32 [T, D]  dy, drawn as numpy.random.default_rng(seed + 7919) N(0, 1)
    grads.safetensors  F32             the gradient of L = sum(y * dy) with respect to x ("dx")
                                       and to every tensor of the MoE block, under the tensor's
                                       own name and in its stored shape and layout (per-expert
                                       tensors, fused gate_up_proj, GPT-OSS's interleaved
                                       transposed tensors and biases, mlx switch_mlp stacks)

Recipe: the block's tensors are read back from the case's safetensors files (bf16 cases: the
bf16 values widened to float32) as leaf tensors with requires_grad, x likewise; the float32
torch reimplementation of the Hugging Face module in gen_layer_goldens.reference_torch runs on
them with the case's router knobs (mlx-lm's quirks for mlx-sourced cases, as the forward golden);
L.backward() gives the gradients. Selection is by torch.topk on the forward values: indices are
constants, only gate values carry gradient (straight-through), as every reference does. The
selection bias (e_score_correction_bias) only ever enters the selection, so it gets no gradient
and is left out of grads.safetensors. The script asserts that the routing equals the case's
ids.npy and that y equals output.npy to 1e-6 relative (torch-sourced cases) before it writes anything.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_layer_goldens as G  # noqa: E402

DY_SEED_OFFSET = 7919


def leaf_aware_tensor(a):
    """gen_layer_goldens.t_, passing through tensors that are already torch leaves."""
    if isinstance(a, torch.Tensor):
        return a
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def case_grads(c, entry):
    d = os.path.join(G.OUT, entry["dir"])
    st = G.read_checkpoint(d)
    blk = entry["block_prefix"]
    x = np.load(os.path.join(d, "input.npy"))
    ids_ref = np.load(os.path.join(d, "ids.npy"))
    dy = np.random.default_rng(c["seed"] + DY_SEED_OFFSET).standard_normal(x.shape, dtype=np.float32)
    leaves = {}
    st_t = {}
    for name, (arr, dt) in st.items():
        if name.startswith(blk + ".") and dt != "I32":
            leaves[name] = torch.tensor(arr, dtype=torch.float32, requires_grad=True)
            st_t[name] = (leaves[name], dt)
        else:
            st_t[name] = (arr, dt)
    xt = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    knobs = dict(G.HF_KNOBS)
    if c.get("source") == "mlx":
        knobs.update(c.get("overrides", {}))
    G.t_ = leaf_aware_tensor
    y, ids, _, _, _, _ = G.reference_torch(c, st_t, xt, knobs)
    assert np.array_equal(ids.numpy().astype(np.int32), ids_ref), c["name"]
    if c.get("source") != "mlx":
        y_ref = np.load(os.path.join(d, "output.npy"))
        err = np.abs(y.detach().numpy() - y_ref).max() / np.abs(y_ref).max()
        assert err <= 1e-6, (c["name"], err)  # the same module; autograd may pick other kernels
    (y * torch.from_numpy(dy)).sum().backward()
    out = [("dx", xt.grad.numpy(), "F32")]
    for name, leaf in sorted(leaves.items()):
        if name.endswith("e_score_correction_bias"):
            assert leaf.grad is None or not leaf.grad.any(), name
            continue
        g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        out.append((name, g.numpy().astype(np.float32), "F32"))
    return dy, out


def main():
    with open(os.path.join(G.OUT, "manifest.json")) as f:
        manifest = json.load(f)
    entries = {e["name"]: e for e in manifest["cases"]}
    for c in G.CASES:
        dy, grads = case_grads(c, entries[c["name"]])
        d = os.path.join(G.OUT, c["name"], "grad")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "grad_output.npy"), dy)
        G.write_safetensors(os.path.join(d, "grads.safetensors"), grads,
                            {"source": "torch %s autograd of tools/gen_layer_goldens.reference_torch" % torch.__version__,
                             "command": "/usr/bin/python3 tools/gen_grad_goldens.py"})
        print("ok", c["name"], len(grads) - 1, "tensors")


if __name__ == "__main__":
    main()
