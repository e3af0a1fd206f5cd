"""Live oracle: transformers' own MoE modules (torch), run now, on the same weights as moekit.

For every family transformers has, its MoE block is built from a small config with random
weights; its state_dict is written as a checkpoint (config.json = the config's own to_dict(),
tensors under the family's block prefix: transformers 5 keeps experts fused, [E, 2F, D] or
GPT-OSS/Llama-4's transposed [E, D, 2F]) that moekit loads like any other. Then:
  forward: moekit's y within 1e-5 relative of the module's, the same expert sets;
  backward: moekit.torch.MoE's gradients (mapped back to the stored names by
  moekit.stored_tensors) within 1e-4 relative of torch autograd through the module.

transformers needs torch >= 2; Debian's python3-torch is 1.13, so under .venv this file skips and
says so. It runs where both import, e.g. (bench/peers/setup.sh makes build-peers/venv with torch
2.15 and transformers 5.24):
    PYTHONPATH=build/python build-peers/venv/bin/python -m pytest python/tests/test_transformers_oracle.py
"""

import importlib
import json
import sys

import numpy as np
import pytest

import moekit
from conftest import ROOT, rel_err

torch = pytest.importorskip("torch", reason="torch is not installed")
if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip(f"transformers needs torch >= 2; this interpreter has torch {torch.__version__}",
                allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
import moekit.torch as mt  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
from gen_layer_goldens import write_safetensors  # noqa: E402

D, E, F = 32, 8, 16
# family: (transformers module, config class, block class, moekit's block prefix, config fields)
FAMILIES = {
    "mixtral": ("mixtral", "MixtralConfig", "MixtralSparseMoeBlock", "model.layers.0.block_sparse_moe",
                dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F)),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeSparseMoeBlock", "model.layers.0.mlp",
                  dict(num_experts=E, num_experts_per_tok=2, moe_intermediate_size=F,
                       shared_expert_intermediate_size=24, norm_topk_prob=False)),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeSparseMoeBlock", "model.layers.0.mlp",
                  dict(num_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, norm_topk_prob=True)),
    "olmoe": ("olmoe", "OlmoeConfig", "OlmoeSparseMoeBlock", "model.layers.0.mlp",
              dict(num_experts=E, num_experts_per_tok=2, intermediate_size=F)),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3Config", "DeepseekV3MoE", "model.layers.0.mlp",
                    dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, n_shared_experts=1,
                         n_group=2, topk_group=1, first_k_dense_replace=0)),
    "deepseek_v2": ("deepseek_v2", "DeepseekV2Config", "DeepseekV2Moe", "model.layers.0.mlp",
                    dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, n_shared_experts=1,
                         first_k_dense_replace=0)),
    "glm4_moe": ("glm4_moe", "Glm4MoeConfig", "Glm4MoeMoE", "model.layers.0.mlp",
                 dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, n_shared_experts=1,
                      first_k_dense_replace=0, n_group=1, topk_group=1)),
    "gpt_oss": ("gpt_oss", "GptOssConfig", "GptOssMLP", "model.layers.0.mlp",
                dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F)),
    "llama4_text": ("llama4", "Llama4TextConfig", "Llama4TextMoe", "model.layers.0.feed_forward",
                    dict(num_local_experts=E, num_experts_per_tok=1, intermediate_size=F, moe_layers=[0])),
    "minimax_m2": ("minimax_m2", "MiniMaxM2Config", "MiniMaxM2SparseMoeBlock", "model.layers.0.block_sparse_moe",
                   dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F)),
}


def build(family, tmp_path):
    mod, config_class, block_class, prefix, fields = FAMILIES[family]
    try:
        cfg_mod = importlib.import_module(f"transformers.models.{mod}.configuration_{mod}")
        modeling = importlib.import_module(f"transformers.models.{mod}.modeling_{mod}")
        cfg = getattr(cfg_mod, config_class)(hidden_size=D, num_hidden_layers=1, **fields)
        block = getattr(modeling, block_class)(cfg).float()
    except (ImportError, AttributeError) as e:
        pytest.skip(f"transformers {transformers.__version__} has no {block_class}: {e}")
    torch.manual_seed(hash(family) % 1000)
    with torch.no_grad():  # a bare module's tensors are uninitialised in transformers 5
        for name, p in block.named_parameters():
            p.normal_(0.0, 0.3 if "bias" not in name else 0.05)
        for name, b in block.named_buffers():
            if "correction_bias" in name:
                b.uniform_(-0.05, 0.2)
    state = {k: v.detach().float().numpy() for k, v in block.state_dict().items()}
    write_safetensors(tmp_path / "model.safetensors", [(f"{prefix}.{k}", v, "F32") for k, v in state.items()])
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict(), default=str))
    return block, prefix


def run_block(block, x):
    out = block(x[None])
    out = out[0] if isinstance(out, tuple) else out
    return out.reshape(x.shape)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_forward_and_gradients(family, tmp_path):
    block, prefix = build(family, tmp_path)
    layer = moekit.load_moe_layer(str(tmp_path), 0)
    x = torch.randn(24, D, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = run_block(block, x)
    y, ids, _, _ = layer.forward(x.contiguous(), return_routing=True)
    assert rel_err(y.numpy(), ref.numpy()) <= 1e-5, family

    # Backward: torch autograd through transformers' module vs moekit.torch.MoE on the same weights.
    xa = x.clone().requires_grad_(True)
    dy = torch.randn(24, D, generator=torch.Generator().manual_seed(8))
    (run_block(block, xa) * dy).sum().backward()
    moe = mt.MoE.from_checkpoint(str(tmp_path), 0)
    xm = x.clone().requires_grad_(True)
    (moe(xm) * dy).sum().backward()
    assert rel_err(xm.grad.numpy(), xa.grad.numpy()) <= 1e-4, family
    grads = {n: getattr(moe, n.replace(".", "_")).grad.numpy() for n in moe._names}
    compared = 0
    for name, g in moekit.stored_tensors(layer, grads).items():
        p = dict(block.named_parameters()).get(name[len(prefix) + 1:])
        if p is None or p.grad is None:
            continue
        assert g.shape == tuple(p.shape), name
        assert rel_err(g, p.grad.numpy()) <= 1e-4, (family, name, rel_err(g, p.grad.numpy()))
        compared += 1
    assert compared >= 3, family
