// Grouped (sparse) expert execution against the dense oracle, the dispatch plan's properties,
// tails and large row counts, determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include "experts/dense_reference.hpp"
#include "util/random.hpp"
#include "moekit/experts.hpp"
#include "moekit/threading.hpp"

namespace moekit {
namespace {

bool gated(BodyKind k) {
  return k == BodyKind::swiglu || k == BodyKind::swiglu_clamped || k == BodyKind::geglu || k == BodyKind::geglu_tanh;
}

using testing::randn;

// Random experts; `interleaved` stores gate and up as alternating rows of one [E, 2F, D]
// tensor (row_stride 2D) to exercise strided matrices.
ExpertWeights make_experts(std::int64_t E, std::int64_t D, std::int64_t F, BodyKind kind, DType dtype, bool biases,
                           bool interleaved, std::mt19937& rng) {
  ExpertWeights w;
  const auto keep = [&](Tensor t) {
    auto p = std::make_shared<Tensor>(std::move(t));
    w.keep_alive.push_back(p);
    return p;
  };
  const float s_in = 1.0f / std::sqrt(static_cast<float>(D)), s_mid = 1.0f / std::sqrt(static_cast<float>(F));
  if (interleaved && gated(kind)) {
    auto gu = keep(to_dtype(randn({E, 2 * F, D}, rng, s_in), dtype));
    const std::size_t es = dtype_size(dtype);
    w.gate.dtype = w.up.dtype = dtype;
    w.gate.rows = w.up.rows = F;
    w.gate.cols = w.up.cols = D;
    w.gate.row_stride = w.up.row_stride = 2 * D;
    for (std::int64_t e = 0; e < E; ++e) {
      const char* base = static_cast<const char*>(gu->data()) + static_cast<std::size_t>(e * 2 * F * D) * es;
      w.gate.experts.push_back(base);
      w.up.experts.push_back(base + static_cast<std::size_t>(D) * es);
    }
  } else {
    if (gated(kind)) w.gate = ExpertMatrix::stacked(*keep(to_dtype(randn({E, F, D}, rng, s_in), dtype)));
    w.up = ExpertMatrix::stacked(*keep(to_dtype(randn({E, F, D}, rng, s_in), dtype)));
  }
  w.down = ExpertMatrix::stacked(*keep(to_dtype(randn({E, D, F}, rng, s_mid), dtype)));
  if (biases) {
    if (gated(kind)) w.gate_bias = randn({E, F}, rng, 0.5f);
    w.up_bias = randn({E, F}, rng, 0.5f);
    w.down_bias = randn({E, D}, rng, 0.5f);
  }
  return w;
}

// Random distinct ids per token, weights in (0, 1).
void make_routing(std::int64_t T, std::int64_t K, std::int64_t E, std::mt19937& rng, Tensor& ids, Tensor& wts) {
  ids = Tensor({T, K}, DType::i32);
  wts = Tensor({T, K}, DType::f32);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(E));
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (std::int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::int64_t k = 0; k < K; ++k) {
      ids.data_as<std::int32_t>()[t * K + k] = perm[k];
      wts.data_as<float>()[t * K + k] = u(rng);
    }
  }
}

// |y - ref| <= tol_rel * (|ref| + scale) with scale the RMS of ref: fp32 accumulation over D
// and F terms gives relative errors ~ sqrt(D + F) * 2^-24, far below 1e-4.
void expect_close(const Tensor& y, const std::vector<double>& ref, double tol_rel) {
  double rms = 0;
  for (double v : ref) rms += v * v;
  rms = ref.empty() ? 0.0 : std::sqrt(rms / static_cast<double>(ref.size()));
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(y.data_as<float>()[i], ref[i], tol_rel * (std::fabs(ref[i]) + rms) + 1e-30) << "element " << i;
  }
}

struct Case {
  std::int64_t T, K, E, D, F;
  BodyKind kind;
  DType dtype;
  bool biases, interleaved, weight_on_input;
};

