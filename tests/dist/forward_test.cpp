// Expert-parallel forward against the single-process layer, bit for bit (moekit/dist.hpp).
//
// Every rank builds the same layer from the same seed and computes the single-process forward
// of all T tokens itself (the reference); then each rank passes its own slice of the tokens to
// ExpertParallelLayer::forward and compares its rows of y, the ids and the weights byte for
// byte. Families: DeepSeek-style (sigmoid + selection bias + groups, gated shared expert),
// Llama-4 (weight on the input, K = 1, shared expert), GPT-OSS (biases, clamped body), Qwen
// (softmax, no shared expert), in f32 and bf16 weights, the bf16 compute mode; placements:
// contiguous, E not divisible by the rank count, a random map, every expert on one rank; token
// slices: even, uneven, ranks with none.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "moekit/dist.hpp"
#include "moekit/layer.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/threading.hpp"
#include "moekit/train.hpp"
#include "util/random.hpp"
#include "world.hpp"

namespace moekit {
namespace {

using testing::randn;
using testing::world_rank;
using testing::world_size;

enum class Family { deepseek, llama4, gpt_oss, qwen };
const char* name(Family f) {
  switch (f) {
    case Family::deepseek: return "deepseek";
    case Family::llama4: return "llama4";
    case Family::gpt_oss: return "gpt_oss";
    case Family::qwen: return "qwen";
  }
  return "?";
}

std::shared_ptr<Tensor> weight(Shape shape, std::mt19937& rng, float scale, DType dtype) {
  Tensor t = randn(std::move(shape), rng, scale);
  return std::make_shared<Tensor>(dtype == DType::f32 ? std::move(t) : to_dtype(t, dtype));
}

ExpertWeights experts(std::int64_t E, std::int64_t D, std::int64_t F, bool biases, DType dtype, std::mt19937& rng) {
  ExpertWeights w;
  auto g = weight({E, F, D}, rng, 0.3f, dtype), u = weight({E, F, D}, rng, 0.3f, dtype),
       d = weight({E, D, F}, rng, 0.3f, dtype);
  w.gate = ExpertMatrix::stacked(*g);
  w.up = ExpertMatrix::stacked(*u);
  w.down = ExpertMatrix::stacked(*d);
  w.keep_alive = {g, u, d};
  if (biases) {
    w.gate_bias = randn({E, F}, rng, 0.2f);
    w.up_bias = randn({E, F}, rng, 0.2f);
    w.down_bias = randn({E, D}, rng, 0.2f);
  }
  return w;
}

// D = 40, F = 24, E = 10 (not a multiple of 3 or 4 ranks).
std::shared_ptr<MoeLayer> build(Family fam, DType dtype, std::uint64_t seed) {
  constexpr std::int64_t D = 40, F = 24, E = 10;
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  MoeConfig c;
  c.model_type = "test";
  c.hidden_size = D;
  c.expert_width = F;
  c.num_layers = 1;
  c.router.num_experts = E;
  c.router.top_k = 3;
  MoeWeights w;
  switch (fam) {
    case Family::deepseek:
      c.router.score_func = ScoreFunc::sigmoid;
      c.router.has_selection_bias = true;
      c.router.n_group = 5;
      c.router.topk_group = 3;
      c.router.renorm = Renorm::sum_eps;
      c.router.routed_scaling_factor = 2.5f;
      c.shared_width = 32;
      c.shared_gated = true;
      break;
    case Family::llama4:
      c.router.score_func = ScoreFunc::sigmoid_selected;
      c.router.weight_on_input = true;
      c.router.top_k = 1;
      c.shared_width = 32;
      break;
    case Family::gpt_oss:
      c.body = BodyKind::swiglu_clamped;
      c.expert_bias = true;
      c.router.has_router_bias = true;
      c.router.top_k = 4;
      break;
    case Family::qwen:
      c.router.renorm = Renorm::sum;
      break;
  }
  auto router = std::make_shared<Tensor>(randn({E, D}, rng, 0.3f));
  w.router = router->view();
  w.keep_alive.push_back(router);
  if (c.router.has_selection_bias) w.selection_bias = randn({E}, rng, 0.1f);
  if (c.router.has_router_bias) w.router_bias = randn({E}, rng, 0.1f);
  w.experts = experts(E, D, F, c.expert_bias, dtype, rng);
  if (c.shared_width > 0) w.shared = experts(1, D, c.shared_width, false, dtype, rng);
  if (c.shared_gated) {
    auto g = std::make_shared<Tensor>(randn({1, D}, rng, 0.3f));
    w.shared_gate = g->view();
    w.keep_alive.push_back(g);
  }
  return std::make_shared<MoeLayer>(c, w);
}

// The first row of each rank's slice for T tokens under `scheme`: 0 even, 1 uneven (rank r gets
// a share growing with r, the last rank the rest), 2 all tokens on the last rank.
std::vector<std::int64_t> slices(std::int64_t T, int P, int scheme) {
  std::vector<std::int64_t> first(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 0; r < P; ++r) {
    std::int64_t n = 0;
    if (scheme == 0) n = T / P + (r < T % P ? 1 : 0);
    if (scheme == 1) n = std::min<std::int64_t>(T - first[r], (r + 1) * T / (P * (P + 1) / 2));
    if (scheme == 2) n = r == P - 1 ? T : 0;
    if (r == P - 1) n = T - first[r];
    first[r + 1] = first[r] + n;
  }
  return first;
}

dist::ExpertPlacement placement(std::int64_t E, int P, int kind) {
  if (kind == 0) return dist::ExpertPlacement::contiguous(E, P);
  std::vector<int> owner(static_cast<std::size_t>(E));
  if (kind == 1) {
    std::mt19937 rng(99);  // the same map on every rank
    for (auto& o : owner) o = static_cast<int>(rng() % static_cast<unsigned>(P));
  } else {
    for (auto& o : owner) o = P - 1;  // every token's rows go to one rank
  }
  return dist::ExpertPlacement::from_owners(owner, P);
}

void expect_same_bytes(const Tensor& got, const void* want, std::size_t bytes, const char* what) {
  ASSERT_EQ(got.nbytes(), bytes) << what;
  EXPECT_EQ(std::memcmp(got.data(), want, bytes), 0) << what << " differs from the single-process layer";
}

struct Case {
  Family family;
  DType dtype;
  bool bf16_mode;
  int placement_kind;
  int slice_scheme;
  std::int64_t T;
};

void run_case(const Case& c) {
  const int P = world_size(), rank = world_rank();
  auto layer = build(c.family, c.dtype, 7);
  if (c.bf16_mode) layer->set_bf16_activations(true);
  std::mt19937 rng(1234);
  const std::int64_t D = layer->config().hidden_size, K = layer->config().router.top_k;
  const Tensor x = randn({c.T, D}, rng, 1.0f);
  ForwardInfo ref_info;
  const Tensor y_ref = layer->forward(x, &ref_info);

  const dist::ExpertParallelLayer ep(layer, placement(layer->config().router.num_experts, P, c.placement_kind),
                                     MPI_COMM_WORLD);
  const std::vector<std::int64_t> first = slices(c.T, P, c.slice_scheme);
  const std::int64_t t0 = first[rank], n = first[rank + 1] - first[rank];
  const Tensor none({0, D}, DType::f32);
  const TensorView mine = n > 0 ? x.view().slice_rows(t0, t0 + n) : none.view();
  ForwardInfo info;
  const Tensor y = ep.forward(mine, &info);
  expect_same_bytes(y, y_ref.data_as<const float>() + t0 * D, static_cast<std::size_t>(n * D) * 4, "y");
  expect_same_bytes(info.routing.ids, ref_info.routing.ids.data_as<const std::int32_t>() + t0 * K,
                    static_cast<std::size_t>(n * K) * 4, "ids");
  expect_same_bytes(info.routing.weights, ref_info.routing.weights.data_as<const float>() + t0 * K,
                    static_cast<std::size_t>(n * K) * 4, "weights");
}

std::string describe(const Case& c) {
  return std::string(name(c.family)) + " " + dtype_name(c.dtype) + (c.bf16_mode ? " bf16-mode" : "") +
         " placement " + std::to_string(c.placement_kind) + " slices " + std::to_string(c.slice_scheme) +
         " T " + std::to_string(c.T);
}

TEST(DistForward, EqualsTheSingleProcessLayerBitForBit) {
  std::vector<Case> cases;
  for (const Family f : {Family::deepseek, Family::llama4, Family::gpt_oss, Family::qwen})
    for (int p = 0; p < 3; ++p)
      for (int s = 0; s < 3; ++s) cases.push_back({f, DType::f32, false, p, s, 37});
  cases.push_back({Family::deepseek, DType::bf16, false, 0, 1, 50});
  cases.push_back({Family::deepseek, DType::bf16, true, 1, 0, 50});
  cases.push_back({Family::gpt_oss, DType::bf16, true, 0, 2, 20});
  cases.push_back({Family::qwen, DType::f32, false, 0, 0, 1});   // decode: one token in all
  cases.push_back({Family::qwen, DType::f32, false, 1, 0, 200});  // experts with > 64 rows
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    run_case(c);
  }
}

TEST(DistForward, AnyThreadCountGivesTheSameBits) {
  const int before = num_threads();
  for (const int t : {1, 3}) {
    set_num_threads(t);
    SCOPED_TRACE(t);
    run_case({Family::deepseek, DType::f32, false, 1, 1, 45});
  }
  set_num_threads(before);
}

TEST(DistForward, ResidentExpertsAreThisRanksOnly) {
  const int P = world_size(), rank = world_rank();
  auto layer = build(Family::qwen, DType::f32, 3);
  const dist::ExpertPlacement p = dist::ExpertPlacement::contiguous(10, P);
  const dist::ExpertParallelLayer ep(layer, p, MPI_COMM_WORLD);
  const std::vector<std::int64_t> mine = p.experts_of(rank);
  ASSERT_EQ(ep.local_experts().num_experts(), static_cast<std::int64_t>(mine.size()));
  for (std::size_t i = 0; i < mine.size(); ++i)
    EXPECT_EQ(ep.local_experts().down.experts[i], layer->weights().experts.down.experts[mine[i]]);
  // Contiguous blocks of 10 over P ranks: sizes differ by at most one and cover every expert.
  std::int64_t total = 0;
  for (int r = 0; r < P; ++r) {
    const std::int64_t n = static_cast<std::int64_t>(p.experts_of(r).size());
    EXPECT_TRUE(n == 10 / P || n == 10 / P + 1);
    total += n;
  }
  EXPECT_EQ(total, 10);
}

TEST(DistPlacement, RejectsABadMap) {
  EXPECT_THROW(dist::ExpertPlacement::from_owners({0, 1, 2}, 2), std::invalid_argument);
  EXPECT_THROW(dist::ExpertPlacement::from_owners({0, -1}, 2), std::invalid_argument);
  EXPECT_THROW(dist::ExpertPlacement::contiguous(0, 2), std::invalid_argument);
  const auto p = dist::ExpertPlacement::contiguous(3, 5);  // more ranks than experts
  EXPECT_EQ(p.experts_of(4).size(), 0u);
  EXPECT_EQ(p.experts_of(0), std::vector<std::int64_t>{0});
}

// Failure on one rank reaches every rank as the same RankError, and the next collective works.
TEST(DistErrors, BadInputOnOneRankFailsEveryRankWithItsMessage) {
  const int P = world_size(), rank = world_rank();
  auto layer = build(Family::deepseek, DType::f32, 5);
  const dist::ExpertParallelLayer ep(layer, dist::ExpertPlacement::contiguous(10, P), MPI_COMM_WORLD);
  std::mt19937 rng(5);
  Tensor x = randn({6, 40}, rng, 1.0f);
  const int bad = P - 1;
  if (rank == bad) x.data_as<float>()[2 * 40 + 3] = std::nanf("");
  try {
    (void)ep.forward(x);
    ADD_FAILURE() << "no error";
  } catch (const dist::RankError& e) {
    EXPECT_EQ(e.rank(), bad);
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(bad)), std::string::npos) << e.what();
  }
  // A wrong shape on rank 0 only.
  const Tensor wrong = randn({3, rank == 0 ? 41 : 40}, rng, 1.0f);
  EXPECT_THROW((void)ep.forward(wrong), dist::RankError);
  // The layer still works afterwards, on every rank.
  const Tensor ok = randn({4, 40}, rng, 1.0f);
  const Tensor y = ep.forward(ok);
  const Tensor y_ref = layer->forward(ok);
  EXPECT_EQ(std::memcmp(y.data(), y_ref.data(), y.nbytes()), 0);
}

