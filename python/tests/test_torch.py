"""moekit.torch.MoE: a torch module training through moekit's backward. Gradients against a live
torch autograd oracle (tools/gen_layer_goldens.reference_torch, the torch reimplementation of the
Hugging Face modules that the frozen goldens come from) on the same weights, for every family."""

import io
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --goldens)")

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402
from conftest import GOLDENS, ROOT, cases, rel_err  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
G = pytest.importorskip("gen_grad_goldens", reason="tools/gen_grad_goldens.py needs torch and numpy")
import gen_layer_goldens as L  # noqa: E402

GEN_CASES = {c["name"]: c for c in L.CASES}
TRAINABLE = [c for c in cases() if c["name"] in GEN_CASES]


def build(entry):
    if entry.get("overrides"):
        cfg = moekit.load_hf_config(str(GOLDENS / entry["dir"]))
        for k, v in entry["overrides"].items():
            cfg.router.set_knob(k, str(v).lower() if isinstance(v, bool) else str(v))
        layer = moekit.load_moe_layer(str(GOLDENS / entry["dir"]), entry["layer"], cfg)
    else:
        layer = moekit.load_moe_layer(str(GOLDENS / entry["dir"]), entry["layer"])
    return layer, mt.MoE(core=moekit.TrainableMoe.from_layer(layer))


@pytest.mark.parametrize("entry", TRAINABLE, ids=[c["name"] for c in TRAINABLE])
def test_gradients_match_torch_autograd(entry):
    layer, moe = build(entry)
    dy, oracle = G.case_grads(GEN_CASES[entry["name"]], entry)  # live: torch autograd now
    oracle = {name: g for name, g, _ in oracle}
    x = torch.tensor(np.load(GOLDENS / entry["dir"] / "input.npy"), requires_grad=True)
    y = moe(x)
    (y * torch.from_numpy(dy)).sum().backward()
    assert rel_err(x.grad.numpy(), oracle["dx"]) <= 1e-4
    grads = {name: getattr(moe, name.replace(".", "_")).grad.numpy() for name in moe._names}
    stored = moekit.stored_tensors(layer, grads)
    compared = 0
    for name, g in stored.items():
        if name in oracle:
            assert g.shape == oracle[name].shape, name
            assert rel_err(g, oracle[name]) <= 1e-4, name
            compared += 1
    assert compared == len(oracle) - 1  # every oracle gradient but dx


def small_config(family="qwen3_moe", **kw):
    return moekit.preset_config(family, hidden_size=32, num_experts=8, top_k=2, expert_width=16, **kw)


def test_parameters_share_memory_with_moekit():
    moe = mt.MoE(small_config(), seed=3)
    x = torch.randn(6, 32)
    before = moe(x)
    with torch.no_grad():
        moe.experts_down.mul_(2.0)  # an optimizer's in-place update
    after = moe(x)
    torch.testing.assert_close(after, before * 2.0, rtol=1e-5, atol=1e-6)


def train_skewed(balance):
    """60 AdamW steps on a regression through a block whose router favours expert 0."""
    torch.manual_seed(0)
    moe = mt.MoE(small_config(selection_bias=True), seed=1, balance=balance, bias_rate=5e-2)
    with torch.no_grad():
        moe.router[0] += 0.05
    head = torch.nn.Linear(32, 32)
    opt = torch.optim.AdamW(list(moe.parameters()) + list(head.parameters()), lr=3e-3)
    x = torch.randn(256, 32) + 1.0
    target = torch.randn(256, 32)
    losses, vios = [], []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(head(moe(x)), target)
        loss.backward()
        opt.step()
        with torch.no_grad():
            _, ids, _, _ = moe._core.forward(x, return_routing=True)
        vios.append(moekit.max_violation(moekit.expert_counts(ids, 8)))
        moe.update_bias()
        losses.append(float(loss))
    return moe, losses, vios


def test_training_reduces_the_loss_and_balances():
    moe, losses, vios = train_skewed("loss_free_sign")
    _, _, vios_none = train_skewed(None)
    assert losses[-1] < 0.8 * losses[0]
    assert moe.selection_bias.abs().max() > 0
    assert vios_none[0] > 1.0  # the skew is real
    assert np.mean(vios[-10:]) < 0.5 * np.mean(vios_none[-10:])


def test_state_dict_roundtrip_keeps_sharing():
    a = mt.MoE(small_config(selection_bias=True), seed=4, balance="loss_free_sign")
    with torch.no_grad():
        a.selection_bias.add_(0.25)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    b = mt.MoE(small_config(selection_bias=True), seed=5, balance="loss_free_sign")
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    x = torch.randn(10, 32)
    torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)
    assert "selection_bias" in b.state_dict()


def test_eval_mode_does_not_count():
    moe = mt.MoE(small_config(selection_bias=True), balance="loss_free_sign")
    moe.eval()
    moe(torch.randn(8, 32, requires_grad=True)).sum().backward()
    assert sum(moe._balancer.counts) == 0
    moe.train()
    moe(torch.randn(8, 32, requires_grad=True)).sum().backward()
    assert sum(moe._balancer.counts) == 8 * 2


def test_aux_loss_gradient_matches_autograd_of_the_formula():
    cfg = small_config()
    moe = mt.MoE(cfg, seed=6, aux_coef=0.1)
    x = torch.randn(20, 32, requires_grad=True)
    y = moe(x)
    y.sum().backward()
    with_aux = moe.router.grad.clone()
    assert moe.aux_loss > 0
    plain = mt.MoE(cfg, seed=6)
    x2 = x.detach().clone().requires_grad_(True)
    plain(x2).sum().backward()
    # The Switch loss alpha * E/(K T^2) * sum_i (sum_t p_i(t)) c_i through the router linear.
    w = plain.router.detach().clone().requires_grad_(True)
    logits = x.detach() @ w.T
    p = torch.softmax(logits, -1)
    ids = torch.topk(logits, 2, -1).indices
    c = torch.zeros(8).scatter_add_(0, ids.reshape(-1), torch.ones(ids.numel()))
    aux = 0.1 * 8 / (2 * 20 * 20) * (p.sum(0) * c).sum()
    aux.backward()
    torch.testing.assert_close(with_aux - plain.router.grad, w.grad, rtol=1e-4, atol=1e-5)
    assert moe.aux_loss == pytest.approx(float(aux), rel=1e-5)


def test_moved_parameters_are_caught():
    moe = mt.MoE(small_config())
    moe.double()
    with pytest.raises(RuntimeError, match="no longer shares memory"):
        moe(torch.randn(2, 32, dtype=torch.float64))


def test_bad_options():
    with pytest.raises(ValueError, match="balance"):
        mt.MoE(small_config(), balance="sometimes")
    with pytest.raises(ValueError, match="selection bias"):
        mt.MoE(small_config(), balance="loss_free_sign")


def test_inside_a_model_with_bf16_input():
    moe = mt.MoE(small_config(), seed=7)
    x = torch.randn(4, 5, 32, dtype=torch.bfloat16, requires_grad=True)
    y = moe(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and moe.router.grad is not None