void run_case(const Case& c, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "T=" << c.T << " K=" << c.K << " E=" << c.E << " D=" << c.D << " F=" << c.F
                                    << " body=" << static_cast<int>(c.kind) << " dtype=" << dtype_name(c.dtype)
                                    << " biases=" << c.biases << " interleaved=" << c.interleaved
                                    << " woi=" << c.weight_on_input);
  std::mt19937 rng(seed);
  const ExpertBody body{c.kind, 7.0f, 1.702f};
  const ExpertWeights w = make_experts(c.E, c.D, c.F, c.kind, c.dtype, c.biases, c.interleaved, rng);
  Tensor x = randn({c.T, c.D}, rng, 1.0f), ids, wts;
  make_routing(c.T, c.K, c.E, rng, ids, wts);
  Tensor y({c.T, c.D}, DType::f32);
  run_experts(w, body, x, ids, wts, c.weight_on_input, y);
  const auto ref = testing::dense_moe(w, body, x.data_as<float>(), c.T, ids.data_as<std::int32_t>(),
                                      wts.data_as<float>(), c.K, c.weight_on_input);
  expect_close(y, ref, 2e-5);
  // The same experts repacked into panels (the outer-product forward kernel).
  ExpertWeights packed = w;
  pack_panels(packed);
  ASSERT_TRUE(packed.up.layout == MatrixLayout::panels && packed.down.layout == MatrixLayout::panels);
  Tensor yp({c.T, c.D}, DType::f32);
  run_experts(packed, body, x, ids, wts, c.weight_on_input, yp);
  SCOPED_TRACE("panels");
  expect_close(yp, ref, 2e-5);
}

TEST(GroupedExperts, MatchesDenseReferenceOnRandomConfigs) {
  std::mt19937 rng(99);
  const BodyKind kinds[] = {BodyKind::swiglu,   BodyKind::swiglu_clamped, BodyKind::geglu,    BodyKind::geglu_tanh,
                            BodyKind::mlp_relu, BodyKind::mlp_relu2,      BodyKind::mlp_silu};
  for (int trial = 0; trial < 40; ++trial) {
    Case c;
    c.E = 1 + rng() % 12;
    c.K = 1 + rng() % c.E;
    c.T = rng() % 40;
    c.D = 1 + rng() % 70;
    c.F = 1 + rng() % 70;
    c.kind = kinds[rng() % 7];
    c.dtype = (rng() % 3 == 0) ? DType::bf16 : (rng() % 5 == 0 ? DType::f16 : DType::f32);
    c.biases = rng() % 2;
    c.interleaved = rng() % 2;
    c.weight_on_input = rng() % 4 == 0;
    run_case(c, 1000 + trial);
  }
}

TEST(GroupedExperts, TailsAtTileMultiples) {
  for (std::int64_t D : {7, 8, 9, 63, 64, 65})
    for (std::int64_t F : {15, 16, 17})
      run_case({65, 2, 4, D, F, BodyKind::swiglu, DType::f32, false, false, false}, 7);
  // row counts around the row chunk of one task
  for (std::int64_t T : {0, 1, 63, 64, 65, 129}) run_case({T, 1, 1, 16, 8, BodyKind::swiglu, DType::bf16, true, true, false}, 8);
}

TEST(GroupedExperts, ExpertWithNoTokensAndAllOnOne) {
  std::mt19937 rng(5);
  const ExpertBody body{};
  const std::int64_t T = 50, E = 6, D = 24, F = 12;
  const ExpertWeights w = make_experts(E, D, F, BodyKind::swiglu, DType::f32, false, false, rng);
  Tensor x = randn({T, D}, rng, 1.0f);
  Tensor ids({T, 2}, DType::i32), wts({T, 2}, DType::f32);
  for (std::int64_t t = 0; t < T; ++t) {
    ids.data_as<std::int32_t>()[2 * t] = 3;  // all tokens on expert 3 ...
    ids.data_as<std::int32_t>()[2 * t + 1] = static_cast<std::int32_t>(t % 2);  // ... experts 2, 4, 5 get none
    wts.data_as<float>()[2 * t] = 0.75f;
    wts.data_as<float>()[2 * t + 1] = 0.25f;
  }
  Tensor y({T, D}, DType::f32);
  run_experts(w, body, x, ids, wts, false, y);
  expect_close(y, testing::dense_moe(w, body, x.data_as<float>(), T, ids.data_as<std::int32_t>(), wts.data_as<float>(), 2, false), 2e-5);
  const DispatchPlan p = plan_dispatch(ids, E);
  EXPECT_EQ(p.counts, (std::vector<std::int64_t>{25, 25, 0, 50, 0, 0}));
}

