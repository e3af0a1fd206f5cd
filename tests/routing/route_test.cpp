// route(): validation branches, hand-checked cases and property tests against the scalar
// reference router (tests/routing/reference_router.hpp) on random configs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "util/random.hpp"
#include "moekit/routing.hpp"
#include "moekit/threading.hpp"
#include "routing/reference_router.hpp"

namespace moekit {
namespace {

RouterConfig softmax_cfg(std::int64_t E, std::int64_t K) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = K;
  return c;
}

RouterConfig deepseek_v3_cfg() {
  RouterConfig c;
  c.num_experts = 16;
  c.top_k = 4;
  c.score_func = ScoreFunc::sigmoid;
  c.has_selection_bias = true;
  c.group_mode = GroupMode::top2_sum;
  c.n_group = 4;
  c.topk_group = 2;
  c.renorm = Renorm::sum_eps;
  c.routed_scaling_factor = 2.5f;
  return c;
}

Tensor random_logits(Shape shape, std::mt19937& rng, float scale = 2.0f) { return testing::randn(std::move(shape), rng, scale); }

// Every validation branch: the message names the field and its value.
void expect_invalid(const RouterConfig& c, const char* needle) {
  try {
    validate(c);
    ADD_FAILURE() << "expected invalid_argument containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RouterValidation, EveryBranch) {
  expect_invalid(softmax_cfg(0, 1), "num_experts (0)");
  expect_invalid(softmax_cfg(8, 9), "top_k (9)");
  expect_invalid(softmax_cfg(8, 0), "top_k (0)");
  RouterConfig c = deepseek_v3_cfg();
  c.n_group = 3;
  expect_invalid(c, "not divisible by n_group (3)");
  c = deepseek_v3_cfg();
  c.n_group = 0;
  expect_invalid(c, "n_group (0)");
  c = deepseek_v3_cfg();
  c.topk_group = 5;
  expect_invalid(c, "topk_group (5)");
  c.topk_group = 0;
  expect_invalid(c, "topk_group (0)");
  c = deepseek_v3_cfg();
  c.n_group = 16;
  c.topk_group = 8;
  expect_invalid(c, "needs >= 2 experts per group");
  c = deepseek_v3_cfg();
  c.topk_group = 1;
  c.top_k = 5;  // one group of 4 survives
  expect_invalid(c, "< top_k (5)");
  c = deepseek_v3_cfg();
  c.routed_scaling_factor = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(c, "routed_scaling_factor");
  c = deepseek_v3_cfg();
  c.renorm_eps = -1;
  expect_invalid(c, "renorm_eps");
  // group max with one expert per group is fine
  c = deepseek_v3_cfg();
  c.group_mode = GroupMode::max;
  c.n_group = 16;
  c.topk_group = 4;
  EXPECT_NO_THROW(validate(c));
}

TEST(RouterValidation, InputsAndOutputsUntouched) {
  std::mt19937 rng(1);
  const RouterConfig c = deepseek_v3_cfg();
  Tensor logits = random_logits({3, 16}, rng);
  Tensor bias({16}, DType::f32);
  Tensor ids({3, 4}, DType::i32), w({3, 4}, DType::f32);
  std::memset(ids.data(), 0x7f, ids.nbytes());
  std::memset(w.data(), 0x7f, w.nbytes());
  const auto untouched = [&] {
    for (std::int64_t i = 0; i < 12; ++i) {
      EXPECT_EQ(ids.data_as<std::int32_t>()[i], 0x7f7f7f7f);
    }
  };
  const auto expect_throw_msg = [&](auto&& fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no throw, expected " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    untouched();
  };
  // bias not rank-1 [E]
  Tensor bias2({2, 8}, DType::f32);
  expect_throw_msg([&] { route_into(c, logits, bias2, ids, w); }, "selection_bias must be f32 [16]");
  Tensor bias3({15}, DType::f32);
  expect_throw_msg([&] { route_into(c, logits, bias3, ids, w); }, "selection_bias must be f32 [16]");
  Tensor bias_bf16({16}, DType::bf16);
  expect_throw_msg([&] { route_into(c, logits, bias_bf16, ids, w); }, "selection_bias must be f32");
  expect_throw_msg([&] { route_into(c, logits, TensorView{}, ids, w); }, "no selection_bias");
  expect_throw_msg([&] { route_into(softmax_cfg(16, 4), logits, bias, ids, w); }, "has_selection_bias is false");
  // logits shape / dtype
  Tensor wrong_e = random_logits({3, 15}, rng);
  expect_throw_msg([&] { route_into(c, wrong_e, bias, ids, w); }, "logits must be f32 [..., 16], got f32 (3, 15)");
  Tensor bf = to_dtype(logits, DType::bf16);
  expect_throw_msg([&] { route_into(c, bf, bias, ids, w); }, "logits must be f32");
  // output shapes
  Tensor ids_bad({3, 5}, DType::i32);
  expect_throw_msg([&] { route_into(c, logits, bias, ids_bad, w); }, "ids must be i32 [3, 4]");
  // NaN / Inf policy: rejected, naming token and expert
  logits.data_as<float>()[16 + 5] = std::numeric_limits<float>::quiet_NaN();
  expect_throw_msg([&] { route_into(c, logits, bias, ids, w); }, "token 1, expert 5");
  logits.data_as<float>()[16 + 5] = std::numeric_limits<float>::infinity();
  expect_throw_msg([&] { route_into(c, logits, bias, ids, w); }, "non-finite logit inf");
  logits.data_as<float>()[16 + 5] = 0.0f;
  bias.data_as<float>()[3] = -std::numeric_limits<float>::infinity();
  expect_throw_msg([&] { route_into(c, logits, bias, ids, w); }, "selection_bias[3]");
  // and an invalid config
  RouterConfig bad = c;
  bad.top_k = 17;
  expect_throw_msg([&] { route_into(bad, logits, bias, ids, w); }, "top_k (17)");
}

TEST(Route, HandCheckedSoftmaxTop2) {
  // logits (0, ln 2, ln 4, ln 1): softmax = (1, 2, 4, 1) / 8; top-2 = experts 2, 1.
  const float l2 = std::log(2.0f), l4 = std::log(4.0f);
  Tensor logits = Tensor::from_f32({1, 4}, {0.0f, l2, l4, 0.0f});
  RouterConfig c = softmax_cfg(4, 2);
  Routing r = route(c, logits);
  EXPECT_EQ(r.ids.data_as<std::int32_t>()[0], 2);
  EXPECT_EQ(r.ids.data_as<std::int32_t>()[1], 1);
  EXPECT_NEAR(r.weights.data_as<float>()[0], 0.5f, 1e-7);
  EXPECT_NEAR(r.weights.data_as<float>()[1], 0.25f, 1e-7);
  c.renorm = Renorm::sum;
  r = route(c, logits);
  EXPECT_NEAR(r.weights.data_as<float>()[0], 2.0f / 3.0f, 1e-7);
  EXPECT_NEAR(r.weights.data_as<float>()[1], 1.0f / 3.0f, 1e-7);
}

TEST(Route, TiesGoToLowerExpertId) {
  Tensor logits = Tensor::from_f32({1, 6}, {1, 3, 3, 1, 3, 1});
  Routing r = route(softmax_cfg(6, 4), logits);
  const std::int32_t* ids = r.ids.data_as<std::int32_t>();
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
  EXPECT_EQ(ids[3], 0);
}

TEST(Route, ScaleAppliedExactlyOnce) {
  // K = 1 with sum_eps renorm: the weight is 1 * rsf, never rsf^2 and never 1.
  RouterConfig c = deepseek_v3_cfg();
  c.top_k = 1;
  std::mt19937 rng(3);
  Tensor logits = random_logits({8, 16}, rng);
  Tensor bias({16}, DType::f32);
  Routing r = route(c, logits, bias);
  for (int t = 0; t < 8; ++t) EXPECT_FLOAT_EQ(r.weights.data_as<float>()[t], 2.5f);
  // mlx-lm's variant skips renorm at K = 1: the weight is sigmoid * rsf.
  c.renorm_only_if_k_gt_1 = true;
  r = route(c, logits, bias);
  for (int t = 0; t < 8; ++t) {
    const float z = logits.data_as<float>()[t * 16 + r.ids.data_as<std::int32_t>()[t]];
    EXPECT_NEAR(r.weights.data_as<float>()[t], 2.5f / (1.0f + std::exp(-z)), 1e-6);
  }
}

TEST(Route, ScaleOnlyWithoutRenorm) {
  RouterConfig c = softmax_cfg(8, 2);
  c.renorm = Renorm::sum_eps;
  c.renorm_only_if_k_gt_1 = true;
  c.scale_only_without_renorm = true;  // DeepSeek-V2 reference
  c.routed_scaling_factor = 16.0f;
  std::mt19937 rng(4);
  Tensor logits = random_logits({4, 8}, rng);
  Routing r = route(c, logits);
  for (int t = 0; t < 4; ++t) {
    EXPECT_NEAR(r.weights.data_as<float>()[2 * t] + r.weights.data_as<float>()[2 * t + 1], 1.0f, 1e-6);
  }
  c.top_k = 1;  // no renorm at K = 1, so the scale applies
  r = route(c, logits);
  for (int t = 0; t < 4; ++t) EXPECT_GT(r.weights.data_as<float>()[t], 1.0f);
}

TEST(Route, ZeroSumGuard) {
  // sigmoid of very negative logits underflows to 0: the guarded renorm leaves 0, never NaN.
  RouterConfig c = softmax_cfg(4, 2);
  c.score_func = ScoreFunc::sigmoid;
  c.renorm = Renorm::sum;
  Tensor logits = Tensor::from_f32({1, 4}, {-200.0f, -200.0f, -300.0f, -300.0f});
  Routing r = route(c, logits);
  EXPECT_EQ(r.weights.data_as<float>()[0], 0.0f);
  EXPECT_EQ(r.weights.data_as<float>()[1], 0.0f);
  c.guard_zero_sum = false;
  r = route(c, logits);
  EXPECT_TRUE(std::isnan(r.weights.data_as<float>()[0]));
}

TEST(Route, LegacyZeroMaskDiffersWhenBiasedScoresGoNegative) {
  // 4 groups of 2, keep 1. The kept group holds one positive and one negative biased score:
  // with -inf masking both kept experts are chosen; with legacy 0.0 masking a dropped expert
  // (0.0) beats the kept negative one.
  RouterConfig c;
  c.num_experts = 8;
  c.top_k = 2;
  c.score_func = ScoreFunc::sigmoid;
  c.has_selection_bias = true;
  c.group_mode = GroupMode::top2_sum;
  c.n_group = 4;
  c.topk_group = 1;
  // sigmoid(0) = 0.5 everywhere, so sel = 0.5 + bias.
  Tensor logits({1, 8}, DType::f32);
  Tensor bias = Tensor::from_f32({8}, {0.2f, -0.6f, -0.9f, -0.9f, -0.9f, -0.9f, -0.9f, -0.9f});
  // sel = (0.7, -0.1, -0.4 x6); group 0 sum 0.6 wins; expert 1 is negative.
  Routing neg = route(c, logits, bias);
  EXPECT_EQ(neg.ids.data_as<std::int32_t>()[0], 0);
  EXPECT_EQ(neg.ids.data_as<std::int32_t>()[1], 1);
  c.mask_fill = MaskFill::legacy_zero;
  Routing zero = route(c, logits, bias);
  EXPECT_EQ(zero.ids.data_as<std::int32_t>()[0], 0);
  EXPECT_EQ(zero.ids.data_as<std::int32_t>()[1], 2);  // a masked expert at 0.0 beats -0.1
}

TEST(Route, SelectedLogitFamilies) {
  Tensor logits = Tensor::from_f32({1, 4}, {0.5f, 2.0f, -1.0f, 1.0f});
  RouterConfig c = softmax_cfg(4, 2);
  c.score_func = ScoreFunc::softmax_selected;
  Routing r = route(c, logits);
  EXPECT_EQ(r.ids.data_as<std::int32_t>()[0], 1);
  EXPECT_EQ(r.ids.data_as<std::int32_t>()[1], 3);
  EXPECT_NEAR(r.weights.data_as<float>()[0], 1.0f / (1.0f + std::exp(-1.0f)), 1e-6);
  c.score_func = ScoreFunc::sigmoid_selected;
  c.top_k = 1;
  r = route(c, logits);
  EXPECT_EQ(r.ids.data_as<std::int32_t>()[0], 1);
  EXPECT_NEAR(r.weights.data_as<float>()[0], 1.0f / (1.0f + std::exp(-2.0f)), 1e-6);
}

TEST(Route, ZeroTokens) {
  Tensor logits({0, 8}, DType::f32);
  Routing r = route(softmax_cfg(8, 2), logits);
  EXPECT_EQ(r.ids.shape(), (Shape{0, 2}));
}

RouterConfig random_config(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  RouterConfig c;
  const int G_choices[] = {1, 2, 4, 8};
  const int G = G_choices[pick(rng) % 4];
  const int per = 2 + pick(rng) % 7;
  c.num_experts = G * per;
  c.score_func = static_cast<ScoreFunc>(pick(rng) % 5);
  c.has_selection_bias = pick(rng) % 2;
  const int mode = pick(rng) % 3;
  c.group_mode = G > 1 ? static_cast<GroupMode>(mode) : GroupMode::none;
  c.n_group = G;
  c.topk_group = 1 + pick(rng) % G;
  const std::int64_t max_k = c.group_mode == GroupMode::none ? c.num_experts : c.topk_group * per;
  c.top_k = 1 + pick(rng) % max_k;
  c.mask_fill = pick(rng) % 4 == 0 ? MaskFill::legacy_zero : MaskFill::neg_inf;
  c.renorm = static_cast<Renorm>(pick(rng) % 3);
  c.renorm_only_if_k_gt_1 = pick(rng) % 2;
  c.scale_only_without_renorm = pick(rng) % 2;
  c.routed_scaling_factor = (pick(rng) % 3 == 0) ? 2.5f : 1.0f;
  return c;
}

TEST(RouteProperty, MatchesScalarReferenceOnRandomConfigs) {
  std::mt19937 rng(20261129);
  for (int trial = 0; trial < 300; ++trial) {
    const RouterConfig c = random_config(rng);
    SCOPED_TRACE(describe(c));
    ASSERT_NO_THROW(validate(c));
    const std::int64_t T = 1 + static_cast<std::int64_t>(rng() % 40);
    Tensor logits = random_logits({T, c.num_experts}, rng);
    Tensor bias;
    if (c.has_selection_bias) bias = random_logits({c.num_experts}, rng, 0.3f);
    const Routing r = route(c, logits, bias.view());
    const std::int32_t* ids = r.ids.data_as<std::int32_t>();
    const float* w = r.weights.data_as<float>();
    std::vector<std::int64_t> per_group_hits;
    for (std::int64_t t = 0; t < T; ++t) {
      const auto ref = testing::reference_route_token(c, logits.data_as<float>() + t * c.num_experts,
                                                      c.has_selection_bias ? bias.data_as<float>() : nullptr);
      std::set<std::int32_t> distinct;
      for (std::int64_t k = 0; k < c.top_k; ++k) {
        ASSERT_EQ(ids[t * c.top_k + k], ref.ids[k]) << "token " << t << " slot " << k;
        ASSERT_NEAR(w[t * c.top_k + k], ref.weights[k], 1e-6f * std::max(1.0f, std::fabs(ref.weights[k])));
        distinct.insert(ids[t * c.top_k + k]);
      }
      ASSERT_EQ(static_cast<std::int64_t>(distinct.size()), c.top_k) << "K distinct ids";
      if (c.group_mode != GroupMode::none && c.mask_fill == MaskFill::neg_inf) {
        std::set<std::int64_t> groups;
        for (auto e : distinct) groups.insert(e / (c.num_experts / c.n_group));
        ASSERT_LE(static_cast<std::int64_t>(groups.size()), c.topk_group) << "group constraint";
      }
    }
    const auto counts = expert_counts(r.ids, c.num_experts);
    std::int64_t total = 0;
    for (auto n : counts) total += n;
    ASSERT_EQ(total, T * c.top_k);
  }
}

TEST(RouteProperty, BiasChangesSelectionNeverWeights) {
  std::mt19937 rng(7);
  RouterConfig c = deepseek_v3_cfg();
  c.renorm = Renorm::none;
  c.routed_scaling_factor = 1.0f;
  Tensor logits = random_logits({64, 16}, rng);
  Tensor zero_bias({16}, DType::f32);
  Tensor bias = random_logits({16}, rng, 0.5f);
  const Routing a = route(c, logits, zero_bias);
  const Routing b = route(c, logits, bias);
  bool changed = false;
  for (std::int64_t i = 0; i < a.ids.numel(); ++i) changed |= a.ids.data_as<std::int32_t>()[i] != b.ids.data_as<std::int32_t>()[i];
  EXPECT_TRUE(changed) << "a 0.5-scale bias should move some selection";
  for (std::int64_t t = 0; t < 64; ++t) {
    for (int k = 0; k < 4; ++k) {
      const std::int32_t e = b.ids.data_as<std::int32_t>()[t * 4 + k];
      const float z = logits.data_as<float>()[t * 16 + e];
      EXPECT_FLOAT_EQ(b.weights.data_as<float>()[t * 4 + k], 1.0f / (1.0f + std::exp(-z)));
    }
  }
}

TEST(RouteProperty, ThreadCountDoesNotChangeABit) {
  std::mt19937 rng(11);
  RouterConfig c = deepseek_v3_cfg();
  Tensor logits = random_logits({1000, 16}, rng);
  Tensor bias = random_logits({16}, rng, 0.2f);
  const int saved = num_threads();
  set_num_threads(1);
  const Routing one = route(c, logits, bias);
  set_num_threads(2);
  const Routing two = route(c, logits, bias);
  set_num_threads(3);
  const Routing three = route(c, logits, bias);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.ids.data(), two.ids.data(), one.ids.nbytes()), 0);
  EXPECT_EQ(std::memcmp(one.weights.data(), two.weights.data(), one.weights.nbytes()), 0);
  EXPECT_EQ(std::memcmp(one.weights.data(), three.weights.data(), one.weights.nbytes()), 0);
}

