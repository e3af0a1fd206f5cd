"""Live oracles: mlx-lm's own MoE modules (mlx on its CPU backend) on the golden cases' weights,
run now, against moekit's forward from Python: <= 1e-5 relative, the same expert sets.
(transformers' modules: test_transformers_oracle.py.) The weights are redrawn with the generator's own code
(tools/gen_layer_goldens.py: make_config + draw_weights from the case's seed), which wrote the
checkpoints moekit loads."""

import sys

import numpy as np
import pytest

import moekit
from conftest import GOLDENS, ROOT, cases, rel_err

pytest.importorskip("mlx.core", reason="mlx is not installed (scripts/setup.sh --goldens)")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (scripts/setup.sh --goldens)")
pytest.importorskip("torch", reason="tools/gen_layer_goldens.py imports torch")
sys.path.insert(0, str(ROOT / "tools"))
import gen_layer_goldens as G  # noqa: E402

GEN = {c["name"]: c for c in G.CASES}
ENTRIES = [e for e in cases() if e["name"] in GEN]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_mlx_lm_module_agrees(entry):
    c = GEN[entry["name"]]
    if entry["dtype"] != "f32":
        pytest.skip("bf16 checkpoint: mlx-lm's module is built from the f32 draws")
    cfg = G.make_config(c)
    w = G.draw_weights(c, np.random.default_rng(c["seed"]))
    oracle = G.mlx_block(c, cfg, w)
    if oracle is None:
        pytest.skip(f"mlx-lm has no module for {c['family']}")
    layer_cfg = moekit.load_hf_config(str(GOLDENS / entry["dir"]))
    for k, v in entry.get("overrides", {}).items():  # the mlx quirks the case reproduces
        layer_cfg.router.set_knob(k, str(v).lower() if isinstance(v, bool) else str(v))
    layer = moekit.load_moe_layer(str(GOLDENS / entry["dir"]), entry["layer"], layer_cfg)
    x = np.load(GOLDENS / entry["dir"] / "input.npy")
    y, ids, weights, _ = layer.forward(x, return_routing=True)
    y_mlx = oracle.run(x)
    assert rel_err(y, y_mlx) <= 1e-5, (oracle.name, rel_err(y, y_mlx))
    if oracle.gate is not None:
        mi, ms = oracle.gate(x)
        for t in range(x.shape[0]):
            assert set(mi[t].tolist()) == set(ids[t].tolist()), t
            np.testing.assert_allclose(np.sort(ms[t]), np.sort(weights[t]), rtol=1e-5, atol=1e-7)