TEST(GroupedExperts, RowCountsAbove32768) {
  // 33000 rows on one expert plus a tail on another: sorted-gather kernels elsewhere have
  // corrupted rows past 32768 that are not a tile multiple.
  std::mt19937 rng(6);
  const std::int64_t T = 33001, D = 9, F = 5, E = 3;
  const ExpertBody body{};
  const ExpertWeights w = make_experts(E, D, F, BodyKind::swiglu, DType::f32, false, false, rng);
  Tensor x = randn({T, D}, rng, 1.0f);
  Tensor ids({T, 1}, DType::i32), wts({T, 1}, DType::f32);
  for (std::int64_t t = 0; t < T; ++t) {
    ids.data_as<std::int32_t>()[t] = t < 33000 ? 1 : 2;
    wts.data_as<float>()[t] = 1.0f;
  }
  Tensor y({T, D}, DType::f32);
  run_experts(w, body, x, ids, wts, false, y);
  expect_close(y, testing::dense_moe(w, body, x.data_as<float>(), T, ids.data_as<std::int32_t>(), wts.data_as<float>(), 1, false), 2e-5);
}

TEST(GroupedExperts, OneExpertLayerIsAPlainMlp) {
  std::mt19937 rng(8);
  const std::int64_t T = 17, D = 20, F = 30;
  const ExpertBody body{};
  const ExpertWeights w = make_experts(1, D, F, BodyKind::swiglu, DType::f32, false, false, rng);
  Tensor x = randn({T, D}, rng, 1.0f);
  Tensor ids({T, 1}, DType::i32), wts({T, 1}, DType::f32);
  for (std::int64_t t = 0; t < T; ++t) wts.data_as<float>()[t] = 1.0f;
  Tensor y({T, D}, DType::f32), mlp({T, D}, DType::f32);
  run_experts(w, body, x, ids, wts, false, y);
  run_dense_ffn(w, body, x, mlp, false);
  // Same fixed-order dots on the same rows: bit-identical.
  EXPECT_EQ(std::memcmp(y.data(), mlp.data(), y.nbytes()), 0);
}

TEST(GroupedExperts, PermutingTokensPermutesOutputs) {
  std::mt19937 rng(9);
  const std::int64_t T = 40, K = 3, E = 7, D = 16, F = 8;
  const ExpertBody body{};
  const ExpertWeights w = make_experts(E, D, F, BodyKind::swiglu, DType::bf16, true, false, rng);
  Tensor x = randn({T, D}, rng, 1.0f), ids, wts;
  make_routing(T, K, E, rng, ids, wts);
  std::vector<std::int64_t> perm(T);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Tensor xp({T, D}, DType::f32), idp({T, K}, DType::i32), wp({T, K}, DType::f32);
  for (std::int64_t t = 0; t < T; ++t) {
    std::memcpy(xp.data_as<float>() + t * D, x.data_as<float>() + perm[t] * D, D * 4);
    std::memcpy(idp.data_as<std::int32_t>() + t * K, ids.data_as<std::int32_t>() + perm[t] * K, K * 4);
    std::memcpy(wp.data_as<float>() + t * K, wts.data_as<float>() + perm[t] * K, K * 4);
  }
  Tensor y({T, D}, DType::f32), yp({T, D}, DType::f32);
  run_experts(w, body, x, ids, wts, false, y);
  run_experts(w, body, xp, idp, wp, false, yp);
  for (std::int64_t t = 0; t < T; ++t)
    EXPECT_EQ(std::memcmp(yp.data_as<float>() + t * D, y.data_as<float>() + perm[t] * D, D * 4), 0) << t;
}

