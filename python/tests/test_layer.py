"""MoeLayer from Python against the frozen goldens (every family), its config, weights views and
the inspect report."""

import json
import struct

import numpy as np
import pytest

import moekit
from conftest import GOLDENS, rel_err


def load(case):
    return moekit.load_moe_layer(case["path"], case["layer"]) if not case.get("overrides") else with_overrides(case)


def with_overrides(case):
    cfg = moekit.load_hf_config(case["path"])
    for k, v in case["overrides"].items():
        cfg.router.set_knob(k, str(v).lower() if isinstance(v, bool) else str(v))
    return moekit.load_moe_layer(case["path"], case["layer"], cfg)


def test_forward_matches_golden(case):
    layer = load(case)
    x = case["x"]
    y, ids, w, logits = layer.forward(x, return_routing=True)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(ids, case["ids"])
    assert rel_err(w, case["weights"]) <= case["tolerance"]
    assert rel_err(y, case["y"]) <= case["tolerance"], case["name"]
    assert logits.shape == (x.shape[0], layer.config.router.num_experts) and logits.dtype == np.float32
    # Without routing: the same bits.
    np.testing.assert_array_equal(layer.forward(x), y)


def test_leading_dims_are_kept(case):
    layer = load(case)
    x = case["x"][:12].reshape(3, 4, -1)
    y = layer.forward(x)
    assert y.shape == x.shape
    np.testing.assert_array_equal(y.reshape(12, -1), layer.forward(case["x"][:12]))


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def test_weights_are_read_only_views_of_the_file():
    d = GOLDENS / "mixtral"
    layer = moekit.load_moe_layer(str(d), 1)
    assert layer.mapped and layer.layout == "per_expert"
    w = layer.weights
    assert set(w) >= {"router", "experts.gate", "experts.up", "experts.down"}
    header, start = read_header(d / "model.safetensors")
    raw = np.fromfile(d / "model.safetensors", dtype=np.uint8)

    def stored(name):
        info = header[name]
        a, b = info["data_offsets"]
        return raw[start + a : start + b].view(np.float32).reshape(info["shape"])

    np.testing.assert_array_equal(w["router"], stored("model.layers.1.block_sparse_moe.gate.weight"))
    up = w["experts.up"]
    E = layer.config.router.num_experts
    ups = up if isinstance(up, list) else [up[e] for e in range(E)]
    for e in range(E):
        np.testing.assert_array_equal(ups[e], stored(f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight"))
        assert not ups[e].flags.writeable and not ups[e].flags.owndata
    with pytest.raises(ValueError):
        w["router"][0, 0] = 1.0
    # The views outlive the layer (they hold the mapping).
    del layer
    np.testing.assert_array_equal(w["router"], stored("model.layers.1.block_sparse_moe.gate.weight"))


def test_bf16_weights_show_their_bits():
    layer = moekit.load_moe_layer(str(GOLDENS / "deepseek_v3_bf16"), 1)
    up = layer.weights["experts.up"]
    first = up[0] if isinstance(up, list) else up[0]
    assert first.dtype == np.uint16


def test_pack_weights_keeps_results_close(case):
    layer = load(case)
    before = layer.forward(case["x"])
    layer.pack_weights()
    after = layer.forward(case["x"])
    assert rel_err(after, before) <= 1e-5


def test_config_fields():
    cfg = moekit.load_hf_config(str(GOLDENS / "deepseek_v3"))
    assert cfg.model_type == "deepseek_v3"
    assert cfg.router.score_func == moekit.ScoreFunc.sigmoid
    assert cfg.router.group_mode == moekit.GroupMode.top2_sum
    assert cfg.router.has_selection_bias
    assert cfg.shared_width > 0 and cfg.is_moe_layer(1) and not cfg.is_moe_layer(0)
    assert "deepseek_v3" in moekit.supported_model_types()
    text = (GOLDENS / "deepseek_v3" / "config.json").read_text()
    again = moekit.parse_hf_config(text)
    assert again.router.num_experts == cfg.router.num_experts and again.expert_width == cfg.expert_width


def test_inspect_report():
    report = moekit.inspect(str(GOLDENS / "qwen2_moe"))
    assert "family: qwen2_moe" in report and "layer 1:" in report and "routed experts:" in report


def test_preset_config():
    cfg = moekit.preset_config("qwen3_moe", hidden_size=64, num_experts=8, top_k=2, expert_width=32, selection_bias=True)
    assert cfg.hidden_size == 64 and cfg.router.num_experts == 8 and cfg.router.top_k == 2
    assert cfg.router.has_selection_bias
    with pytest.raises(ValueError, match="family"):
        moekit.preset_config("no_such_family", 64, 8, 2, 32)


def test_bf16_compute_mode_against_torch_bf16():
    d = GOLDENS / "deepseek_v3_bf16"
    layer = moekit.load_moe_layer(str(d), 1)
    x = np.load(d / "torch_bf16" / "input.npy")
    y_torch = np.load(d / "torch_bf16" / "output.npy")
    y_exact = layer.forward(x)
    assert not layer.bf16_activations
    assert layer.compute_mode == "exact"
    layer.set_bf16_activations(True)
    assert layer.bf16_activations
    assert layer.compute_mode == "bf16"
    y = layer.forward(x)
    layer.set_compute_mode("exact")
    np.testing.assert_array_equal(layer.forward(x), y_exact)
    layer.set_compute_mode("bf16")
    np.testing.assert_array_equal(layer.forward(x), y)
    with pytest.raises(ValueError, match="not one of exact, int8, bf16"):
        layer.set_compute_mode("fp4")
    assert rel_err(y, y_torch) <= 1e-2  # torch rounds after every op: bf16 noise apart
    assert 1e-5 < rel_err(y, y_exact) <= 1e-2  # the mode is on, and costs bf16 rounding only
    layer.set_bf16_activations(False)
    np.testing.assert_array_equal(layer.forward(x), y_exact)
    # Packing in the bf16 mode: AMX tiles where the mode runs on AMX (the same bits, and the mode
    # then stays on), else a clear refusal that leaves the layer as it was.
    layer.set_bf16_activations(True)
    try:
        layer.pack_weights()
    except ValueError as e:
        assert "packed layout on the amx path only" in str(e)
        np.testing.assert_array_equal(layer.forward(x), y)
    else:
        np.testing.assert_array_equal(layer.forward(x), y)
        assert layer.weights["experts.up"].ndim == 5  # [E, rows / 16, cols / 32, 16, 32]
        with pytest.raises(ValueError, match="packed in AMX tiles"):
            layer.set_bf16_activations(False)


def test_bf16_compute_mode_refuses_f32_weights():
    layer = moekit.load_moe_layer(str(GOLDENS / "deepseek_v3"), 1)
    with pytest.raises(ValueError, match="experts.gate is f32"):
        layer.set_bf16_activations(True)


def test_mxfp4_release_loads_in_place():
    """GPT-OSS as OpenAI ships it (tests/goldens/formats/, decoded by transformers' own code)."""
    d = GOLDENS.parent / "formats" / "mxfp4_gpt_oss"
    layer = moekit.load_moe_layer(str(d), 1)
    assert layer.mapped and layer.layout == "mxfp4_interleaved"
    x = np.load(d / "input.npy")
    assert rel_err(layer.forward(x), np.load(d / "output.npy")) <= 1e-5
    w = layer.weights
    # The stored bytes and e8m0 scales, as views: gate = the even rows of gate_up_proj_blocks.
    header, start = read_header(d / "model.safetensors")
    raw = np.fromfile(d / "model.safetensors", dtype=np.uint8)
    info = header["model.layers.1.mlp.experts.gate_up_proj_blocks"]
    a, b = info["data_offsets"]
    blocks = raw[start + a : start + b].reshape(8, 64, 32)  # [E, 2F, D / 2] bytes
    gate = w["experts.gate"]
    gate0 = gate[0] if isinstance(gate, list) else gate[0]
    assert gate0.dtype == np.uint8 and gate0.shape == (32, 32)
    np.testing.assert_array_equal(gate0, blocks[0, 0::2])
    scales = w["experts.gate.scales"]
    s0 = scales[0] if isinstance(scales, list) else scales[0]
    assert s0.dtype == np.uint8 and s0.shape == (32, 2)
    assert "experts.gate.biases" not in w


def test_gguf_models_load_from_python():
    """A GGUF model (llama.cpp) loads through the same load_moe_layer; its config comes from the metadata."""
    path = str(GOLDENS.parent / "gguf" / "deepseek2.gguf")
    cfg = moekit.load_config(path)
    assert cfg.model_type == "deepseek2"
    assert (cfg.hidden_size, cfg.router.num_experts, cfg.router.top_k, cfg.expert_width) == (256, 8, 2, 32)
    assert cfg.router.renorm == moekit.Renorm.sum_floor
    layer = moekit.load_moe_layer(path, 1)
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    y = layer.forward(x)
    assert y.shape == (3, 256) and np.isfinite(y).all()
    assert "q2_K" in moekit.inspect(path, 1)
    with pytest.raises(ValueError, match="dense"):
        moekit.load_moe_layer(path, 0)  # leading_dense_block_count = 1
    with pytest.raises(RuntimeError, match="blk.0.ffn_gate_inp.weight"):
        moekit.load_moe_layer(str(GOLDENS.parent / "gguf" / "qwen3moe.gguf"), 0)  # only layer 1's block is there
