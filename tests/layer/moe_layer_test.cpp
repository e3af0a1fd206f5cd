// MoeLayer built in memory: against the dense oracle (routed + shared + gate, weight on input),
// batch shapes, bf16 in/out, concurrency, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "experts/dense_reference.hpp"
#include "util/random.hpp"
#include "moekit/layer.hpp"

namespace moekit {
namespace {

using testing::randn;

ExpertWeights stacked_experts(std::int64_t E, std::int64_t D, std::int64_t F, std::mt19937& rng) {
  ExpertWeights w;
  auto g = std::make_shared<Tensor>(randn({E, F, D}, rng, 0.3f));
  auto u = std::make_shared<Tensor>(randn({E, F, D}, rng, 0.3f));
  auto d = std::make_shared<Tensor>(randn({E, D, F}, rng, 0.3f));
  w.gate = ExpertMatrix::stacked(*g);
  w.up = ExpertMatrix::stacked(*u);
  w.down = ExpertMatrix::stacked(*d);
  w.keep_alive = {g, u, d};
  return w;
}

struct Built {
  MoeConfig cfg;
  MoeWeights w;
};

// A DeepSeek-V3-like block (sigmoid, bias, groups, rsf) with a gated shared expert.
Built build(bool weight_on_input, bool gated_shared, std::mt19937& rng) {
  Built b;
  MoeConfig& c = b.cfg;
  c.model_type = "test";
  c.hidden_size = 24;
  c.expert_width = 12;
  c.num_layers = 1;
  c.router.num_experts = 8;
  c.router.top_k = weight_on_input ? 1 : 3;
  c.router.score_func = weight_on_input ? ScoreFunc::sigmoid_selected : ScoreFunc::sigmoid;
  c.router.weight_on_input = weight_on_input;
  if (!weight_on_input) {
    c.router.has_selection_bias = true;
    c.router.group_mode = GroupMode::top2_sum;
    c.router.n_group = 4;
    c.router.topk_group = 2;
    c.router.renorm = Renorm::sum_eps;
    c.router.routed_scaling_factor = 2.5f;
  }
  c.shared_width = 20;
  c.shared_gated = gated_shared;
  auto router = std::make_shared<Tensor>(randn({8, 24}, rng, 0.5f));
  b.w.router = router->view();
  b.w.keep_alive.push_back(router);
  if (c.router.has_selection_bias) b.w.selection_bias = randn({8}, rng, 0.1f);
  b.w.experts = stacked_experts(8, 24, 12, rng);
  b.w.shared = stacked_experts(1, 24, 20, rng);
  if (gated_shared) {
    auto g = std::make_shared<Tensor>(randn({1, 24}, rng, 0.5f));
    b.w.shared_gate = g->view();
    b.w.keep_alive.push_back(g);
  }
  return b;
}

// Dense oracle of the whole block from the layer's own routing.
std::vector<double> dense_block(const Built& b, const Tensor& x, const Routing& r) {
  const std::int64_t T = x.dim(0), D = b.cfg.hidden_size;
  const ExpertBody body{};
  std::vector<double> y = testing::dense_moe(b.w.experts, body, x.data_as<float>(), T, r.ids.data_as<std::int32_t>(),
                                             r.weights.data_as<float>(), b.cfg.router.top_k,
                                             b.cfg.router.weight_on_input);
  std::vector<double> xin(D), out(D);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t d = 0; d < D; ++d) xin[d] = x.data_as<float>()[t * D + d];
    testing::expert_dense(b.w.shared, body, 0, xin.data(), out.data());
    double gate = 1.0;
    if (b.cfg.shared_gated) {
      double z = 0;
      for (std::int64_t d = 0; d < D; ++d) z += xin[d] * b.w.shared_gate.data_as<const float>()[d];
      gate = 1.0 / (1.0 + std::exp(-z));
    }
    for (std::int64_t d = 0; d < D; ++d) y[t * D + d] += gate * out[d];
  }
  return y;
}

void expect_close(const Tensor& y, const std::vector<double>& ref) {
  double mx = 0;
  for (double v : ref) mx = std::max(mx, std::fabs(v));
  for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(y.data_as<float>()[i], ref[i], 1e-5 * mx) << i;
}