class GroupedLayouts : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(RowsAndPanels, GroupedLayouts, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "panels" : "rows"; });

TEST_P(GroupedLayouts, ThreadCountDoesNotChangeABit) {
  std::mt19937 rng(10);
  const std::int64_t T = 300, K = 4, E = 8, D = 40, F = 24;
  const ExpertBody body{};
  ExpertWeights w = make_experts(E, D, F, BodyKind::swiglu, DType::f32, false, false, rng);
  if (GetParam()) pack_panels(w);
  Tensor x = randn({T, D}, rng, 1.0f), ids, wts;
  make_routing(T, K, E, rng, ids, wts);
  const int saved = num_threads();
  Tensor y1({T, D}, DType::f32), y2({T, D}, DType::f32), y3({T, D}, DType::f32);
  set_num_threads(1);
  run_experts(w, body, x, ids, wts, false, y1);
  set_num_threads(2);
  run_experts(w, body, x, ids, wts, false, y2);
  set_num_threads(3);
  run_experts(w, body, x, ids, wts, false, y3);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.nbytes()), 0);
}

// A token's output does not depend on which other tokens share the batch (or its experts):
// both kernels compute each element the same way for any number of rows.
TEST_P(GroupedLayouts, BatchCompositionDoesNotChangeABit) {
  std::mt19937 rng(12);
  const std::int64_t T = 70, K = 2, E = 4, D = 48, F = 40;
  const ExpertBody body{};
  ExpertWeights w = make_experts(E, D, F, BodyKind::swiglu, DType::bf16, false, false, rng);
  if (GetParam()) pack_panels(w);
  Tensor x = randn({T, D}, rng, 1.0f), ids, wts;
  make_routing(T, K, E, rng, ids, wts);
  Tensor y({T, D}, DType::f32);
  run_experts(w, body, x, ids, wts, false, y);
  for (std::int64_t t : {0, 33, 69}) {
    Tensor y1({1, D}, DType::f32);
    run_experts(w, body, TensorView(x.data_as<float>() + t * D, {1, D}, DType::f32),
                TensorView(ids.data_as<std::int32_t>() + t * K, {1, K}, DType::i32),
                TensorView(wts.data_as<float>() + t * K, {1, K}, DType::f32), false, y1);
    EXPECT_EQ(std::memcmp(y1.data(), y.data_as<float>() + t * D, static_cast<std::size_t>(D) * 4), 0) << "token " << t;
  }
}

TEST(DispatchPlan, StableCountingSortAndInverse) {
  std::mt19937 rng(11);
  Tensor ids, wts;
  make_routing(100, 3, 9, rng, ids, wts);
  const DispatchPlan p = plan_dispatch(ids, 9);
  EXPECT_EQ(p.offsets.back(), 300);
  EXPECT_EQ(std::accumulate(p.counts.begin(), p.counts.end(), std::int64_t{0}), 300);
  for (std::int64_t e = 0; e < 9; ++e) {
    for (std::int64_t i = p.offsets[e]; i < p.offsets[e + 1]; ++i) {
      EXPECT_EQ(ids.data_as<std::int32_t>()[p.sorted_pairs[i]], e);
      if (i > p.offsets[e]) {
        EXPECT_LT(p.sorted_pairs[i - 1], p.sorted_pairs[i]) << "stable";
      }
    }
  }
  // permute -> unpermute is the identity
  for (std::int64_t i = 0; i < 300; ++i) EXPECT_EQ(p.sorted_pairs[p.inverse[i]], i);
}

TEST(DispatchPlan, Errors) {
  Tensor ids = Tensor::from_i32({2, 2}, {0, 1, 2, 5});
  try {
    plan_dispatch(ids, 4);
    ADD_FAILURE();
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 5 at token 1, slot 1"), std::string::npos) << e.what();
  }
  Tensor f({2, 2}, DType::f32);
  EXPECT_THROW(plan_dispatch(f, 4), std::invalid_argument);
}

