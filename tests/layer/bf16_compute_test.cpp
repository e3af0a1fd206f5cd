// The bf16 compute mode (MoeLayer::set_bf16_activations) of whole blocks built in memory with bf16
// weights: against a double-precision model of its contract (the rows entering each projection
// rounded to bf16, exact products, the activation on the fp32 pre-activations), on both paths
// (avx512bf16 where the CPU has it); against the exact f32 mode (the error the mode costs, printed);
// bit-identical for any thread count; the weights packed in AMX tiles give the rows' bits (where
// the CPU has AMX); its errors for weights it cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <random>
#include <string>

#include "experts/dense_reference.hpp"
#include "kernels/gemm.hpp"
#include "moekit/layer.hpp"
#include "moekit/threading.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

using testing::randn;

std::shared_ptr<Tensor> bf16_tensor(Shape shape, std::mt19937& rng, float scale) {
  return std::make_shared<Tensor>(to_dtype(randn(std::move(shape), rng, scale), DType::bf16));
}

ExpertWeights bf16_experts(std::int64_t E, std::int64_t D, std::int64_t F, bool gated, bool biases,
                           std::mt19937& rng) {
  ExpertWeights w;
  auto u = bf16_tensor({E, F, D}, rng, 0.3f);
  auto d = bf16_tensor({E, D, F}, rng, 0.3f);
  w.up = ExpertMatrix::stacked(*u);
  w.down = ExpertMatrix::stacked(*d);
  w.keep_alive = {u, d};
  if (gated) {
    auto g = bf16_tensor({E, F, D}, rng, 0.3f);
    w.gate = ExpertMatrix::stacked(*g);
    w.keep_alive.push_back(g);
  }
  if (biases) {
    if (gated) w.gate_bias = randn({E, F}, rng, 0.2f);
    w.up_bias = randn({E, F}, rng, 0.2f);
    w.down_bias = randn({E, D}, rng, 0.2f);
  }
  return w;
}

enum class Family { deepseek, llama4, gpt_oss };

struct Built {
  MoeConfig cfg;
  MoeWeights w;
};

// D = 72 (a K tail past two 32-wide bf16 vectors), F = 40.
Built build(Family fam, std::mt19937& rng) {
  constexpr std::int64_t D = 72, F = 40, E = 8;
  Built b;
  MoeConfig& c = b.cfg;
  c.model_type = "test";
  c.hidden_size = D;
  c.expert_width = F;
  c.num_layers = 1;
  c.router.num_experts = E;
  c.router.top_k = fam == Family::llama4 ? 1 : 3;
  if (fam == Family::deepseek) {
    c.router.score_func = ScoreFunc::sigmoid;
    c.router.has_selection_bias = true;
    c.router.renorm = Renorm::sum_eps;
    c.router.routed_scaling_factor = 2.5f;
    c.shared_width = 48;
    c.shared_gated = true;
  } else if (fam == Family::llama4) {
    c.router.score_func = ScoreFunc::sigmoid_selected;
    c.router.weight_on_input = true;
    c.shared_width = 48;
  } else {
    c.body = BodyKind::swiglu_clamped;
    c.expert_bias = true;
    c.router.has_router_bias = true;
  }
  auto router = std::make_shared<Tensor>(randn({E, D}, rng, 0.3f));
  b.w.router = router->view();
  b.w.keep_alive.push_back(router);
  if (c.router.has_selection_bias) b.w.selection_bias = randn({E}, rng, 0.1f);
  if (c.router.has_router_bias) b.w.router_bias = randn({E}, rng, 0.1f);
  b.w.experts = bf16_experts(E, D, F, true, fam == Family::gpt_oss, rng);
  if (c.shared_width > 0) b.w.shared = bf16_experts(1, D, c.shared_width, true, false, rng);
  if (c.shared_gated) {
    auto g = std::make_shared<Tensor>(randn({1, D}, rng, 0.3f));
    b.w.shared_gate = g->view();
    b.w.keep_alive.push_back(g);
  }
  return b;
}

