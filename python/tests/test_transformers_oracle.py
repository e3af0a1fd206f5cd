"""Live oracle: transformers' own MoE modules (torch) on the same weights as moekit's block.
transformers needs torch >= 2; Debian's python3-torch is 1.13, so under .venv this skips and says
so. It runs where both import, e.g.
    PYTHONPATH=build/python build-peers/venv/bin/python -m pytest python/tests/test_transformers_oracle.py
(bench/peers/setup.sh puts torch 2 and transformers 5 into build-peers/venv)."""

import pytest

import moekit
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is not installed")
if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip(f"transformers needs torch >= 2; this interpreter has torch {torch.__version__}",
                allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def test_transformers_modules_agree():
    torch = pytest.importorskip("torch")
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"transformers needs torch >= 2; this interpreter has torch {torch.__version__}")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe import configuration_qwen3_moe as qc
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

    cfg = qc.Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                            norm_topk_prob=True, num_hidden_layers=1)
    torch.manual_seed(0)
    block = qm.Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():  # a bare module's tensors are uninitialised in transformers 5
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    params = {k: v.detach() for k, v in block.state_dict().items()}
    mcfg = moekit.preset_config("qwen3_moe", hidden_size=32, num_experts=8, top_k=2, expert_width=16)
    core = moekit.TrainableMoe(mcfg)
    mine = core.parameters("torch")
    with torch.no_grad():
        mine["router"].copy_(params["gate.weight"])
        if "experts.gate_up_proj" in params:  # transformers >= 5: fused [E, 2F, D]
            gu = params["experts.gate_up_proj"]
            mine["experts.gate"].copy_(gu[:, :16])
            mine["experts.up"].copy_(gu[:, 16:])
            mine["experts.down"].copy_(params["experts.down_proj"])
        else:
            for e in range(8):
                mine["experts.gate"][e].copy_(params[f"experts.{e}.gate_proj.weight"])
                mine["experts.up"][e].copy_(params[f"experts.{e}.up_proj.weight"])
                mine["experts.down"][e].copy_(params[f"experts.{e}.down_proj.weight"])
    x = torch.randn(1, 24, 32)
    with torch.no_grad():
        out = block(x)
    ref = out[0] if isinstance(out, tuple) else out
    got = core.forward(x.reshape(24, 32).contiguous())
    assert rel_err(got.numpy(), ref.reshape(24, 32).numpy()) <= 1e-5, transformers.__version__