TEST(GroupedExperts, ValidationErrors) {
  std::mt19937 rng(12);
  const ExpertBody body{};
  ExpertWeights w = make_experts(4, 8, 6, BodyKind::swiglu, DType::f32, false, false, rng);
  Tensor x = randn({3, 8}, rng, 1.0f), ids, wts;
  make_routing(3, 2, 4, rng, ids, wts);
  Tensor y({3, 8}, DType::f32);
  Tensor x_bad = randn({3, 9}, rng, 1.0f);
  EXPECT_THROW(run_experts(w, body, x_bad, ids, wts, false, y), std::invalid_argument);
  Tensor w_bad({3, 3}, DType::f32);
  EXPECT_THROW(run_experts(w, body, x, ids, w_bad, false, y), std::invalid_argument);
  ExpertWeights no_gate = w;
  no_gate.gate = ExpertMatrix{};
  EXPECT_THROW(run_experts(no_gate, body, x, ids, wts, false, y), std::invalid_argument);
  ExpertWeights short_up = w;
  short_up.up.experts.pop_back();
  EXPECT_THROW(run_experts(short_up, body, x, ids, wts, false, y), std::invalid_argument);
  ExpertWeights bad_bias = w;
  bad_bias.down_bias = Tensor({4, 7}, DType::f32);
  EXPECT_THROW(run_experts(bad_bias, body, x, ids, wts, false, y), std::invalid_argument);
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// A batch whose expert outputs exceed the kept per-thread workspace (64 MB) takes the
// temporary-buffer path; its rows equal those of the same tokens run in two smaller halves.
TEST(GroupedExperts, LargeBatchEqualsTwoHalves) {
  std::mt19937 rng(21);
  const std::int64_t T = 2100, K = 8, E = 8, D = 1024, F = 4;  // T*K*D = 17.2M floats = 69 MB
  const ExpertBody body{};
  const ExpertWeights w = make_experts(E, D, F, BodyKind::swiglu, DType::bf16, false, false, rng);
  Tensor x = randn({T, D}, rng, 1.0f), ids, wts;
  make_routing(T, K, E, rng, ids, wts);
  Tensor y({T, D}, DType::f32), halves({T, D}, DType::f32);
  run_experts(w, body, x, ids, wts, false, y);
  const std::int64_t h = T / 2;
  run_experts(w, body, x.view().slice_rows(0, h), ids.view().slice_rows(0, h), wts.view().slice_rows(0, h), false,
              halves.view().slice_rows(0, h));
  run_experts(w, body, x.view().slice_rows(h, T), ids.view().slice_rows(h, T), wts.view().slice_rows(h, T), false,
              halves.view().slice_rows(h, T));
  EXPECT_EQ(std::memcmp(y.data(), halves.data(), y.nbytes()), 0);
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// Fewer tasks than threads (decode, K = 1) takes the column-split path; it must give the same
// bits as the one-thread run.
TEST(GroupedExperts, FewTasksSplitPathIsBitIdentical) {
  std::mt19937 rng(22);
  const std::int64_t T = 1, K = 1, E = 4, D = 96, F = 200;
  const ExpertBody body{BodyKind::swiglu_clamped, 7.0f, 1.702f};
  const ExpertWeights w = make_experts(E, D, F, body.kind, DType::bf16, true, true, rng);
  Tensor x = randn({T, D}, rng, 1.0f), ids, wts;
  make_routing(T, K, E, rng, ids, wts);
  const int saved = num_threads();
  Tensor y1({T, D}, DType::f32), y3({T, D}, DType::f32);
  set_num_threads(1);
  run_experts(w, body, x, ids, wts, true, y1);
  set_num_threads(3);
  run_experts(w, body, x, ids, wts, true, y3);
  set_num_threads(saved);
  EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.nbytes()), 0);
  expect_close(y3, testing::dense_moe(w, body, x.data_as<float>(), T, ids.data_as<std::int32_t>(), wts.data_as<float>(), K, true), 2e-5);
}

}  // namespace
}  // namespace moekit
