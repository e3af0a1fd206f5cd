"""moekit.transformers: moekit as transformers' experts backend, against transformers' own grouped_mm.

For every family below, a tiny causal LM is built from its config with random weights; then with
experts_implementation "moekit" against "grouped_mm" on the same model:
  logits of model(input_ids) within 1e-5 relative (fp32), greedy generate() gives the same tokens,
  one training step's loss and every parameter's gradient within 1e-4 relative (the router's
  included: transformers' router trains through top_k_weights), and a few AdamW steps on moekit
  lower the loss; in bf16, logits within bf16 tolerance.

Needs torch >= 2.6 and transformers >= 5 (Debian's python3-torch is 1.13, so under .venv this file
skips and says so). bench/peers/setup.sh makes build-peers/venv with both; run:
    PYTHONPATH=build/python build-peers/venv/bin/python -m pytest python/tests/test_transformers_backend.py
"""

import re
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
_tv = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
if _tv < (2, 6):
    pytest.skip(f"the transformers backend needs torch >= 2.6; this interpreter has torch {torch.__version__}",
                allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"the experts backend needs transformers >= 5, found {transformers.__version__}",
                allow_module_level=True)

import moekit  # noqa: E402
import moekit.transformers as mtf  # noqa: E402

COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              vocab_size=96, max_position_embeddings=128, tie_word_embeddings=False)
E, F = 8, 16
# model_type: config fields beyond COMMON (small MoE layers in every layer).
FAMILIES = {
    "mixtral": dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F),
    "qwen2_moe": dict(num_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, intermediate_size=F,
                      shared_expert_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=1),
    "qwen3_moe": dict(num_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, intermediate_size=F,
                      norm_topk_prob=True, decoder_sparse_step=1),
    "olmoe": dict(num_experts=E, num_experts_per_tok=2, intermediate_size=F),
    "deepseek_v2": dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, intermediate_size=F,
                        n_shared_experts=1, first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=None,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4),
    "deepseek_v3": dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, intermediate_size=F,
                        n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=0, kv_lora_rank=16,
                        q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                        num_key_value_heads=4),
    "glm4_moe": dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, intermediate_size=F,
                     n_shared_experts=1, first_k_dense_replace=0, n_group=1, topk_group=1),
    "gpt_oss": dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F, layer_types=None),
    "minimax_m2": dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F),
    "granitemoe": dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F),
    "phimoe": dict(num_local_experts=E, num_experts_per_tok=2, intermediate_size=F),
    "ernie4_5_moe": dict(moe_num_experts=E, moe_k=2, moe_intermediate_size=F, intermediate_size=F,
                         moe_layer_start_index=0, moe_num_shared_experts=0),
    "dots1": dict(n_routed_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, intermediate_size=F,
                  n_shared_experts=1, first_k_dense_replace=0),
    "hunyuan_v1_moe": dict(num_experts=E, moe_topk=2, moe_intermediate_size=F, intermediate_size=F),
}