TEST(DistErrors, RanksThatDisagreeOnTheLayerFailTogether) {
  const int P = world_size(), rank = world_rank();
  if (P < 2) GTEST_SKIP() << "needs 2 ranks";
  // Rank 1 builds a layer of another family (other top_k): the constructor names the mismatch.
  auto layer = build(rank == 1 ? Family::gpt_oss : Family::qwen, DType::f32, 5);
  try {
    const dist::ExpertParallelLayer ep(layer, dist::ExpertPlacement::contiguous(10, P), MPI_COMM_WORLD);
    ADD_FAILURE() << "no error";
  } catch (const dist::RankError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
  }
  // A placement for the wrong rank count, on one rank.
  auto same = build(Family::qwen, DType::f32, 5);
  EXPECT_THROW(dist::ExpertParallelLayer(same, dist::ExpertPlacement::contiguous(10, rank == 0 ? P + 1 : P),
                                         MPI_COMM_WORLD),
               dist::RankError);
}

TEST(DistErrors, AgreeCarriesTheLowestFailingRanksMessage) {
  const int P = world_size(), rank = world_rank();
  std::exception_ptr err;
  if (rank % 2 == 1 || P == 1) err = std::make_exception_ptr(std::runtime_error("boom on " + std::to_string(rank)));
  try {
    dist::agree(MPI_COMM_WORLD, err);
    ADD_FAILURE() << "no error";
  } catch (const dist::RankError& e) {
    const int first = P == 1 ? 0 : 1;
    EXPECT_EQ(e.rank(), first);
    EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(first) + ": boom on " + std::to_string(first));
  }
  EXPECT_NO_THROW(dist::agree(MPI_COMM_WORLD, nullptr));
}

