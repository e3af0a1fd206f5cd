"""The train and quantize entry points from Python: MoeLayer.forward_train/backward against the
frozen torch-autograd gradient goldens (tests/goldens/layers/*/grad, tools/gen_grad_goldens.py),
TrainableMoe + LoadBalancer + aux_losses, and quantize_checkpoint."""

import json
import struct

import numpy as np
import pytest

import moekit
from conftest import GOLDENS, cases, rel_err

TRAINABLE = [c for c in cases() if (GOLDENS / c["dir"] / "grad").is_dir()]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(blob[a:b], dtype=np.float32).reshape(info["shape"])
    return out


@pytest.mark.parametrize("entry", TRAINABLE, ids=[c["name"] for c in TRAINABLE])
def test_layer_backward_matches_golden_gradients(entry):
    d = GOLDENS / entry["dir"]
    cfg = moekit.load_hf_config(str(d))
    for k, v in entry.get("overrides", {}).items():
        cfg.router.set_knob(k, str(v).lower() if isinstance(v, bool) else str(v))
    layer = moekit.load_moe_layer(str(d), entry["layer"], cfg)
    x = np.load(d / "input.npy")
    dy = np.load(d / "grad" / "grad_output.npy")
    golden = read_safetensors(d / "grad" / "grads.safetensors")
    y, saved = layer.forward_train(x)
    np.testing.assert_array_equal(y, layer.forward(x))
    assert saved.ids.shape == (x.shape[0], cfg.router.top_k) and sum(saved.counts) == saved.ids.size
    dx, grads = layer.backward(saved, dy)
    assert rel_err(dx, golden["dx"]) <= 1e-4
    stored = moekit.stored_tensors(layer, grads)
    for name, g in golden.items():
        if name != "dx":
            assert rel_err(stored[name], g) <= 1e-4, name
    # A saved from another layer is refused.
    other = moekit.load_moe_layer(str(d), entry["layer"], cfg)
    with pytest.raises(ValueError, match="another layer"):
        other.backward(saved, dy)


def test_trainable_block_with_balancer_and_aux_losses():
    cfg = moekit.preset_config("qwen3_moe", 32, 8, 2, 16, selection_bias=True)
    block = moekit.TrainableMoe(cfg, seed=11)
    params = block.parameters()
    assert set(params) == {"router", "experts.gate", "experts.up", "experts.down"}
    x = np.random.default_rng(0).standard_normal((64, 32), dtype=np.float32)
    y, saved = block.forward_train(x)
    losses, dlogits = moekit.aux_losses(cfg.router, saved.logits, saved.ids, switch_coef=0.01, z_coef=0.001)
    assert losses["total"] == pytest.approx(losses["switch_loss"] + losses["z_loss"]) and dlogits.shape == (64, 8)
    dx, grads = block.backward(saved, np.ones_like(y), dlogits)
    assert dx.shape == x.shape and set(grads) == set(params)
    # An SGD step through the shared arrays changes what the block computes.
    for name, p in params.items():
        p -= 0.1 * grads[name]
    assert not np.array_equal(block.forward(x), y)
    balancer = moekit.LoadBalancer(8, moekit.BalanceRule.sign, 1e-2)
    balancer.count(saved)
    assert sum(balancer.counts) == 128
    u = balancer.update(block, 0)
    bias = block.selection_bias()
    assert u.rate == pytest.approx(1e-2) and np.abs(bias).max() == pytest.approx(1e-2)
    assert sum(balancer.counts) == 0
    with pytest.raises(ValueError, match="unknown tensor"):
        moekit.stored_tensors(moekit.load_moe_layer(str(GOLDENS / "olmoe"), 1), {"nope": x})


def test_quantize_checkpoint(tmp_path):
    out = tmp_path / "q8"
    report = moekit.quantize_checkpoint(str(GOLDENS / "olmoe"), str(out), bits=8, group_size=32)
    assert report["model_type"] == "olmoe" and report["quantized"]
    assert all(q["bits"] == 8 and q["max_abs_error"] >= 0 for q in report["quantized"])
    layer = moekit.load_moe_layer(str(out), 1)
    ref = moekit.load_moe_layer(str(GOLDENS / "olmoe"), 1)
    x = np.load(GOLDENS / "olmoe" / "input.npy")
    assert rel_err(layer.forward(x), ref.forward(x)) < 0.05
    assert "8-bit affine" in moekit.inspect(str(out), 1)
    with pytest.raises(ValueError, match="bits"):
        moekit.quantize_checkpoint(str(GOLDENS / "olmoe"), str(tmp_path / "bad"), bits=7)
    with pytest.raises(ValueError, match="quantized"):  # no trainable float form
        _, saved = layer.forward_train(x)
        layer.backward(saved, x)


def test_quantize_checkpoint_fp_modes(tmp_path):
    """mlx's fp modes: bits and group size default to the mode's; the folder loads and computes."""
    ref = moekit.load_moe_layer(str(GOLDENS / "olmoe"), 1)
    x = np.load(GOLDENS / "olmoe" / "input.npy")
    for mode, bits, group in (("mxfp4", 4, 32), ("nvfp4", 4, 16), ("mxfp8", 8, 32)):
        out = tmp_path / mode
        report = moekit.quantize_checkpoint(str(GOLDENS / "olmoe"), str(out), mode=mode)
        assert {(q["bits"], q["group_size"]) for q in report["quantized"]} == {(bits, group)}
        layer = moekit.load_moe_layer(str(out), 1)
        assert rel_err(layer.forward(x), ref.forward(x)) < (0.06 if bits == 8 else 0.3)  # e4m3: 3 mantissa bits
        assert mode in moekit.inspect(str(out), 1)
    with pytest.raises(ValueError, match="mode mxfp4 is 4 bits in groups of 32"):
        moekit.quantize_checkpoint(str(GOLDENS / "olmoe"), str(tmp_path / "bad"), mode="mxfp4", group_size=64)


def test_lm_trainer(tmp_path):
    kw = dict(layers=1, dim=32, experts=4, top_k=2, expert_width=32, steps=30, batch_tokens=512, seq_len=64,
              warmup=3, eval_every=15, eval_tokens=1024, seed=3)
    t = moekit.LmTrainer("qwen3_moe", **kw)
    assert t.data_bytes > 100_000 and t.data_files
    results = [t.step() for _ in range(30)]
    assert t.done and t.steps_done == 30
    assert results[-1]["train_loss"] < results[0]["train_loss"] - 0.5
    assert results[0]["eval"] is None and results[14]["eval"] is not None
    e = results[-1]["eval"]
    assert e["ppl"] == pytest.approx(np.exp(e["loss"])) and len(e["layers"]) == 1
    assert results[-1]["layers"][0]["bias"]  # loss-free balancing by default: a selection bias
    t.save(str(tmp_path / "ck"))
    layer = moekit.load_moe_layer(str(tmp_path / "ck"), 0)
    assert layer.config.hidden_size == 32 and "family: qwen3_moe" in moekit.inspect(str(tmp_path / "ck"))
    # The same seed gives the same run, step for step.
    again = moekit.LmTrainer("qwen3_moe", **kw)
    assert again.step()["train_loss"] == results[0]["train_loss"]
    with pytest.raises(ValueError, match="balance"):
        moekit.LmTrainer("qwen3_moe", balance="sometimes")
    with pytest.raises(ValueError, match="optimizer"):
        moekit.LmTrainer("qwen3_moe", optimizer="lion")
    with pytest.raises(ValueError):
        moekit.LmTrainer("qwen3_moe", data=[str(tmp_path / "missing.txt")])