TEST(RouteProperty, BatchShapeEqualsPerRow) {
  std::mt19937 rng(12);
  RouterConfig c = deepseek_v3_cfg();
  Tensor logits = random_logits({2, 5, 16}, rng);
  Tensor bias = random_logits({16}, rng, 0.2f);
  const Routing batched = route(c, logits, bias);
  EXPECT_EQ(batched.ids.shape(), (Shape{2, 5, 4}));
  for (std::int64_t t = 0; t < 10; ++t) {
    const Routing row = route(c, logits.view().reshaped({10, 16}).slice_rows(t, t + 1), bias);
    EXPECT_EQ(std::memcmp(row.ids.data(), batched.ids.data_as<std::int32_t>() + t * 4, 16), 0);
    EXPECT_EQ(std::memcmp(row.weights.data(), batched.weights.data_as<float>() + t * 4, 16), 0);
  }
}

TEST(RouterLogits, MatchesScalarDotsForF32AndBf16) {
  std::mt19937 rng(13);
  for (std::int64_t D : {1, 7, 8, 9, 63, 64, 65, 300}) {
    Tensor x = random_logits({5, D}, rng, 1.0f);
    Tensor w = random_logits({6, D}, rng, 1.0f);
    Tensor b = random_logits({6}, rng, 1.0f);
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor xs = to_dtype(x, dt), ws = to_dtype(w, dt);
      Tensor xr = to_dtype(xs, DType::f32), wr = to_dtype(ws, DType::f32);
      const Tensor out = router_logits(xs, ws, b);
      for (int t = 0; t < 5; ++t) {
        for (int e = 0; e < 6; ++e) {
          double ref = b.data_as<float>()[e], mag = std::fabs(ref);
          for (std::int64_t d = 0; d < D; ++d) {
            const double p = static_cast<double>(xr.data_as<float>()[t * D + d]) * wr.data_as<float>()[e * D + d];
            ref += p;
            mag += std::fabs(p);
          }
          // fp32 accumulation over D terms: |err| <= D * eps * sum|terms| (loose bound).
          EXPECT_NEAR(out.data_as<float>()[t * 6 + e], ref, 1e-6 * mag * static_cast<double>(D) + 1e-7);
        }
      }
    }
  }
  Tensor x({2, 4}, DType::f32), w({3, 5}, DType::f32);
  EXPECT_THROW(router_logits(x, w), std::invalid_argument);
  Tensor xi({2, 4}, DType::i32), w4({3, 4}, DType::f32);
  EXPECT_THROW(router_logits(xi, w4), std::invalid_argument);
  Tensor b2({2}, DType::f32);
  EXPECT_THROW(router_logits(x, w4, b2), std::invalid_argument);
}

