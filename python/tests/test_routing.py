"""RouterConfig, route and router_logits against numpy references."""

import numpy as np
import pytest

import moekit


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_softmax_topk_renorm_matches_numpy():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((64, 16), dtype=np.float32)
    cfg = moekit.RouterConfig(num_experts=16, top_k=4, renorm=moekit.Renorm.sum)
    ids, w = moekit.route(cfg, logits)
    p = softmax(logits.astype(np.float64))
    ref_ids = np.argsort(-p, axis=-1, kind="stable")[:, :4]
    np.testing.assert_array_equal(ids, ref_ids)
    ref_w = np.take_along_axis(p, ref_ids, -1)
    ref_w /= ref_w.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-7)


def test_sigmoid_groups_with_selection_bias():
    rng = np.random.default_rng(2)
    E, G, Kg, K = 16, 4, 2, 4
    logits = rng.standard_normal((32, E), dtype=np.float32)
    bias = rng.uniform(-0.1, 0.1, E).astype(np.float32)
    cfg = moekit.RouterConfig(num_experts=E, top_k=K, score_func=moekit.ScoreFunc.sigmoid, has_selection_bias=True,
                              group_mode=moekit.GroupMode.top2_sum, n_group=G, topk_group=Kg,
                              renorm=moekit.Renorm.sum_eps, routed_scaling_factor=2.5)
    ids, w = moekit.route(cfg, logits, bias)
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    sel = s + bias
    for t in range(32):
        groups = sel[t].reshape(G, -1)
        gscore = np.sort(groups, -1)[:, -2:].sum(-1)
        keep = np.argsort(-gscore, kind="stable")[:Kg]
        masked = np.full(E, -np.inf)
        for g in keep:
            masked[g * (E // G) : (g + 1) * (E // G)] = sel[t, g * (E // G) : (g + 1) * (E // G)]
        ref = np.argsort(-masked, kind="stable")[:K]
        np.testing.assert_array_equal(ids[t], ref)
        ww = s[t, ref] / (s[t, ref].sum() + 1e-20) * 2.5
        np.testing.assert_allclose(w[t], ww, rtol=1e-5)


def test_router_logits():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 24), dtype=np.float32)
    wr = rng.standard_normal((6, 24), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)
    np.testing.assert_allclose(moekit.router_logits(x, wr, b), x.astype(np.float64) @ wr.T + b, rtol=1e-5, atol=1e-5)


def test_router_config_fields_and_errors():
    cfg = moekit.RouterConfig(num_experts=8, top_k=2)
    assert cfg.num_experts == 8 and cfg.top_k == 2 and cfg.score_func == moekit.ScoreFunc.softmax
    cfg.top_k = 9
    with pytest.raises(ValueError, match="top_k"):
        cfg.validate()
    with pytest.raises(TypeError, match="unknown field 'topk'"):
        moekit.RouterConfig(topk=2)
    with pytest.raises(TypeError, match="top_k"):
        moekit.RouterConfig(top_k="two")
    cfg = moekit.RouterConfig(num_experts=8, top_k=2)
    cfg.set_knob("renorm", "sum")
    assert cfg.renorm == moekit.Renorm.sum
    with pytest.raises(ValueError, match="renorm"):
        cfg.set_knob("renorm", "often")
    assert "E=8" in repr(cfg)


def test_route_errors():
    cfg = moekit.RouterConfig(num_experts=4, top_k=2)
    with pytest.raises(ValueError):
        moekit.route(cfg, np.zeros((3, 5), dtype=np.float32))
    bad = np.zeros((3, 4), dtype=np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite|NaN"):
        moekit.route(cfg, bad)


def test_counts_and_metrics():
    ids = np.array([[0, 1], [0, 2], [0, 3]], dtype=np.int32)
    counts = moekit.expert_counts(ids, 4)
    assert counts == [3, 1, 1, 1]
    assert moekit.max_violation(counts) == pytest.approx((3 - 1.5) / 1.5)
    m = moekit.load_metrics(counts)
    assert m["dead_experts"] == 0 and m["tokens"] == 6
    with pytest.raises(IndexError):
        moekit.expert_counts(np.array([[0, 7]], dtype=np.int32), 4)
