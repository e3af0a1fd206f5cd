#!/usr/bin/env python3
"""Generate moekit's routing goldens (tests/goldens/routing/).

One command regenerates everything, from the repository root:

    /usr/bin/python3 tools/gen_routing_goldens.py

(Debian's Python 3.11 with torch, numpy, mlx (CPU backend) and mlx-lm installed. If that
interpreter cannot import mlx/mlx-lm, the mlx part is run in a subprocess under the interpreter
named by $MOEKIT_MLX_PYTHON (default: `python3` on PATH); see `--mlx-worker`. Setting
MOEKIT_MLX_SUBPROCESS=1 forces that path; its .npy output is byte-identical.)

Where the goldens come from (each case's "source" field in manifest.json says which):
  * "mlx-lm <version>: <function>": the real mlx-lm routing code, run on mlx's CPU backend.
    The router GEMM is not mlx's: the router linear (or MoEGate.weight) is set to the identity,
    so the gate of mlx-lm's own block receives exactly the fp32 logits stored in the golden
    (x @ I adds only exact zeros). The expert module (switch_mlp / experts) is replaced by a
    stub that records the ids mlx-lm hands it and returns one-hot rows, so mlx-lm's own
    `(y * scores[..., None]).sum(-2)` yields the weights in slot order, bit for bit. For Llama-4
    (whose weight multiplies the expert input) the input gets one extra column of ones and the
    stub reads the weight back from that column. Everything else is mlx-lm's code unchanged.
  * "torch reimplementation of <reference>": torch 1.13 code following the reference
    (HF transformers modeling code / DeepSeek's modeling_deepseek.py), as docs/routing.md, "Families"
    describes; used where the reference semantics differ from mlx-lm (−∞ group masking,
    renormalisation with K = 1, DeepSeek-V2's own norm_topk_prob rule).
Every mlx-lm case is also recomputed with the torch reimplementation configured to mlx-lm's
quirks, and the generator asserts the two agree (same id sets, weights within 1e-6 relative).

Inputs: float32, drawn with torch.Generator (CPU, torch.randn / torch.rand) seeded per case with
BASE_SEED + crc32(case name) % 10**6. Rows whose K-th and (K+1)-th selection scores (or, for
grouped routing, Kg-th and (Kg+1)-th group scores) differ by <= 1e-4 are redrawn from the same
generator until every row passes, so fp32 reduction-order differences can never flip a
selection. Router-GEMM cases draw x [T, D] and W_r [E, D] (and a router bias for GPT-OSS) and
compute logits = x @ W_r^T (+ b) in float32 with torch.

Outputs: manifest.json and .npy files (float32 '<f4', ids int32 '<i4'). "ids"/"weights" are the
reference's own slot order; "ids_moekit_order"/"weights_moekit_order" hold the same sets sorted
by descending selection score, ties to the lower id (moekit's documented order).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT_DIR = os.path.join(ROOT, "tests", "goldens", "routing")
BASE_SEED = 20240611
MARGIN = 1e-4
COMMAND = "/usr/bin/python3 tools/gen_routing_goldens.py"


# ---------------------------------------------------------------------------------------------
# mlx-lm part (runs in-process, or in a worker subprocess under another interpreter)
# ---------------------------------------------------------------------------------------------

def mlx_versions():
    import importlib.metadata as md
    import mlx.core as mx
    return {"mlx": mx.__version__, "mlx-lm": md.version("mlx-lm")}


def mlx_route(kind, params, logits, bias):
    """Runs mlx-lm's own routing for `kind` on fp32 logits [..., E]. Returns (ids, weights) as
    numpy arrays in mlx-lm's slot order."""
    from types import SimpleNamespace

    import mlx.core as mx
    import mlx.nn as nn

    mx.set_default_device(mx.cpu)
    shape = logits.shape
    E = shape[-1]
    K = params["top_k"]
    # mlx-lm's blocks want [B, L, D].
    x3 = logits if len(shape) == 3 else logits.reshape(1, shape[0], E)
    x = mx.array(x3.astype(np.float32))
    eye = mx.eye(E, dtype=mx.float32)
    assert np.array_equal(np.array(x @ eye.T), x3), "identity gate is not exact"

    class Capture(nn.Module):
        """Stands in for mlx-lm's SwitchGLU: records ids, returns one-hot slot rows."""

        def __init__(self):
            super().__init__()
            self.seen = {}

        def __call__(self, xin, inds):
            self.seen["inds"] = inds
            self.seen["x"] = xin
            D = xin.shape[-1]
            onehot = mx.eye(inds.shape[-1], D, dtype=mx.float32)
            return mx.broadcast_to(onehot, tuple(inds.shape) + (D,))

    def zero_params(module):
        from mlx.utils import tree_map
        module.update(tree_map(lambda a: mx.zeros_like(a), module.parameters()))

    cap = Capture()
    if kind in ("deepseek_v3", "glm4_moe", "deepseek_v2"):
        if kind == "deepseek_v2":
            from mlx_lm.models import deepseek_v2 as mod
        elif kind == "deepseek_v3":
            from mlx_lm.models import deepseek_v3 as mod
        else:
            from mlx_lm.models import glm4_moe as mod
        cfg = SimpleNamespace(num_experts_per_tok=K, n_routed_experts=E, hidden_size=E,
                              routed_scaling_factor=params["rsf"], n_group=params.get("n_group", 1),
                              topk_group=params.get("topk_group", 1),
                              topk_method=params.get("topk_method", "noaux_tc"),
                              norm_topk_prob=params.get("norm_topk_prob", True))
        gate = mod.MoEGate(cfg)
        gate.weight = eye
        if kind != "deepseek_v2":
            gate.e_score_correction_bias = mx.array(bias.astype(np.float32))
        inds, w = gate(x)
        mx.eval(inds, w)
        return np.array(inds).reshape(shape[:-1] + (K,)), np.array(w).reshape(shape[:-1] + (K,))

    D = E
    if kind == "mixtral":
        from mlx_lm.models import mixtral as mod
        blk = mod.MixtralSparseMoeBlock(SimpleNamespace(hidden_size=E, intermediate_size=4, num_local_experts=E,
                                                        num_experts_per_tok=K))
        blk.gate.weight = eye
        blk.switch_mlp = cap
    elif kind == "qwen2_moe":
        from mlx_lm.models import qwen2_moe as mod
        blk = mod.Qwen2MoeSparseMoeBlock(SimpleNamespace(hidden_size=E, moe_intermediate_size=4, num_experts=E,
                                                         num_experts_per_tok=K, shared_expert_intermediate_size=4))
        blk.gate.weight = eye
        zero_params(blk.shared_expert)  # shared expert output is exactly 0
        zero_params(blk.shared_expert_gate)
        blk.switch_mlp = cap
    elif kind == "qwen3_moe":
        from mlx_lm.models import qwen3_moe as mod
        blk = mod.Qwen3MoeSparseMoeBlock(SimpleNamespace(hidden_size=E, moe_intermediate_size=4, num_experts=E,
                                                         num_experts_per_tok=K,
                                                         norm_topk_prob=params["norm_topk_prob"]))
        blk.gate.weight = eye
        blk.switch_mlp = cap
    elif kind == "olmoe":
        from mlx_lm.models import olmoe as mod
        blk = mod.OlmoeSparseMoeBlock(SimpleNamespace(hidden_size=E, intermediate_size=4, num_experts=E,
                                                      num_experts_per_tok=K, norm_topk_prob=params["norm_topk_prob"],
                                                      mlp_bias=False))
        blk.gate.weight = eye
        blk.switch_mlp = cap
    elif kind == "minimax":
        from mlx_lm.models import minimax as mod
        blk = mod.MiniMaxSparseMoeBlock(SimpleNamespace(hidden_size=E, intermediate_size=4, num_local_experts=E,
                                                        num_experts_per_tok=K))
        blk.gate.weight = eye
        blk.e_score_correction_bias = mx.array(bias.astype(np.float32))
        blk.switch_mlp = cap
    elif kind == "gpt_oss":
        from mlx_lm.models import gpt_oss as mod
        blk = mod.MLPBlock(SimpleNamespace(hidden_size=E, intermediate_size=4, num_local_experts=E,
                                           num_experts_per_tok=K, swiglu_limit=7.0))
        blk.router.weight = eye
        # logits passed in already include the router bias; mlx-lm's router adds a zero bias.
        blk.router.bias = mx.zeros((E,), dtype=mx.float32)
        blk.experts = cap
    elif kind == "llama4":
        from mlx_lm.models import llama4 as mod
        D = E + 1
        blk = mod.MoE(SimpleNamespace(hidden_size=D, intermediate_size=4, num_local_experts=E,
                                      num_experts_per_tok=K))
        blk.router.weight = mx.concatenate([eye, mx.zeros((E, 1), dtype=mx.float32)], axis=1)
        zero_params(blk.shared_expert)

        class CaptureInput(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def __call__(self, xin, inds):
                self.seen["inds"] = inds
                self.seen["x"] = xin
                return mx.zeros(tuple(inds.shape) + (xin.shape[-1],), dtype=mx.float32)

        cap = CaptureInput()
        blk.experts = cap
        x = mx.concatenate([x, mx.ones(x.shape[:-1] + (1,), dtype=mx.float32)], axis=-1)
    else:
        raise ValueError(kind)

    y = blk(x)
    mx.eval(y, cap.seen["inds"])
    inds = np.array(cap.seen["inds"]).reshape(shape[:-1] + (K,))
    if kind == "llama4":
        w = np.array(cap.seen["x"])[..., E].reshape(shape[:-1] + (K,))  # x * score, ones column
    else:
        w = np.array(y)[..., :K].reshape(shape[:-1] + (K,))
    return inds.astype(np.int32), w.astype(np.float32)


def mlx_worker():
    """Subprocess entry: reads an .npz of jobs on stdin path, writes results."""
    import pickle
    req = pickle.load(sys.stdin.buffer)
    if req == "versions":
        pickle.dump(mlx_versions(), sys.stdout.buffer)
        return
    out = []
    for kind, params, logits, bias in req:
        ids, w = mlx_route(kind, params, _unpack(logits), _unpack(bias))
        out.append((_pack(ids), _pack(w)))
    pickle.dump(out, sys.stdout.buffer)


# Arrays cross the process boundary as (dtype, shape, bytes): numpy 1.x cannot unpickle numpy 2.x
# arrays, and the two interpreters may have different numpy versions.
def _pack(a):
    a = np.ascontiguousarray(a)
    return (a.dtype.str, tuple(a.shape), a.tobytes())


def _unpack(t):
    return np.frombuffer(t[2], dtype=np.dtype(t[0])).reshape(t[1]).copy()


class MlxRunner:
    def __init__(self):
        try:
            if os.environ.get("MOEKIT_MLX_SUBPROCESS"):  # force the subprocess path (testing)
                raise ImportError
            import mlx.core  # noqa: F401
            import mlx_lm  # noqa: F401
            self.inproc = True
            self.python = sys.executable
        except ImportError:
            self.inproc = False
            self.python = os.environ.get("MOEKIT_MLX_PYTHON", "python3")

    def _call(self, req):
        import pickle
        p = subprocess.run([self.python, os.path.abspath(__file__), "--mlx-worker"], input=pickle.dumps(req),
                           capture_output=True, check=True)
        return pickle.loads(p.stdout)

    def versions(self):
        return mlx_versions() if self.inproc else self._call("versions")

    def route(self, kind, params, logits, bias):
        if self.inproc:
            return mlx_route(kind, params, logits, bias)
        ids, w = self._call([(kind, params, _pack(logits), _pack(bias))])[0]
        return _unpack(ids), _unpack(w)


# ---------------------------------------------------------------------------------------------
# torch reimplementations of the references (transformers modeling code / DeepSeek's code)
# ---------------------------------------------------------------------------------------------

def t_deepseek_v3(logits, bias, K, G, Kg, rsf, norm, fill=float("-inf"), eps=1e-20, renorm_k1=True):
    """HF transformers DeepseekV3/Glm4Moe router (noaux_tc). fill: value of masked groups
    (reference: -inf; mlx-lm and old HF: 0.0). eps / renorm_k1: mlx-lm uses 0 / False."""
    import torch
    E = logits.shape[-1]
    scores = logits.sigmoid()
    sfc = scores + bias.unsqueeze(0)
    group_scores = None
    if G > 1:
        group_scores = sfc.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=Kg, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        sfc = sfc.masked_fill(~score_mask.bool(), fill)
    idx = torch.topk(sfc, k=K, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    if norm and (K > 1 or renorm_k1):
        w = w / (w.sum(dim=-1, keepdim=True) + eps)
    w = w * rsf
    return idx, w, sfc, group_scores


def t_deepseek_v2(logits, K, method, G, Kg, rsf, norm, deepseek_own=False):
    """HF DeepseekV2TopkRouter (always scales, ignores norm_topk_prob), or with deepseek_own
    DeepSeek's modeling_deepseek.py (renorm +1e-20 iff norm_topk_prob and K > 1, else scale)."""
    import torch
    E = logits.shape[-1]
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    group_scores = None
    if method == "group_limited_greedy":
        group_scores = scores.view(-1, G, E // G).max(dim=-1).values
        group_idx = torch.topk(group_scores, k=Kg, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        scores = scores.masked_fill(~score_mask.bool(), 0.0)
    w, idx = torch.topk(scores, k=K, dim=-1, sorted=False)
    if deepseek_own and K > 1 and norm:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        w = w * rsf
    return idx, w, scores, group_scores


def t_softmax_topk(logits, K, norm):
    """HF Qwen2Moe / Qwen3Moe / Olmoe / Mixtral (norm=True) routers."""
    import torch
    rw = torch.softmax(logits, dim=1, dtype=torch.float32)
    w, idx = torch.topk(rw, K, dim=-1)
    if norm:
        w = w / w.sum(dim=-1, keepdim=True)
    return idx, w, rw, None


def t_gpt_oss(logits, K):
    """HF GptOssTopKRouter: top-K on the biased logits, softmax over the K values."""
    import torch
    vals, idx = torch.topk(logits, K, dim=-1)
    return idx, torch.softmax(vals, dim=1, dtype=vals.dtype), logits, None


def t_llama4(logits, K):
    """HF Llama4TextMoe router: top-K on raw logits, sigmoid of the selected logit."""
    import torch
    vals, idx = torch.topk(logits, K, dim=1)
    return idx, torch.sigmoid(vals.float()), logits, None


def t_minimax(logits, bias, K, eps):
    """HF MiniMaxM2TopKRouter (eps = 0) / mlx-lm MiniMax (eps = 1e-20)."""
    import torch
    s = torch.sigmoid(logits.float())
    sfc = s + bias
    idx = torch.topk(sfc, K, dim=-1, sorted=False)[1]
    w = s.gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + eps)
    return idx, w, sfc, None


# ---------------------------------------------------------------------------------------------
# the cases
# ---------------------------------------------------------------------------------------------

MLX_DSV3_OVERRIDES = {"mask_fill": "legacy_zero", "renorm": "sum", "renorm_only_if_k_gt_1": True}


def cfg_deepseek_v3(model_type, E, K, G, Kg, rsf, D=64, norm=True):
    return {"model_type": model_type, "hidden_size": D, "num_hidden_layers": 4, "n_routed_experts": E,
            "num_experts_per_tok": K, "moe_intermediate_size": 32, "n_group": G, "topk_group": Kg,
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": norm,
            "routed_scaling_factor": rsf, "n_shared_experts": 1, "first_k_dense_replace": 1,
            "hidden_act": "silu"}


def cfg_deepseek_v2(E, K, method, G, Kg, rsf, norm=False, D=64):
    return {"model_type": "deepseek_v2", "hidden_size": D, "num_hidden_layers": 4, "n_routed_experts": E,
            "num_experts_per_tok": K, "moe_intermediate_size": 32, "n_group": G, "topk_group": Kg,
            "topk_method": method, "scoring_func": "softmax", "norm_topk_prob": norm,
            "routed_scaling_factor": rsf, "n_shared_experts": 2, "first_k_dense_replace": 1,
            "hidden_act": "silu"}


CASES = [
    # name, source kind, config, shape (T or (B, S)), extra
    dict(name="deepseek_v2_greedy", mlx="deepseek_v2", T=32,
         config=cfg_deepseek_v2(32, 6, "greedy", 1, 1, 16.0)),
    dict(name="deepseek_v2_group_limited_greedy", mlx="deepseek_v2", T=32,
         config=cfg_deepseek_v2(32, 6, "group_limited_greedy", 8, 3, 16.0)),
    dict(name="deepseek_v2_norm_topk_prob_deepseek_ref", mlx=None, T=24,
         config=cfg_deepseek_v2(32, 6, "greedy", 1, 1, 16.0, norm=True)),
    dict(name="deepseek_v3_ngroup1_mlx", mlx="deepseek_v3", T=(2, 8), bias=True,
         config=cfg_deepseek_v3("deepseek_v3", 64, 8, 1, 1, 2.5), overrides=MLX_DSV3_OVERRIDES),
    dict(name="deepseek_v3_ngroup4_bias_mlx", mlx="deepseek_v3", T=32, bias=True,
         config=cfg_deepseek_v3("deepseek_v3", 32, 4, 4, 2, 2.5), overrides=MLX_DSV3_OVERRIDES),
    dict(name="deepseek_v3_ngroup4_bias_ref", mlx=None, T=32, bias=True, with_x=True, D=48,
         config=cfg_deepseek_v3("deepseek_v3", 32, 4, 4, 2, 2.5, D=48)),
    dict(name="deepseek_v3_k1_renorm_ref", mlx=None, T=16, bias=True,
         config=cfg_deepseek_v3("deepseek_v3", 16, 1, 1, 1, 2.5)),
    dict(name="deepseek_v3_k1_mlx", mlx="deepseek_v3", T=16, bias=True,
         config=cfg_deepseek_v3("deepseek_v3", 16, 1, 1, 1, 2.5), overrides=MLX_DSV3_OVERRIDES),
    dict(name="deepseek_v3_negmask_mlx_legacy", mlx="deepseek_v3", T=24, negmask=True,
         seed_key="deepseek_v3_negmask", config=cfg_deepseek_v3("deepseek_v3", 16, 12, 4, 3, 2.5), overrides=MLX_DSV3_OVERRIDES),
    dict(name="deepseek_v3_negmask_ref", mlx=None, T=24, negmask=True, seed_key="deepseek_v3_negmask",
         config=cfg_deepseek_v3("deepseek_v3", 16, 12, 4, 3, 2.5)),
    dict(name="kimi_k2_mlx", mlx="deepseek_v3", T=32, bias=True,
         config=cfg_deepseek_v3("kimi_k2", 64, 8, 1, 1, 2.827), overrides=MLX_DSV3_OVERRIDES),
    dict(name="glm4_moe_mlx", mlx="glm4_moe", T=32, bias=True,
         config=cfg_deepseek_v3("glm4_moe", 32, 8, 1, 1, 2.5), overrides=MLX_DSV3_OVERRIDES),
    dict(name="mixtral_mlx", mlx="mixtral", T=32, with_x=True, D=64,
         config={"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "intermediate_size": 32, "hidden_act": "silu"}),
    dict(name="qwen2_moe_mlx", mlx="qwen2_moe", T=32,
         config={"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_experts": 60,
                 "num_experts_per_tok": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                 "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu"}),
    dict(name="qwen3_moe_mlx", mlx="qwen3_moe", T=(2, 8),
         config={"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_experts": 64,
                 "num_experts_per_tok": 8, "moe_intermediate_size": 32, "norm_topk_prob": True,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu"}),
    dict(name="olmoe_mlx", mlx="olmoe", T=32,
         config={"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "num_experts": 64,
                 "num_experts_per_tok": 8, "intermediate_size": 32, "norm_topk_prob": False,
                 "hidden_act": "silu"}),
    dict(name="gpt_oss_mlx", mlx="gpt_oss", T=32, with_x=True, D=40, router_bias=True,
         config={"model_type": "gpt_oss", "hidden_size": 40, "num_hidden_layers": 2, "num_local_experts": 32,
                 "num_experts_per_tok": 4, "intermediate_size": 32, "swiglu_limit": 7.0, "hidden_act": "silu"}),
    dict(name="llama4_text_mlx", mlx="llama4", T=16,
         config={"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_local_experts": 16,
                 "num_experts_per_tok": 1, "intermediate_size": 32, "interleave_moe_layer_step": 1,
                 "hidden_act": "silu"}),
    dict(name="minimax_m2_mlx", mlx="minimax", T=32, bias=True,
         config={"model_type": "minimax_m2", "hidden_size": 64, "num_hidden_layers": 2, "num_local_experts": 32,
                 "num_experts_per_tok": 8, "intermediate_size": 32, "scoring_func": "sigmoid",
                 "use_routing_bias": True, "hidden_act": "silu"}),
]

MLX_FUNCS = {
    "deepseek_v2": "mlx_lm.models.deepseek_v2.MoEGate.__call__",
    "deepseek_v3": "mlx_lm.models.deepseek_v3.MoEGate.__call__ -> group_expert_select",
    "glm4_moe": "mlx_lm.models.glm4_moe.MoEGate.__call__ -> group_expert_select",
    "mixtral": "mlx_lm.models.mixtral.MixtralSparseMoeBlock.__call__",
    "qwen2_moe": "mlx_lm.models.qwen2_moe.Qwen2MoeSparseMoeBlock.__call__",
    "qwen3_moe": "mlx_lm.models.qwen3_moe.Qwen3MoeSparseMoeBlock.__call__",
    "olmoe": "mlx_lm.models.olmoe.OlmoeSparseMoeBlock.__call__",
    "gpt_oss": "mlx_lm.models.gpt_oss.MLPBlock.__call__",
    "llama4": "mlx_lm.models.llama4.MoE.__call__",
    "minimax": "mlx_lm.models.minimax.MiniMaxSparseMoeBlock.__call__",
}


def reference(case, logits, bias, mlx_quirks):
    """torch reimplementation. mlx_quirks=True reproduces mlx-lm's deviations (for cross-checks).
    Returns (ids, weights, selection scores [N, E], group scores or None, reference name)."""
    c = case["config"]
    mt = c["model_type"]
    K = c["num_experts_per_tok"]
    if mt in ("deepseek_v3", "kimi_k2", "glm4_moe"):
        ref = ("HF transformers DeepseekV3/Glm4Moe TopkRouter (noaux_tc, -inf group mask, "
               "renorm /(sum+1e-20) also for K=1, x rsf once)")
        if mlx_quirks:
            r = t_deepseek_v3(logits, bias, K, c["n_group"], c["topk_group"], c["routed_scaling_factor"],
                              c["norm_topk_prob"], fill=0.0, eps=0.0, renorm_k1=False)
        else:
            r = t_deepseek_v3(logits, bias, K, c["n_group"], c["topk_group"], c["routed_scaling_factor"],
                              c["norm_topk_prob"])
        return r + (ref,)
    if mt == "deepseek_v2":
        own = c["norm_topk_prob"] and not mlx_quirks
        ref = ("DeepSeek-V2 modeling_deepseek.py MoEGate (renorm /(sum+1e-20) iff norm_topk_prob and K>1, "
               "then no rsf)" if own else "HF transformers DeepseekV2TopkRouter (x rsf, norm_topk_prob ignored)")
        return t_deepseek_v2(logits, K, c["topk_method"], c["n_group"], c["topk_group"],
                             c["routed_scaling_factor"], c["norm_topk_prob"], deepseek_own=own) + (ref,)
    if mt == "mixtral":
        return t_softmax_topk(logits, K, True) + ("HF transformers Mixtral router",)
    if mt in ("qwen2_moe", "qwen3_moe", "olmoe"):
        return t_softmax_topk(logits, K, c["norm_topk_prob"]) + (f"HF transformers {mt} router",)
    if mt == "gpt_oss":
        return t_gpt_oss(logits, K) + ("HF transformers GptOssTopKRouter",)
    if mt == "llama4_text":
        return t_llama4(logits, K) + ("HF transformers Llama4TextMoe router",)
    if mt == "minimax_m2":
        return t_minimax(logits, bias, K, 1e-20 if mlx_quirks else 0.0) + ("HF transformers MiniMaxM2TopKRouter",)
    raise ValueError(mt)


def row_margins_ok(case, sel, group_scores):
    """Per-row bool: K-th vs (K+1)-th selection score and Kg-th vs (Kg+1)-th group score > MARGIN."""
    import torch
    K = case["config"]["num_experts_per_tok"]
    s = torch.sort(sel, dim=-1, descending=True).values
    ok = (s[:, K - 1] - s[:, K]) > MARGIN
    if group_scores is not None:
        Kg = case["config"]["topk_group"]
        g = torch.sort(group_scores, dim=-1, descending=True).values
        ok &= (g[:, Kg - 1] - g[:, Kg]) > MARGIN
    return ok


def draw_negmask(gen, T, E=16, G=4):
    """Rows for the -inf vs 0.0 case: one dropped group (biased scores in [-0.38, -0.2]); in the
    three kept groups exactly 4 experts (at most 2 per group) with biased score in [-0.35, -0.05]
    and 8 in [0.05, 0.35]. So mlx-lm's 0.0 mask ranks the 4 dropped experts (0.0) above the 4
    negative kept ones, and picks them; -inf picks the 12 kept experts."""
    import torch
    per = E // G
    bias = -0.4 - 0.2 * torch.rand(E, generator=gen)  # in [-0.6, -0.4]
    rows = []
    for _ in range(T):
        dropped = int(torch.randint(G, (1,), generator=gen))
        target = torch.empty(E)
        kept = [e for e in range(E) if e // per != dropped]
        while True:
            perm = torch.randperm(len(kept), generator=gen)[:4].tolist()
            neg = [kept[i] for i in perm]
            if max(sum(1 for e in neg if e // per == g) for g in range(G)) <= 2:
                break
        u = torch.rand(E, generator=gen)
        for e in range(E):
            if e // per == dropped:
                target[e] = -0.38 + 0.18 * u[e]
            elif e in neg:
                target[e] = -0.35 + 0.30 * u[e]
            else:
                target[e] = 0.05 + 0.30 * u[e]
        p = target - bias
        rows.append(torch.log(p / (1 - p)))
    return torch.stack(rows).float(), bias.float()


def build_case(case, runner, ver):
    import torch
    seed = BASE_SEED + zlib.crc32(case.get("seed_key", case["name"]).encode()) % 10**6
    gen = torch.Generator().manual_seed(seed)
    c = case["config"]
    E = c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts")
    shape = (case["T"],) if isinstance(case["T"], int) else tuple(case["T"])
    N = int(np.prod(shape))
    D = case.get("D", 0)
    bias = torch.zeros(E)
    x = w_r = rbias = None
    if case.get("negmask"):
        logits, bias = draw_negmask(gen, N, E, c["n_group"])
    else:
        if case.get("bias"):
            bias = (torch.rand(E, generator=gen) * 0.2 - 0.1).float()  # non-zero, in [-0.1, 0.1)
        if case.get("with_x"):
            w_r = (torch.randn(E, D, generator=gen) / np.sqrt(D)).float()
            if case.get("router_bias"):
                rbias = (torch.randn(E, generator=gen) * 0.5).float()

        def draw(n):
            if case.get("with_x"):
                xr = (torch.randn(n, D, generator=gen) * 2.0).float()
                z = xr @ w_r.T
                if rbias is not None:
                    z = z + rbias  # a separate fp32 add (no fused addmm)
                return xr, z
            return None, (torch.randn(n, E, generator=gen) * 2.0).float()

        x, logits = draw(N)
    # redraw rows that could flip under fp32 reduction-order differences
    for attempt in range(1000):
        _, _, sel, gs, _ = reference(case, logits, bias, mlx_quirks=case.get("mlx") is not None)
        _, _, sel2, gs2, _ = reference(case, logits, bias, mlx_quirks=False)
        ok = row_margins_ok(case, sel, gs) & row_margins_ok(case, sel2, gs2)
        if bool(ok.all()):
            break
        assert not case.get("negmask"), "negmask rows are built with margins"
        bad = (~ok).nonzero().flatten()
        xr, z = draw(len(bad))
        logits[bad] = z
        if x is not None:
            x[bad] = xr
    else:
        raise RuntimeError(f"{case['name']}: could not draw rows with margin > {MARGIN}")

    use_mlx = case.get("mlx") is not None
    t_ids, t_w, sel, gs, refname = reference(case, logits, bias, mlx_quirks=use_mlx)
    if use_mlx:
        params = {"top_k": c["num_experts_per_tok"], "rsf": c.get("routed_scaling_factor", 1.0),
                  "n_group": c.get("n_group", 1), "topk_group": c.get("topk_group", 1),
                  "topk_method": c.get("topk_method", "noaux_tc"), "norm_topk_prob": c.get("norm_topk_prob", True)}
        ids, w = runner.route(case["mlx"], params, logits.numpy().reshape(shape + (E,)), bias.numpy())
        ids = ids.reshape(N, -1).astype(np.int32)
        w = w.reshape(N, -1).astype(np.float32)
        # cross-check against the torch reimplementation with mlx-lm's quirks
        for t in range(N):
            assert sorted(ids[t]) == sorted(t_ids[t].tolist()), (case["name"], t, ids[t], t_ids[t])
            tw = dict(zip(t_ids[t].tolist(), t_w[t].tolist()))
            for k in range(ids.shape[1]):
                ref = tw[int(ids[t, k])]
                assert abs(w[t, k] - ref) <= 1e-6 * abs(ref) + 1e-12, (case["name"], t, w[t, k], ref)
        source = f"mlx-lm {ver['mlx-lm']}: {MLX_FUNCS[case['mlx']]}"
    else:
        ids = t_ids.numpy().astype(np.int32)
        w = t_w.numpy().astype(np.float32)
        source = f"torch reimplementation of {refname}"

    # moekit order: descending selection score, ties to the lower id
    seln = sel.numpy()
    ids_m = np.empty_like(ids)
    w_m = np.empty_like(w)
    for t in range(N):
        order = sorted(range(ids.shape[1]), key=lambda k: (-float(seln[t, ids[t, k]]), int(ids[t, k])))
        ids_m[t] = ids[t, order]
        w_m[t] = w[t, order]
    K = ids.shape[1]
    return {
        "name": case["name"], "source": source, "seed": seed, "shape": list(shape) + [E],
        "arrays": {
            "logits": logits.numpy().reshape(shape + (E,)),
            "selection_bias": bias.numpy() if c["model_type"] in ("deepseek_v3", "kimi_k2", "glm4_moe",
                                                                  "minimax_m2") else None,
            "x": None if x is None else x.numpy().reshape(shape + (D,)),
            "w_router": None if w_r is None else w_r.numpy(),
            "router_bias": None if rbias is None else rbias.numpy(),
            "ids": ids.reshape(shape + (K,)), "weights": w.reshape(shape + (K,)),
            "ids_moekit_order": ids_m.reshape(shape + (K,)), "weights_moekit_order": w_m.reshape(shape + (K,)),
        },
        "set_ids": ids,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlx-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mlx_worker:
        mlx_worker()
        return
    import torch
    torch.set_num_threads(1)
    runner = MlxRunner()
    ver = runner.versions()
    os.makedirs(OUT_DIR, exist_ok=True)
    for f in os.listdir(OUT_DIR):
        if f.endswith(".npy") or f == "manifest.json":
            os.remove(os.path.join(OUT_DIR, f))
    built = {}
    manifest_cases = []
    for case in CASES:
        b = build_case(case, runner, ver)
        built[case["name"]] = b
        entry = {"name": b["name"], "source": b["source"], "seed": b["seed"], "config": case["config"],
                 "overrides": case.get("overrides", {})}
        for key, arr in b["arrays"].items():
            if arr is None:
                entry[key] = None
                continue
            fname = f"{b['name']}.{key}.npy"
            dt = "<i4" if key.startswith("ids") else "<f4"
            np.save(os.path.join(OUT_DIR, fname), np.ascontiguousarray(arr.astype(dt)))
            entry[key] = fname
        manifest_cases.append(entry)

    # the -inf vs 0.0 pair must pick different experts on every token
    a = built["deepseek_v3_negmask_mlx_legacy"]["set_ids"]
    r = built["deepseek_v3_negmask_ref"]["set_ids"]
    for key in ("logits", "selection_bias"):
        assert np.array_equal(built["deepseek_v3_negmask_mlx_legacy"]["arrays"][key],
                              built["deepseek_v3_negmask_ref"]["arrays"][key])
    for t in range(a.shape[0]):
        assert set(a[t].tolist()) != set(r[t].tolist()), f"negmask token {t}: legacy and -inf agree"

    recipe = {
        "command": COMMAND,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "mlx": ver["mlx"],
        "mlx-lm": ver["mlx-lm"],
        "mlx_device": "cpu",
        "mlx_interpreter": runner.python,
        "base_seed": BASE_SEED,
        "seeds": "per case: base_seed + crc32(case name, or the shared key of the negmask pair) % 10**6 (the case's 'seed' field), torch.Generator on CPU",
        "inputs": ("float32. logits = 2.0 * torch.randn([T, E]) (or [B, S, E]); selection bias (where used) = "
                   "0.2 * torch.rand(E) - 0.1; router-GEMM cases: W_r = torch.randn(E, D) / sqrt(D), "
                   "x = 2.0 * torch.randn(T, D), router bias = 0.5 * torch.randn(E), logits = x @ W_r^T (+ b) in "
                   "float32 by torch; negmask cases: bias = -0.4 - 0.2 * torch.rand(E) and logits built from "
                   "target biased scores (see draw_negmask). Rows whose K-th/(K+1)-th selection scores or "
                   "Kg-th/(Kg+1)-th group scores differ by <= 1e-4 are redrawn from the same generator."),
        "mlx_harness": ("mlx-lm's own gate/MoE block with the router weight set to the identity (logits pass "
                        "through exactly) and the expert module replaced by a stub returning one-hot slot "
                        "rows, so the block's output is the routing weights in slot order"),
        "margin": MARGIN,
        "weights_tolerance": "1e-6 relative (fp32)",
    }
    manifest = {"recipe": recipe, "cases": manifest_cases}
    with open(os.path.join(OUT_DIR, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT_DIR, f)) for f in os.listdir(OUT_DIR))
    print(f"wrote {len(manifest_cases)} cases, {total} bytes, to {os.path.relpath(OUT_DIR, ROOT)}")
    assert total < 300_000, total


if __name__ == "__main__":
    main()