TEST(MoeLayer, MatchesDenseOracle) {
  for (bool woi : {false, true}) {
    for (bool gated : {false, true}) {
      std::mt19937 rng(woi * 2 + gated);
      const Built b = build(woi, gated, rng);
      const MoeLayer layer(b.cfg, b.w);
      const Tensor x = randn({33, 24}, rng, 1.0f);
      ForwardInfo info;
      const Tensor y = layer.forward(x, &info);
      expect_close(y, dense_block(b, x, info.routing));
      // The routing it returns is route() on router_logits().
      const Routing r = route(b.cfg.router, router_logits(x, b.w.router), b.w.selection_bias.view());
      EXPECT_EQ(std::memcmp(r.ids.data(), info.routing.ids.data(), r.ids.nbytes()), 0);
    }
  }
}

TEST(MoeLayer, BatchShapesAndBf16) {
  std::mt19937 rng(5);
  const Built b = build(false, true, rng);
  const MoeLayer layer(b.cfg, b.w);
  const Tensor x = randn({2, 5, 24}, rng, 1.0f);
  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(info.routing.ids.shape(), (Shape{2, 5, 3}));
  EXPECT_EQ(info.logits.shape(), (Shape{2, 5, 8}));
  const Tensor flat = layer.forward(x.view().reshaped({10, 24}));
  EXPECT_EQ(std::memcmp(flat.data(), y.data(), y.nbytes()), 0);
  // bf16 in -> bf16 out, equal to the f32 computation on the bf16-rounded input, rounded.
  const Tensor xb = to_dtype(x, DType::bf16);
  const Tensor yb = layer.forward(xb);
  EXPECT_EQ(yb.dtype(), DType::bf16);
  const Tensor y_ref = to_dtype(layer.forward(to_dtype(xb, DType::f32)), DType::bf16);
  EXPECT_EQ(std::memcmp(yb.data(), y_ref.data(), yb.nbytes()), 0);
}

TEST(MoeLayer, ConcurrentForwardsAreIdentical) {
  std::mt19937 rng(6);
  const Built b = build(false, true, rng);
  const MoeLayer layer(b.cfg, b.w);
  const Tensor x = randn({200, 24}, rng, 1.0f);
  const Tensor want = layer.forward(x);
  std::vector<Tensor> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = layer.forward(x); });
  for (auto& t : threads) t.join();
  for (const Tensor& g : got) EXPECT_EQ(std::memcmp(g.data(), want.data(), want.nbytes()), 0);
}

TEST(MoeLayer, Validation) {
  std::mt19937 rng(7);
  const auto expect_msg = [](auto&& fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no throw, expected " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Built b = build(false, true, rng);
  {
    Built bad = b;
    Tensor r({8, 23}, DType::f32);
    bad.w.router = r.view();
    expect_msg([&] { MoeLayer(bad.cfg, bad.w); }, "router must be f32 or bf16 [8, 24]");
  }
  {
    Built bad = b;
    bad.w.selection_bias = Tensor();
    expect_msg([&] { MoeLayer(bad.cfg, bad.w); }, "selection_bias must be f32 [8]");
  }
  {
    Built bad = b;
    bad.w.shared_gate = TensorView();
    expect_msg([&] { MoeLayer(bad.cfg, bad.w); }, "shared_gate must be");
  }
  {
    Built bad = b;
    bad.cfg.shared_width = 0;
    bad.cfg.shared_gated = false;
    expect_msg([&] { MoeLayer(bad.cfg, bad.w); }, "shared expert given");
  }
  {
    Built bad = b;
    bad.cfg.router.top_k = 9;
    expect_msg([&] { MoeLayer(bad.cfg, bad.w); }, "top_k (9)");
  }
  const MoeLayer layer(b.cfg, b.w);
  Tensor x = randn({3, 24}, rng, 1.0f);
  expect_msg([&] { layer.forward(randn({3, 25}, rng, 1.0f)); }, "x must be f32 or bf16 [..., 24]");
  x.data_as<float>()[24 + 7] = std::nanf("");
  expect_msg([&] { layer.forward(x); }, "non-finite value nan at row 1, column 7");
  Tensor xi({3, 24}, DType::i32);
  expect_msg([&] { layer.forward(xi); }, "x must be f32 or bf16");
}

}  // namespace
}  // namespace moekit