double round_bf16(double v) { return bf16_to_f32(f32_to_bf16(static_cast<float>(v))); }

// One expert on one row, as the mode's contract says: x rounded to bf16, exact sums (double),
// the activation of the fp32-rounded pre-activations, h rounded to bf16, exact down projection.
void expert_bf16(const ExpertWeights& w, const ExpertBody& body, std::int64_t e, const std::vector<double>& xr,
                 double* out) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  std::vector<double> h(static_cast<std::size_t>(F));
  for (std::int64_t f = 0; f < F; ++f) {
    double g = 0, u = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      u += testing::load_weight(w.up, e, f, d) * xr[d];
      g += testing::load_weight(w.gate, e, f, d) * xr[d];
    }
    if (w.up_bias.numel()) u += w.up_bias.data_as<const float>()[e * F + f];
    if (w.gate_bias.numel()) g += w.gate_bias.data_as<const float>()[e * F + f];
    h[f] = round_bf16(testing::act(body, static_cast<float>(g), static_cast<float>(u)));
  }
  for (std::int64_t d = 0; d < D; ++d) {
    double acc = 0;
    for (std::int64_t f = 0; f < F; ++f) acc += testing::load_weight(w.down, e, d, f) * h[f];
    if (w.down_bias.numel()) acc += w.down_bias.data_as<const float>()[e * D + d];
    out[d] = acc;
  }
}

std::vector<double> contract_reference(const MoeLayer& layer, const Tensor& x, const Routing& r) {
  const MoeConfig& c = layer.config();
  const MoeWeights& w = layer.weights();
  const std::int64_t T = x.dim(0), D = c.hidden_size, K = c.router.top_k;
  std::vector<double> y(static_cast<std::size_t>(T * D), 0.0), xr(static_cast<std::size_t>(D)),
      out(static_cast<std::size_t>(D));
  const float* xs = x.data_as<const float>();
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t e = r.ids.data_as<std::int32_t>()[t * K + k];
      const float wt = r.weights.data_as<float>()[t * K + k];
      for (std::int64_t d = 0; d < D; ++d)
        xr[d] = round_bf16(c.router.weight_on_input ? xs[t * D + d] * wt : xs[t * D + d]);
      expert_bf16(w.experts, layer.body(), e, xr, out.data());
      for (std::int64_t d = 0; d < D; ++d) y[t * D + d] += c.router.weight_on_input ? out[d] : wt * out[d];
    }
    if (!w.shared.down.defined()) continue;
    for (std::int64_t d = 0; d < D; ++d) xr[d] = round_bf16(xs[t * D + d]);
    expert_bf16(w.shared, layer.shared_body(), 0, xr, out.data());
    double gate = 1.0;
    if (c.shared_gated) {
      double z = 0;
      for (std::int64_t d = 0; d < D; ++d) z += static_cast<double>(xs[t * D + d]) * w.shared_gate.data_as<const float>()[d];
      gate = 1.0 / (1.0 + std::exp(-z));
    }
    for (std::int64_t d = 0; d < D; ++d) y[t * D + d] += gate * out[d];
  }
  return y;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

const char* name(Family f) { return f == Family::deepseek ? "deepseek" : f == Family::llama4 ? "llama4" : "gpt_oss"; }