TEST(Metrics, CountsAndMaxVio) {
  Tensor ids = Tensor::from_i32({2, 2}, {0, 1, 0, 3});
  const auto c = expert_counts(ids, 4);
  EXPECT_EQ(c, (std::vector<std::int64_t>{2, 1, 0, 1}));
  EXPECT_DOUBLE_EQ(max_violation(c), 1.0);  // mean 1, max 2
  EXPECT_DOUBLE_EQ(max_violation({0, 0}), 0.0);
  Tensor bad = Tensor::from_i32({1}, {4});
  EXPECT_THROW(expert_counts(bad, 4), std::out_of_range);
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

TEST(RouterKnobs, SetByName) {
  RouterConfig c;
  set_router_knob(c, "mask_fill", "legacy_zero");
  EXPECT_EQ(c.mask_fill, MaskFill::legacy_zero);
  set_router_knob(c, "renorm", "sum_eps");
  EXPECT_EQ(c.renorm, Renorm::sum_eps);
  set_router_knob(c, "renorm_only_if_k_gt_1", "true");
  EXPECT_TRUE(c.renorm_only_if_k_gt_1);
  set_router_knob(c, "scale_only_without_renorm", "1");
  EXPECT_TRUE(c.scale_only_without_renorm);
  set_router_knob(c, "guard_zero_sum", "false");
  EXPECT_FALSE(c.guard_zero_sum);
  set_router_knob(c, "routed_scaling_factor", "2.5");
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
  const RouterConfig before = c;
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"mask_fill", "zero"}, {"renorm", "l1"}, {"guard_zero_sum", "yes"}, {"routed_scaling_factor", "2.5x"},
           {"routed_scaling_factor", "-1"}, {"routed_scaling_factor", "nan"}, {"top_k", "3"}}) {
    try {
      set_router_knob(c, k, v);
      ADD_FAILURE() << k << "=" << v;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(k), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(c.mask_fill, before.mask_fill);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, before.routed_scaling_factor);
}

}  // namespace
}  // namespace moekit