TEST(DistBalance, CountsSumExactlyOverTheRanks) {
  const int P = world_size(), rank = world_rank();
  std::vector<std::int64_t> mine(10);
  for (std::int64_t e = 0; e < 10; ++e) mine[e] = (rank + 1) * (e + 1) + (std::int64_t{1} << 40);
  const std::vector<std::int64_t> sum = dist::allreduce_counts(MPI_COMM_WORLD, mine);
  for (std::int64_t e = 0; e < 10; ++e)
    EXPECT_EQ(sum[e], static_cast<std::int64_t>(P) * (P + 1) / 2 * (e + 1) + P * (std::int64_t{1} << 40));
}

// --- backward -----------------------------------------------------------------------------

bool same_bits(const Tensor& a, const float* b, std::int64_t n) {
  return a.numel() == n && std::memcmp(a.data(), b, static_cast<std::size_t>(n) * sizeof(float)) == 0;
}

// Every rank holds the same bits of `t` (compared as integers: min == max over the ranks).
bool same_on_every_rank(const Tensor& t) { return testing::same_bytes_on_every_rank(t.data(), t.nbytes()); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(t.data_as<const float>()[i])));
  return m;
}

void run_backward_case(const Case& c, bool keep) {
  const int P = world_size(), rank = world_rank();
  auto layer = build(c.family, c.dtype, 9);
  std::mt19937 rng(77);
  const MoeConfig& cfg = layer->config();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts;
  const Tensor x = randn({c.T, D}, rng, 1.0f), dy = randn({c.T, D}, rng, 1.0f);
  SavedForward saved_ref;
  const Tensor y_ref = layer->forward_train(x, saved_ref, keep);
  MoeTensors g_ref;
  const Tensor dx_ref = backward(*layer, saved_ref, dy, g_ref);

  const dist::ExpertPlacement pl = placement(E, P, c.placement_kind);
  const dist::ExpertParallelLayer ep(layer, pl, MPI_COMM_WORLD);
  const std::vector<std::int64_t> first = slices(c.T, P, c.slice_scheme);
  const std::int64_t t0 = first[rank], n = first[rank + 1] - first[rank];
  const Tensor none({0, D}, DType::f32);
  const TensorView mine = n > 0 ? x.view().slice_rows(t0, t0 + n) : none.view();
  const TensorView dy_mine = n > 0 ? dy.view().slice_rows(t0, t0 + n) : none.view();
  dist::DistSavedForward saved;
  const Tensor y = ep.forward_train(mine, saved, keep);
  expect_same_bytes(y, y_ref.data_as<const float>() + t0 * D, static_cast<std::size_t>(n * D) * 4, "y (train)");
  MoeTensors g;
  const Tensor dx = ep.backward(saved, dy_mine, g);
  expect_same_bytes(dx, dx_ref.data_as<const float>() + t0 * D, static_cast<std::size_t>(n * D) * 4, "dx");
  // This rank's experts: the single-process gradients of those experts, bit for bit.
  const std::vector<std::int64_t> own = pl.experts_of(rank);
  const auto expert_member = [&](const Tensor& local, const Tensor& full, const char* name) {
    if (full.numel() == 0) return;
    const std::int64_t per = full.numel() / E;
    ASSERT_EQ(local.numel(), per * static_cast<std::int64_t>(own.size())) << name;
    for (std::size_t i = 0; i < own.size(); ++i)
      EXPECT_EQ(std::memcmp(local.data_as<const float>() + static_cast<std::int64_t>(i) * per,
                            full.data_as<const float>() + own[i] * per, static_cast<std::size_t>(per) * sizeof(float)),
                0)
          << name << " of expert " << own[i] << " differs from one process";
  };
  expert_member(g.gate, g_ref.gate, "gate");
  expert_member(g.up, g_ref.up, "up");
  expert_member(g.down, g_ref.down, "down");
  expert_member(g.gate_bias, g_ref.gate_bias, "gate_bias");
  expert_member(g.up_bias, g_ref.up_bias, "up_bias");
  expert_member(g.down_bias, g_ref.down_bias, "down_bias");
  // The batch's router and shared gradients: the same bits on every rank; one process's to fp32
  // rounding (bit for bit at one rank); the same bits when run again.
  MoeTensors again;
  dist::DistSavedForward saved2;
  (void)ep.forward_train(mine, saved2, keep);
  (void)ep.backward(saved2, dy_mine, again);
  for (const auto& [got, want, twice, name] :
       {std::tuple{&g.router, &g_ref.router, &again.router, "router"},
        std::tuple{&g.router_bias, &g_ref.router_bias, &again.router_bias, "router_bias"},
        std::tuple{&g.shared_gate_proj, &g_ref.shared_gate_proj, &again.shared_gate_proj, "shared_gate_proj"},
        std::tuple{&g.shared_up_proj, &g_ref.shared_up_proj, &again.shared_up_proj, "shared_up_proj"},
        std::tuple{&g.shared_down_proj, &g_ref.shared_down_proj, &again.shared_down_proj, "shared_down_proj"},
        std::tuple{&g.shared_gate, &g_ref.shared_gate, &again.shared_gate, "shared_gate"}}) {
    if (want->numel() == 0) continue;
    ASSERT_EQ(got->numel(), want->numel()) << name;
    EXPECT_TRUE(same_on_every_rank(*got)) << name;
    EXPECT_TRUE(same_bits(*twice, got->data_as<const float>(), got->numel())) << name << " changed between runs";
    if (P == 1) {
      EXPECT_TRUE(same_bits(*got, want->data_as<const float>(), want->numel())) << name << " at one rank";
    } else {
      double err = 0;
      for (std::int64_t i = 0; i < want->numel(); ++i)
        err = std::max(err, std::fabs(static_cast<double>(got->data_as<const float>()[i]) - want->data_as<const float>()[i]));
      EXPECT_LE(err, 1e-5 * std::max(1.0, max_abs(*want))) << name;
    }
  }
}