void expect_msg(const std::function<void()>& fn, const std::string& want) {
  try {
    fn();
    ADD_FAILURE() << "no exception, expected: " << want;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

class Bf16Compute : public ::testing::TestWithParam<Family> {};

TEST_P(Bf16Compute, MatchesTheContractOnEveryPath) {
  std::mt19937 rng(100 + static_cast<int>(GetParam()));
  Built b = build(GetParam(), rng);
  MoeLayer layer(b.cfg, b.w);
  const Tensor x = randn({29, b.cfg.hidden_size}, rng, 1.0f);
  ForwardInfo info_exact;
  const Tensor y_exact = layer.forward(x, &info_exact);
  layer.set_bf16_activations(true);
  ASSERT_TRUE(layer.bf16_activations());
  for (const kernels::Bf16Path path : kernels::kBf16Paths) {
    if (!kernels::bf16_path_supported(path)) {
      std::printf("[ bf16 mode ] this CPU has no %s: that path was not run\n", kernels::bf16_path_name(path));
      continue;
    }
    SCOPED_TRACE(kernels::bf16_path_name(path));
    kernels::detail::set_bf16_path_for_tests(path);
    ForwardInfo info;
    const Tensor y = layer.forward(x, &info);
    // The router stays fp32: the same routing as the exact mode.
    ASSERT_EQ(std::memcmp(info.routing.ids.data(), info_exact.routing.ids.data(), info.routing.ids.nbytes()), 0);
    ASSERT_EQ(std::memcmp(info.logits.data(), info_exact.logits.data(), info.logits.nbytes()), 0);
    const std::vector<double> ref = contract_reference(layer, x, info.routing);
    const double scale = max_abs(ref);
    double err = 0, err_exact = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      err = std::max(err, std::fabs(y.data_as<float>()[i] - ref[i]));
      err_exact = std::max(err_exact, std::fabs(static_cast<double>(y.data_as<float>()[i]) - y_exact.data_as<float>()[i]));
    }
    std::printf("[ bf16 mode ] %s %s: max|y - contract| = %.2e, max|y - exact f32 mode| = %.2e (of max|y| %.3f)\n",
                name(GetParam()), kernels::bf16_path_name(path), err / scale, err_exact / scale, scale);
    EXPECT_LE(err, 2e-5 * scale);
    // The mode is really on (its roundings show) and costs what bf16 costs, no more.
    EXPECT_GT(err_exact, 1e-4 * scale);
    EXPECT_LT(err_exact, 3e-2 * scale);
  }
  kernels::detail::set_bf16_path_for_tests(std::nullopt);
}

TEST_P(Bf16Compute, AnyThreadCountGivesTheSameBits) {
  std::mt19937 rng(200 + static_cast<int>(GetParam()));
  Built b = build(GetParam(), rng);
  MoeLayer layer(b.cfg, b.w);
  layer.set_bf16_activations(true);
  const Tensor x = randn({70, b.cfg.hidden_size}, rng, 1.0f);
  const int before = num_threads();
  for (const kernels::Bf16Path path : kernels::kBf16Paths) {
    if (!kernels::bf16_path_supported(path)) continue;
    SCOPED_TRACE(kernels::bf16_path_name(path));
    kernels::detail::set_bf16_path_for_tests(path);
    set_num_threads(1);
    const Tensor base = layer.forward(x);
    for (const int t : {2, 3}) {
      set_num_threads(t);
      const Tensor y = layer.forward(x);
      EXPECT_EQ(std::memcmp(y.data(), base.data(), y.nbytes()), 0) << t << " threads";
      // One token at a time (decode) gives each token's bits of the batch.
      const Tensor y0 = layer.forward(x.view().slice_rows(5, 6));
      EXPECT_EQ(std::memcmp(y0.data(), base.data_as<float>() + 5 * b.cfg.hidden_size, y0.nbytes()), 0);
    }
    set_num_threads(before);
    // bf16 in, bf16 out: the f32 result on the same input, rounded.
    const Tensor xb = to_dtype(x, DType::bf16);
    const Tensor yb = layer.forward(xb);
    ASSERT_EQ(yb.dtype(), DType::bf16);
    const Tensor want = to_dtype(layer.forward(to_dtype(xb, DType::f32)), DType::bf16);
    EXPECT_EQ(std::memcmp(yb.data(), want.data(), yb.nbytes()), 0);
  }
  kernels::detail::set_bf16_path_for_tests(std::nullopt);
}

// pack_weights() in the bf16 mode on AMX: the experts (routed and shared) in amx_tiles, the
// same bits as the in-place rows for every thread count, the resident bytes those of whole tiles.
TEST_P(Bf16Compute, AmxTilesGiveTheBitsOfTheRows) {
  if (kernels::bf16_path() != kernels::Bf16Path::amx)
    GTEST_SKIP() << "the bf16 mode runs " << kernels::bf16_path_name(kernels::bf16_path())
                 << " here, not amx: the AMX tile layout was not run";
  std::mt19937 rng(300 + static_cast<int>(GetParam()));
  Built b = build(GetParam(), rng);
  MoeLayer rows(b.cfg, b.w);
  rows.set_bf16_activations(true);
  MoeLayer tiles(b.cfg, b.w);
  tiles.set_bf16_activations(true);
  const std::size_t predicted = tiles.weights().experts.packed_nbytes(tiles.compute_mode());
  tiles.pack_weights();
  const ExpertWeights& ex = tiles.weights().experts;
  ASSERT_EQ(ex.down.layout, MatrixLayout::amx_tiles);
  ASSERT_EQ(ex.up.layout, MatrixLayout::amx_tiles);
  if (tiles.weights().shared.down.defined()) {
    ASSERT_EQ(tiles.weights().shared.down.layout, MatrixLayout::amx_tiles);
  }
  const std::int64_t E = ex.num_experts(), D = ex.hidden_size(), F = ex.width();
  const std::int64_t matrices = ex.gate.defined() ? 2 : 1;
  EXPECT_EQ(ex.nbytes(), static_cast<std::size_t>(E * 2 * (matrices * kernels::amx_tile_elements(F, D) +
                                                           kernels::amx_tile_elements(D, F))));
  EXPECT_EQ(ex.nbytes(), predicted);
  const Tensor x = randn({70, b.cfg.hidden_size}, rng, 1.0f);
  const Tensor want = rows.forward(x);
  const int before = num_threads();
  for (const int t : {1, 2, 3}) {
    set_num_threads(t);
    const Tensor y = tiles.forward(x);
    EXPECT_EQ(std::memcmp(y.data(), want.data(), y.nbytes()), 0) << t << " threads";
  }
  set_num_threads(before);
  expect_msg([&] { tiles.set_bf16_activations(false); }, "packed in AMX tiles");
  EXPECT_TRUE(tiles.bf16_activations());
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16Compute, ::testing::Values(Family::deepseek, Family::llama4, Family::gpt_oss),
                         [](const ::testing::TestParamInfo<Family>& i) { return std::string(name(i.param)); });

TEST(Bf16ComputeErrors, NamesTheMatrixItCannotRun) {
  std::mt19937 rng(5);
  Built b = build(Family::deepseek, rng);
  // f32 shared expert down projection.
  auto f32_down = std::make_shared<Tensor>(randn({1, 72, 48}, rng, 0.3f));
  Built mixed = b;
  mixed.w.shared.down = ExpertMatrix::stacked(*f32_down);
  mixed.w.shared.keep_alive.push_back(f32_down);
  MoeLayer m(mixed.cfg, mixed.w);
  expect_msg([&] { m.set_bf16_activations(true); }, "shared.down is f32");
  EXPECT_FALSE(m.bf16_activations());

  MoeLayer packed(b.cfg, b.w);
  packed.pack_weights();
  expect_msg([&] { packed.set_bf16_activations(true); }, "experts.gate is packed in panels");

  // In the bf16 mode, pack_weights() packs AMX tiles where the mode runs on AMX and has nothing
  // to pack into on its other paths.
  MoeLayer on(b.cfg, b.w);
  on.set_bf16_activations(true);
  for (const kernels::Bf16Path path : {kernels::Bf16Path::f32_fma, kernels::Bf16Path::avx512bf16}) {
    if (!kernels::bf16_path_supported(path)) continue;
    kernels::detail::set_bf16_path_for_tests(path);
    expect_msg([&] { on.pack_weights(); }, "packed layout on the amx path only");
    EXPECT_EQ(on.weights().experts.up.layout, MatrixLayout::rows);
  }
  kernels::detail::set_bf16_path_for_tests(std::nullopt);
  on.set_bf16_activations(false);
  EXPECT_FALSE(on.bf16_activations());
  on.pack_weights();  // and off again, packing gives panels
  EXPECT_EQ(on.weights().experts.up.layout, MatrixLayout::panels);
}

}  // namespace
}  // namespace moekit