def build(family, dtype=torch.float32):
    cfg = transformers.AutoConfig.for_model(family, **{**COMMON, **FAMILIES[family]})
    torch.manual_seed(sum(map(ord, family)))
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - a family this transformers builds differently
        pytest.skip(f"transformers {transformers.__version__} cannot build a tiny {family}: {e}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3:  # stacked experts: large enough that routing and experts matter
                p.normal_(0.0, 0.2)
            elif "bias" in name and "expert" in name:
                p.normal_(0.0, 0.05)
        for name, b in model.named_buffers():
            if "correction_bias" in name or "bias" in name and b.ndim == 1 and b.is_floating_point():
                b.uniform_(-0.05, 0.2)
    model.eval()
    return model


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def ids_batch(seed=0, batch=2, length=12):
    return torch.randint(0, COMMON["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_generate_and_gradients(family):
    model = build(family)
    assert experts_modules(model), f"{family}: no experts module uses transformers' ExpertsInterface"
    x = ids_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no silent fallback: every call runs on moekit
        mtf.strict = True
        try:
            model.set_experts_implementation("grouped_mm")
            with torch.no_grad():
                ref = model(x).logits
            model.set_experts_implementation("moekit")
            with torch.no_grad():
                got = model(x).logits
            assert rel(got, ref) <= 1e-5, family

            # Greedy generation: the same tokens.
            prompt = x[:1, :5]
            gen = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
            model.set_experts_implementation("grouped_mm")
            want = model.generate(prompt, **gen)
            model.set_experts_implementation("moekit")
            assert torch.equal(model.generate(prompt, **gen), want), family

            # One training step: loss and every gradient.
            def step(impl):
                model.set_experts_implementation(impl)
                model.zero_grad(set_to_none=True)
                torch.manual_seed(11)  # routers that draw noise in training (PhiMoE's jitter) draw the same
                loss = model(x, labels=x).loss
                loss.backward()
                return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

            model.train()
            loss_ref, g_ref = step("grouped_mm")
            loss_got, g_got = step("moekit")
            model.eval()
            assert rel(loss_got, loss_ref) <= 1e-5, family
            assert g_got.keys() == g_ref.keys(), family
            worst = max(g_got, key=lambda n: rel(g_got[n], g_ref[n]))
            assert rel(g_got[worst], g_ref[worst]) <= 1e-4, (family, worst)
            routers = [n for n in g_got if re.search(r"\.gate(\.|$)|router", n) and "_proj" not in n]
            assert routers, family
            # The router trains through top_k_weights (moekit's dL/dweights), except where transformers'
            # own code gives it no gradient (PhiMoE's sparsemixer: grouped_mm's are zero too).
            for n in routers:
                assert bool(g_got[n].abs().max() > 0) == bool(g_ref[n].abs().max() > 0), (family, n)
                assert family == "phimoe" or g_got[n].abs().max() > 0, (family, n)
        finally:
            mtf.strict = False


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_fine_tuning_lowers_the_loss(family):
    model = build(family)
    model.set_experts_implementation("moekit")
    model.train()
    x = ids_batch(seed=3, batch=4, length=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()  # in place: the next forward reads the new experts (transposed ones re-copied)
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0], losses
    # The in-place updates are what moekit computes with: the same logits as grouped_mm now.
    model.eval()
    with torch.no_grad():
        got = model(x).logits
        model.set_experts_implementation("grouped_mm")
        ref = model(x).logits
    assert rel(got, ref) <= 1e-5


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_bf16_model(family):
    """A bf16 model runs moekit's bf16 compute mode. Both backends are held against the fp32 model with
    the same (bf16) weights: moekit's experts within 1e-2 and no further off than grouped_mm's bf16."""
    model = build(family, dtype=torch.bfloat16)
    ref_model = build(family)
    ref_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ex, ex32 = experts_modules(model)[0], experts_modules(ref_model)[0]
    gen = torch.Generator().manual_seed(5)
    T = 64
    h = torch.randn(T, COMMON["hidden_size"], generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(E, generator=gen)[:2] for _ in range(T)])
    w = torch.rand(T, 2, generator=gen).bfloat16()
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS as fns

    with torch.no_grad():
        want = fns["grouped_mm"](ex32, h.float(), idx, w.float())
        got = mtf.experts_forward(ex, h, idx, w)
        theirs = fns["grouped_mm"](ex, h, idx, w)
    assert got.dtype == torch.bfloat16
    assert rel(got, want) <= 1e-2 and rel(got, want) <= rel(theirs, want) + 1e-3, (rel(got, want), rel(theirs, want))

    x = ids_batch(seed=5)
    with torch.no_grad():
        ref_model.set_experts_implementation("grouped_mm")
        want = ref_model(x).logits
        model.set_experts_implementation("grouped_mm")
        theirs = model(x).logits.float()
        model.set_experts_implementation("moekit")
        got = model(x).logits.float()
    # Two layers of bf16 activations (attention included); grouped_mm's bf16 can be further off
    # where a near-tie of the router flips.
    assert rel(got, want) <= max(3e-2, rel(theirs, want)), (rel(got, want), rel(theirs, want))


def test_unsupported_cases_fall_back_or_raise():
    model = build("qwen3_moe")
    x = ids_batch(seed=6)
    experts = experts_modules(model)[0]
    # float16 activations: not a moekit compute mode -> grouped_mm, with a warning; strict raises.
    h = torch.randn(5, COMMON["hidden_size"], dtype=torch.float16)
    idx = torch.randint(0, E, (5, 2))
    w = torch.rand(5, 2, dtype=torch.float16)
    experts.half()
    mtf._warned.clear()
    with pytest.warns(UserWarning, match="float16"):
        out = mtf.experts_forward(experts, h, idx, w)
    assert out.shape == h.shape and out.dtype == torch.float16
    mtf.strict = True
    try:
        with pytest.raises(mtf.Unsupported, match="float16"):
            mtf.experts_forward(experts, h, idx, w)
    finally:
        mtf.strict = False
    experts.float()
    # Expert parallelism inside transformers: refused by name.
    experts._is_expert_parallel = True
    mtf.strict = True
    try:
        with pytest.raises(mtf.Unsupported, match="expert parallelism"):
            mtf.experts_forward(experts, h.float(), idx, w.float())
    finally:
        mtf.strict = False
        experts._is_expert_parallel = False
    # An activation moekit does not run: found once, falls back.
    other = build("qwen3_moe")
    ex = experts_modules(other)[0]
    ex.act_fn = torch.nn.Tanh()
    with pytest.warns(UserWarning, match="activation"):
        y = mtf.experts_forward(ex, h.float(), idx, w.float())
    assert torch.isfinite(y).all()
    # Out-of-range expert ids: moekit's named error, nothing computed.
    with pytest.raises(IndexError, match="token"):
        mtf.experts_forward(experts_modules(model)[0], h.float(), torch.full((5, 2), E), w.float())
    del x


def test_transposed_copy_follows_in_place_updates():
    model = build("gpt_oss")
    model.set_experts_implementation("moekit")
    x = ids_batch(seed=7)
    ex = experts_modules(model)[0]
    with torch.no_grad():
        before = model(x).logits
        ex.down_proj.mul_(1.5)  # in place: _version changes, the transposed copy is made again
        after = model(x).logits
        model.set_experts_implementation("grouped_mm")
        ref = model(x).logits
    assert rel(after, before) > 1e-3
    assert rel(after, ref) <= 1e-5