TEST(DistBackward, MatchesTheSingleProcessBackward) {
  std::vector<Case> cases;
  for (const Family f : {Family::deepseek, Family::llama4, Family::gpt_oss, Family::qwen})
    for (int p = 0; p < 3; ++p) cases.push_back({f, DType::f32, false, p, p, 33});
  cases.push_back({Family::deepseek, DType::bf16, false, 1, 1, 40});
  cases.push_back({Family::qwen, DType::f32, false, 0, 0, 300});  // > 256 rows per expert: several chunks
  for (const Case& c : cases)
    for (const bool keep : {true, false}) {
      SCOPED_TRACE(describe(c) + (keep ? " kept" : " recomputed"));
      run_backward_case(c, keep);
    }
}

TEST(DistBackward, BadDyOnOneRankFailsEveryRank) {
  const int P = world_size(), rank = world_rank();
  auto layer = build(Family::qwen, DType::f32, 4);
  const dist::ExpertParallelLayer ep(layer, dist::ExpertPlacement::contiguous(10, P), MPI_COMM_WORLD);
  std::mt19937 rng(8);
  const Tensor x = randn({5, 40}, rng, 1.0f);
  dist::DistSavedForward saved;
  (void)ep.forward_train(x, saved);
  Tensor dy = randn({5, 40}, rng, 1.0f);
  if (rank == 0) dy.data_as<float>()[7] = std::numeric_limits<float>::infinity();
  MoeTensors g;
  try {
    (void)ep.backward(saved, dy, g);
    ADD_FAILURE() << "no error";
  } catch (const dist::RankError& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
  // extra_dlogits of the wrong shape on the last rank only.
  (void)ep.forward_train(x, saved);
  const Tensor wrong = randn({rank == P - 1 ? 4 : 5, 10}, rng, 1.0f);
  BackwardOptions opts;
  opts.extra_dlogits = wrong.view();
  try {
    (void)ep.backward(saved, randn({5, 40}, rng, 1.0f), g, opts);
    ADD_FAILURE() << "no error";
  } catch (const dist::RankError& e) {
    EXPECT_NE(std::string(e.what()).find("extra_dlogits"), std::string::npos) << e.what();
  }
  // A saved state that was never filled, on every rank.
  EXPECT_THROW((void)ep.backward(dist::DistSavedForward{}, randn({5, 40}, rng, 1.0f), g), dist::RankError);
}

// A quantized checkpoint has no gradient: refused on every rank before any exchange.
TEST(DistBackward, QuantizedWeightsAreRefusedOnEveryRank) {
  const int P = world_size();
  auto layer = std::make_shared<MoeLayer>(
      load_moe_layer(std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/mixtral_q4_g32_f16", 1));
  const dist::ExpertParallelLayer ep(
      layer, dist::ExpertPlacement::contiguous(layer->config().router.num_experts, P), MPI_COMM_WORLD);
  const Tensor x = read_npy(std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/mixtral_q4_g32_f16/input.npy");
  dist::DistSavedForward saved;
  (void)ep.forward_train(x, saved);
  MoeTensors g;
  try {
    (void)ep.backward(saved, x, g);
    ADD_FAILURE() << "no error";
  } catch (const dist::RankError& e) {
    EXPECT_NE(std::string(e.what()).find("quantized"), std::string::npos) << e.what();
  }
}

std::vector<std::int64_t> counts_of(const Tensor& ids, std::int64_t E) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(E), 0);
  for (std::int64_t i = 0; i < ids.numel(); ++i) ++c[static_cast<std::size_t>(ids.data_as<const std::int32_t>()[i])];
  return c;
}

// Aux-loss-free balancing under expert parallelism: each rank counts its own tokens' routing,
// the counts are summed over the ranks (exact integers), and every rank updates its bias with
// them. The bias must be the same bytes on every rank and equal to the single-process bias
// (counts over all tokens), step after step, and the forwards under the moving bias stay equal.
TEST(DistBalance, EveryRankHoldsTheSingleProcessBiasStepAfterStep) {
  const int P = world_size(), rank = world_rank();
  auto layer = build(Family::deepseek, DType::f32, 11);
  auto ref = build(Family::deepseek, DType::f32, 11);
  const std::int64_t E = 10, D = 40, T = 41;
  const dist::ExpertParallelLayer ep(layer, dist::ExpertPlacement::contiguous(E, P), MPI_COMM_WORLD);
  RateSchedule rate;
  rate.rate = 0.05;
  LoadBalancer bal(E, BalanceRule::sign, rate), bal_ref(E, BalanceRule::sign, rate);
  const std::vector<std::int64_t> first = slices(T, P, 1);
  const std::int64_t t0 = first[rank], n = first[rank + 1] - first[rank];
  int moved = 0;
  for (std::int64_t step = 0; step < 6; ++step) {
    SCOPED_TRACE(step);
    std::mt19937 rng(static_cast<std::mt19937::result_type>(500 + step));
    const Tensor x = randn({T, D}, rng, 1.0f);
    ForwardInfo ref_info;
    const Tensor y_ref = ref->forward(x, &ref_info);
    const Tensor none({0, D}, DType::f32);
    ForwardInfo info;
    const Tensor y = ep.forward(n > 0 ? x.view().slice_rows(t0, t0 + n) : none.view(), &info);
    expect_same_bytes(y, y_ref.data_as<const float>() + t0 * D, static_cast<std::size_t>(n * D) * 4, "y");
    bal.add_counts(dist::allreduce_counts(MPI_COMM_WORLD, counts_of(info.routing.ids, E)));
    bal_ref.add_counts(counts_of(ref_info.routing.ids, E));
    EXPECT_EQ(bal.counts(), bal_ref.counts());
    const std::vector<float> before(layer->weights().selection_bias.data_as<const float>(),
                                    layer->weights().selection_bias.data_as<const float>() + E);
    bal.update(layer->weights().selection_bias, step);
    bal_ref.update(ref->weights().selection_bias, step);
    const Tensor& b = layer->weights().selection_bias;
    EXPECT_EQ(std::memcmp(b.data(), ref->weights().selection_bias.data(), b.nbytes()), 0) << "bias != one process";
    EXPECT_TRUE(same_on_every_rank(b)) << "the ranks hold different biases";
    moved += std::memcmp(before.data(), b.data(), b.nbytes()) != 0;
  }
  EXPECT_GT(moved, 0) << "the bias never moved: the test checked nothing";
}

}  // namespace
}  // namespace moekit
