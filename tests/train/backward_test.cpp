// The block's backward: the double reference checked by central finite differences, the fast
// backward against the reference over every score function × renorm × groups × body × biases ×
// weight-on-input × shared gate, and the contracts (sparsity, determinism, errors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "moekit/threading.hpp"
#include "moekit/train.hpp"
#include "train/reference_backward.hpp"
#include "util/compare.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

using testing::RefBlock;
using testing::RefParams;
using testing::Vec;

struct Case {
  std::string name;
  ScoreFunc score = ScoreFunc::softmax;
  Renorm renorm = Renorm::none;
  bool groups = false;          // DeepSeek-V3 style: 4 groups, keep 2, top2_sum
  float rsf = 1.0f;
  BodyKind body = BodyKind::swiglu;
  bool biases = false;          // router bias + expert biases (GPT-OSS)
  bool woi = false;             // weight on the expert input (Llama-4)
  int shared = 0;               // 0 none, 1 plain, 2 gated (Qwen2-MoE)
  bool selection_bias = false;  // e_score_correction_bias present
  std::int64_t K = 3;
  WeightsFrom from = WeightsFrom::scores;
  bool scale_only_without_renorm = false;
  double renorm_eps = 1e-20;
};

// The matrix: every score function, renorm, groups, body, biases, weight-on-input and shared
// gate appears, in the combinations the families use and some they do not.
std::vector<Case> cases() {
  std::vector<Case> v;
  const auto add = [&](Case c) { v.push_back(std::move(c)); };
  add({"softmax_plain"});
  add({"softmax_renorm", ScoreFunc::softmax, Renorm::sum});
  add({"softmax_groups_max_rsf", ScoreFunc::softmax, Renorm::none, true, 16.0f, BodyKind::swiglu, false, false, 2});
  add({"sigmoid_plain", ScoreFunc::sigmoid});
  add({"sigmoid_renorm_groups_rsf_bias", ScoreFunc::sigmoid, Renorm::sum_eps, true, 2.5f, BodyKind::swiglu, false, false,
       1, true});
  add({"sigmoid_renorm_weights_biased", ScoreFunc::sigmoid, Renorm::sum_eps, false, 1.0f, BodyKind::swiglu, false, false,
       0, true, 3, WeightsFrom::selection_scores});
  add({"sigmoid_scale_only_without_renorm", ScoreFunc::sigmoid, Renorm::sum, false, 2.0f, BodyKind::swiglu, false,
       false, 0, false, 3, WeightsFrom::scores, true});
  add({"sqrt_softplus_renorm", ScoreFunc::sqrt_softplus, Renorm::sum, false, 1.5f});
  add({"softmax_selected_biases_clamped", ScoreFunc::softmax_selected, Renorm::none, false, 1.0f,
       BodyKind::swiglu_clamped, true});
  add({"sigmoid_selected_woi_k1_shared", ScoreFunc::sigmoid_selected, Renorm::none, false, 1.0f, BodyKind::swiglu, false,
       true, 1, false, 1});
  add({"sigmoid_selected_woi_k2", ScoreFunc::sigmoid_selected, Renorm::none, false, 1.0f, BodyKind::swiglu, false, true,
       0, false, 2});
  add({"softmax_gated_shared", ScoreFunc::softmax, Renorm::none, false, 1.0f, BodyKind::swiglu, false, false, 2});
  add({"geglu_biases", ScoreFunc::softmax, Renorm::sum, false, 1.0f, BodyKind::geglu, true});
  add({"geglu_tanh_shared", ScoreFunc::sigmoid, Renorm::sum_eps, false, 1.0f, BodyKind::geglu_tanh, false, false, 1});
  add({"mlp_relu_biases", ScoreFunc::softmax, Renorm::none, false, 1.0f, BodyKind::mlp_relu, true});
  add({"mlp_relu2", ScoreFunc::sigmoid, Renorm::sum, false, 1.0f, BodyKind::mlp_relu2});
  add({"mlp_silu_gated_shared", ScoreFunc::softmax, Renorm::sum, false, 1.0f, BodyKind::mlp_silu, false, false, 2});
  add({"clamped_woi_biases", ScoreFunc::sigmoid_selected, Renorm::none, false, 1.0f, BodyKind::swiglu_clamped, true,
       true, 0, false, 2});
  add({"softmax_k1", ScoreFunc::softmax, Renorm::none, false, 1.0f, BodyKind::swiglu, false, false, 0, false, 1});
  // llama.cpp's clamped renormalisation (GGUF): above the floor, and always below it.
  add({"sigmoid_floor_renorm_groups_rsf_bias", ScoreFunc::sigmoid, Renorm::sum_floor, true, 2.5f, BodyKind::swiglu,
       false, false, 0, true, 3, WeightsFrom::scores, false, 6.103515625e-5});
  add({"softmax_floored_renorm", ScoreFunc::softmax, Renorm::sum_floor, false, 1.0f, BodyKind::swiglu, false, false, 0,
       false, 3, WeightsFrom::scores, false, 10.0});
  return v;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr std::int64_t kD = 12, kF = 8, kE = 8, kT = 20, kS = 6;

MoeConfig config_of(const Case& c) {
  MoeConfig m;
  m.model_type = "test";
  m.hidden_size = kD;
  m.expert_width = kF;
  m.body = c.body;
  m.expert_bias = c.biases;
  m.swiglu_limit = 0.6f;  // small, so that some pre-activations are clamped
  m.swiglu_alpha = 1.702f;
  m.shared_width = c.shared ? kS : 0;
  m.shared_gated = c.shared == 2;
  m.num_layers = 1;
  RouterConfig& r = m.router;
  r.num_experts = kE;
  r.top_k = c.K;
  r.score_func = c.score;
  r.renorm = c.renorm;
  r.routed_scaling_factor = c.rsf;
  r.has_router_bias = c.biases;
  r.has_selection_bias = c.selection_bias;
  r.weight_on_input = c.woi;
  r.weights_from = c.from;
  r.scale_only_without_renorm = c.scale_only_without_renorm;
  r.renorm_eps = c.renorm_eps;
  if (c.groups) {
    r.group_mode = c.score == ScoreFunc::softmax ? GroupMode::max : GroupMode::top2_sum;
    r.n_group = 4;
    r.topk_group = 2;
  }
  return m;
}

void fill(Tensor& t, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
}

struct Built {
  MoeConfig config;
  MoeTensors params;
  Tensor selection_bias;
  MoeLayer layer;
  Tensor x, dy;
};

Built build(const Case& c, std::uint64_t seed = 7, std::int64_t T = kT) {
  MoeConfig cfg = config_of(c);
  MoeTensors p = init_parameters(cfg, seed);
  std::mt19937 rng(static_cast<unsigned>(seed));
  // Non-zero biases, and weights large enough that the bodies leave their linear regime.
  for (Tensor* b : {&p.router_bias, &p.gate_bias, &p.up_bias, &p.down_bias})
    if (b->numel() > 0) fill(*b, rng, 0.3f);
  Tensor sb;
  if (cfg.router.has_selection_bias) {
    sb = Tensor({kE}, DType::f32);
    std::uniform_real_distribution<float> u(0.0f, 0.2f);
    for (std::int64_t e = 0; e < kE; ++e) sb.data_as<float>()[e] = u(rng);
  }
  MoeLayer layer = make_trainable_layer(cfg, p, sb);
  Tensor x = testing::randn({T, kD}, rng, 1.0f);
  Tensor dy = testing::randn({T, kD}, rng, 1.0f);
  return Built{cfg, p, sb, std::move(layer), x, dy};
}

RefBlock reference_of(const Built& b, const SavedForward& saved) {
  RefBlock r;
  r.c = b.config;
  const std::int64_t T = saved.x.dim(0), K = b.config.router.top_k;
  r.ids.assign(saved.routing.ids.data_as<const std::int32_t>(), saved.routing.ids.data_as<const std::int32_t>() + T * K);
  const RouterConfig& rc = b.config.router;
  const bool renorm = rc.renorm != Renorm::none && !(rc.renorm_only_if_k_gt_1 && K == 1);
  r.renorm_taken.assign(static_cast<std::size_t>(T), renorm ? 1 : 0);
  r.selection_bias = b.selection_bias.numel() > 0 ? b.selection_bias.data_as<const float>() : nullptr;
  return r;
}

Vec to_vec(const Tensor& t) { return RefParams::of(t); }

// The members of MoeTensors and RefParams, side by side.
std::vector<std::pair<std::string, std::pair<const Tensor*, const Vec*>>> pairs(const MoeTensors& g,
                                                                                const RefParams& r) {
  return {{"router", {&g.router, &r.router}},
          {"router_bias", {&g.router_bias, &r.router_bias}},
          {"gate", {&g.gate, &r.gate}},
          {"up", {&g.up, &r.up}},
          {"down", {&g.down, &r.down}},
          {"gate_bias", {&g.gate_bias, &r.gate_bias}},
          {"up_bias", {&g.up_bias, &r.up_bias}},
          {"down_bias", {&g.down_bias, &r.down_bias}},
          {"shared_gate_proj", {&g.shared_gate_proj, &r.sg}},
          {"shared_up_proj", {&g.shared_up_proj, &r.su}},
          {"shared_down_proj", {&g.shared_down_proj, &r.sd}},
          {"shared_gate", {&g.shared_gate, &r.shared_gate}}};
}

// Every member of a MoeTensors (empty ones included), in a fixed order.
std::vector<std::pair<std::string, const Tensor*>> members(const MoeTensors& g) {
  std::vector<std::pair<std::string, const Tensor*>> out;
  const RefParams none;
  for (const auto& [name, pr] : pairs(g, none)) out.emplace_back(name, pr.first);
  return out;
}

class Backward : public ::testing::TestWithParam<Case> {};

// The reference's analytic gradients equal central differences of its own forward (double,
// selection frozen), for sampled elements of every parameter and of x.
TEST_P(Backward, ReferenceMatchesFiniteDifferences) {
  const Built b = build(GetParam());
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  const RefBlock ref = reference_of(b, saved);
  RefParams P = RefParams::from(b.params);
  const Vec x = to_vec(b.x), dy = to_vec(b.dy);
  RefParams G;
  Vec dx;
  ref.run(P, x, dy, &G, &dx);
  std::mt19937 rng(11);
  const double h = 1e-5;
  const auto check = [&](Vec& v, const Vec& grad, const std::string& what) {
    if (v.empty()) return;
    std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
    double scale = 0;
    for (double gi : grad) scale = std::max(scale, std::fabs(gi));
    for (int n = 0; n < 12; ++n) {
      const std::size_t i = pick(rng);
      const double keep = v[i];
      v[i] = keep + h;
      const double lp = ref.run(P, x, dy, nullptr, nullptr);
      v[i] = keep - h;
      const double lm = ref.run(P, x, dy, nullptr, nullptr);
      v[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(grad[i], fd, 1e-6 * std::max(1.0, scale)) << what << "[" << i << "]";
    }
  };
  const std::vector<Vec*> ps = P.all();
  const std::vector<Vec*> gs = G.all();
  const char* names[] = {"router", "router_bias", "gate", "up", "down", "gate_bias", "up_bias", "down_bias",
                         "shared.gate_proj", "shared.up_proj", "shared.down_proj", "shared_gate"};
  for (std::size_t i = 0; i < ps.size(); ++i) check(*ps[i], *gs[i], names[i]);
  // x: perturbing it moves the router's logits too (the selection stays frozen).
  Vec xv = x;
  std::uniform_int_distribution<std::size_t> pick(0, xv.size() - 1);
  for (int n = 0; n < 12; ++n) {
    const std::size_t i = pick(rng);
    const double keep = xv[i];
    xv[i] = keep + h;
    const double lp = ref.run(P, xv, dy, nullptr, nullptr);
    xv[i] = keep - h;
    const double lm = ref.run(P, xv, dy, nullptr, nullptr);
    xv[i] = keep;
    EXPECT_NEAR(dx[i], (lp - lm) / (2 * h), 1e-6 * 10) << "x[" << i << "]";
  }
}

// Error budget of the fp32 backward against the double reference, per tensor, as
// max|fast − ref| ≤ budget · max|ref|. Derivation: every gradient element is at most three
// chained fp32 reductions (dy·Wd, then the body's derivative, then Σ over rows or over F/D) of
// length n ≤ max(D, F, T·K) = 60 here, with u = 2^-24 and Σ|terms| of these random tensors
// within ~10·max|result|. Worst case (n·u per reduction): 3 · 60 · 6e-8 · 10 ≈ 1e-4; rounding
// errors of random sign grow as √n·u: 3 · √60 · 6e-8 · 10 ≈ 1.4e-5, the budget below. Observed:
// ≤ 3e-7 over the whole matrix. One line of the table serves every tensor:
constexpr double kBudgetGrad = 2e-5;  // weights, biases, router, shared, x

// The fast backward of case c over T tokens against the double-precision reference.
void expect_matches_reference(const Case& c, std::int64_t T) {
  const Built b = build(c, 7, T);
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  MoeTensors grads;
  const Tensor dx = backward(b.layer, saved, b.dy, grads);
  const RefBlock ref = reference_of(b, saved);
  RefParams G;
  Vec rdx;
  ref.run(RefParams::from(b.params), to_vec(b.x), to_vec(b.dy), &G, &rdx);
  for (const auto& [name, pr] : pairs(grads, G)) {
    const Tensor& fast = *pr.first;
    const Vec& slow = *pr.second;
    ASSERT_EQ(static_cast<std::size_t>(fast.numel()), slow.size()) << name;
    double err = 0, mx = 0;
    for (std::size_t i = 0; i < slow.size(); ++i) {
      err = std::max(err, std::fabs(fast.data_as<const float>()[i] - slow[i]));
      mx = std::max(mx, std::fabs(slow[i]));
    }
    EXPECT_LE(err, kBudgetGrad * mx) << name << ": max err " << err << " of max " << mx;
  }
  double err = 0, mx = 0;
  for (std::size_t i = 0; i < rdx.size(); ++i) {
    err = std::max(err, std::fabs(dx.data_as<const float>()[i] - rdx[i]));
    mx = std::max(mx, std::fabs(rdx[i]));
  }
  EXPECT_LE(err, kBudgetGrad * mx) << "dx: max err " << err << " of max " << mx;
}

TEST_P(Backward, FastMatchesReference) { expect_matches_reference(GetParam(), kT); }

// More tokens than one chunk of the backward (256 rows): every chunk of the shared expert reads
// its own rows of dy (a chunk once read dy from row 0: the shared experts' gradients and dx were
// wrong past 256 tokens per call; the expert-parallel LM's test found it).
class BackwardShared : public Backward {};

TEST_P(BackwardShared, ManyTokensMatchReference) { expect_matches_reference(GetParam(), 600); }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// 1 and 2 threads, kept or recomputed pre-activations: the same bits. forward_train's y is
// forward()'s y.
TEST_P(Backward, DeterministicAcrossThreadsAndSavePolicies) {
  const Built b = build(GetParam(), 9, 300);  // enough rows for several chunks per expert
  const int threads = num_threads();
  std::vector<Tensor> dxs;
  std::vector<MoeTensors> gs;
  for (int t : {1, 2}) {
    for (bool keep : {true, false}) {
      set_num_threads(t);
      SavedForward saved;
      const Tensor y = b.layer.forward_train(b.x, saved, keep);
      EXPECT_TRUE(same_bits(y, b.layer.forward(b.x)));
      EXPECT_EQ(saved.routed.pre_up.numel() > 0, keep);
      MoeTensors g;
      dxs.push_back(backward(b.layer, saved, b.dy, g));
      gs.push_back(g);
    }
  }
  set_num_threads(threads);
  for (std::size_t i = 1; i < dxs.size(); ++i) {
    EXPECT_TRUE(same_bits(dxs[0], dxs[i])) << "run " << i;
    const auto a = members(gs[0]), c = members(gs[i]);
    for (std::size_t j = 0; j < a.size(); ++j) EXPECT_TRUE(same_bits(*a[j].second, *c[j].second)) << a[j].first;
  }
}

// experts_backward (the routed experts alone, on a routing the caller made: frameworks' experts
// backends): its weight gradients are the block backward's, bit for bit; dL/dweights and dL/dx are
// the derivatives of Σ dy · run_experts(...) (central differences).
TEST_P(Backward, ExpertsBackwardIsTheBlocksRoutedPart) {
  const Case& c = GetParam();
  const Built b = build(c, 13);
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  MoeTensors block;
  backward(b.layer, saved, b.dy, block);

  const ExpertWeights& w = b.layer.weights().experts;
  const ExpertBody body = b.layer.body();
  const bool woi = b.config.router.weight_on_input;
  const TensorView ids = saved.routing.ids.view(), weights = saved.routing.weights.view();
  MoeTensors g;
  Tensor dweights;
  const Tensor dx =
      experts_backward(w, body, saved.x.view(), ids, weights, woi, saved.routed, b.dy.view(), g, dweights);
  for (const auto& [name, mine, theirs] :
       {std::tuple{"gate", &g.gate, &block.gate}, std::tuple{"up", &g.up, &block.up},
        std::tuple{"down", &g.down, &block.down}, std::tuple{"gate_bias", &g.gate_bias, &block.gate_bias},
        std::tuple{"up_bias", &g.up_bias, &block.up_bias}, std::tuple{"down_bias", &g.down_bias, &block.down_bias}})
    EXPECT_TRUE(same_bits(*mine, *theirs)) << name;
  EXPECT_EQ(g.router.numel(), 0);  // the router is the caller's
  if (w.gate.defined()) {
    // The fused gate‖up gradient (transformers' gate_up_proj): each expert's gate rows, then its up rows.
    MoeTensors f;
    Tensor dw2;
    ExpertGradOptions fuse;
    fuse.fuse_gate_up = true;
    const Tensor dx2 =
        experts_backward(w, body, saved.x.view(), ids, weights, woi, saved.routed, b.dy.view(), f, dw2, fuse);
    EXPECT_TRUE(same_bits(dx2, dx));
    EXPECT_EQ(f.up.numel(), 0);
    ASSERT_EQ(f.gate.shape(), (Shape{kE, 2 * kF, kD}));
    for (std::int64_t e = 0; e < kE; ++e) {
      const float* fe = f.gate.data_as<const float>() + e * 2 * kF * kD;
      EXPECT_EQ(std::memcmp(fe, g.gate.data_as<const float>() + e * kF * kD, kF * kD * 4), 0) << e;
      EXPECT_EQ(std::memcmp(fe + kF * kD, g.up.data_as<const float>() + e * kF * kD, kF * kD * 4), 0) << e;
      if (g.gate_bias.numel() > 0) {
        const float* be = f.gate_bias.data_as<const float>() + e * 2 * kF;
        EXPECT_EQ(std::memcmp(be, g.gate_bias.data_as<const float>() + e * kF, kF * 4), 0) << e;
        EXPECT_EQ(std::memcmp(be + kF, g.up_bias.data_as<const float>() + e * kF, kF * 4), 0) << e;
      }
    }
  }

  const std::int64_t T = b.x.dim(0), K = b.config.router.top_k;
  const auto loss = [&](const Tensor& x, const Tensor& wts) {
    Tensor y({T, kD}, DType::f32);
    run_experts(w, body, x.view(), ids, wts.view(), woi, y.view());
    double l = 0;
    for (std::int64_t i = 0; i < T * kD; ++i) l += double(y.data_as<float>()[i]) * b.dy.data_as<float>()[i];
    return l;
  };
  const double h = 1e-2;
  for (std::int64_t i : {std::int64_t{0}, T * K / 2, T * K - 1}) {
    Tensor wp = saved.routing.weights.clone(), wm = saved.routing.weights.clone();
    wp.data_as<float>()[i] += float(h);
    wm.data_as<float>()[i] -= float(h);
    const double fd = (loss(saved.x, wp) - loss(saved.x, wm)) / (2 * h);
    EXPECT_NEAR(dweights.data_as<float>()[i], fd, 2e-3 * (1 + std::abs(fd))) << "dweights[" << i << "]";
  }
  for (std::int64_t i : {std::int64_t{3}, T * kD / 2 + 1, T * kD - 2}) {
    Tensor xp = saved.x.clone(), xm = saved.x.clone();
    xp.data_as<float>()[i] += float(h);
    xm.data_as<float>()[i] -= float(h);
    const double fd = (loss(xp, saved.routing.weights) - loss(xm, saved.routing.weights)) / (2 * h);
    EXPECT_NEAR(dx.data_as<float>()[i], fd, 5e-3 * (1 + std::abs(fd))) << "dx[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, Backward, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The cases with shared experts (the routed experts gather dy by token in any case).
std::vector<Case> shared_cases() {
  std::vector<Case> out;
  for (const Case& c : cases())
    if (c.shared) out.push_back(c);
  return out;
}
INSTANTIATE_TEST_SUITE_P(Matrix, BackwardShared, ::testing::ValuesIn(shared_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Experts that got no rows get exactly zero; accumulate adds (two equal micro-batches = 2×).
TEST(BackwardSparse, IdleExpertsZeroAndAccumulateAdds) {
  Case c;
  c.K = 1;
  Built b = build(c, 3, 3);  // 3 tokens, 8 experts: at least 5 idle
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  MoeTensors g = MoeTensors::zeros_like(b.layer);
  std::fill(g.up.data_as<float>(), g.up.data_as<float>() + g.up.numel(), 5.0f);  // stale values
  backward(b.layer, saved, b.dy, g);
  int idle = 0;
  for (std::int64_t e = 0; e < kE; ++e) {
    if (saved.routed.plan.counts[e] > 0) continue;
    ++idle;
    for (const Tensor* t : {&g.gate, &g.up, &g.down})
      for (std::int64_t i = 0; i < t->numel() / kE; ++i)
        ASSERT_EQ(t->data_as<const float>()[e * (t->numel() / kE) + i], 0.0f) << "expert " << e;
  }
  EXPECT_GE(idle, 5);
  MoeTensors twice;
  backward(b.layer, saved, b.dy, twice);
  BackwardOptions acc;
  acc.accumulate = true;
  backward(b.layer, saved, b.dy, twice, acc);
  const auto one = members(g), two = members(twice);
  for (std::size_t j = 0; j < one.size(); ++j) {
    const Tensor& a = *one[j].second;
    const Tensor& d = *two[j].second;
    for (std::int64_t i = 0; i < a.numel(); ++i)
      ASSERT_FLOAT_EQ(d.data_as<const float>()[i], 2.0f * a.data_as<const float>()[i]) << one[j].first;
  }
}

// A one-expert block (K = 1, softmax: weight 1) is a plain MLP: its expert gradients equal those
// of the same weights as a shared expert of a block whose routed experts get no gradient signal.
TEST(BackwardSparse, OneExpertBlockIsPlainMlp) {
  Case c;
  c.K = 1;
  MoeConfig cfg = config_of(c);
  cfg.router.num_experts = 1;
  MoeTensors p = init_parameters(cfg, 5);
  MoeLayer one = make_trainable_layer(cfg, p);
  std::mt19937 rng(1);
  const Tensor x = testing::randn({7, kD}, rng), dy = testing::randn({7, kD}, rng);
  SavedForward saved;
  one.forward_train(x, saved);
  MoeTensors g;
  const Tensor dx = backward(one, saved, dy, g);
  // The same expert in double as a dense MLP: dW = Σ_t outer products, by the reference.
  RefBlock ref;
  ref.c = cfg;
  ref.ids.assign(7, 0);
  ref.renorm_taken.assign(7, 0);
  RefParams G;
  Vec rdx;
  ref.run(RefParams::from(p), to_vec(x), to_vec(dy), &G, &rdx);
  for (std::int64_t i = 0; i < g.up.numel(); ++i) EXPECT_NEAR(g.up.data_as<const float>()[i], G.up[i], 1e-5);
  for (std::int64_t i = 0; i < g.router.numel(); ++i) EXPECT_EQ(g.router.data_as<const float>()[i], 0.0f);
  for (std::int64_t i = 0; i < dx.numel(); ++i) EXPECT_NEAR(dx.data_as<const float>()[i], rdx[i], 1e-5);
}

TEST(BackwardErrors, NamedAndGradsUntouched) {
  Case c;
  Built b = build(c);
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  MoeTensors g = MoeTensors::zeros_like(b.layer);
  const auto expect_error = [&](const TensorView& dy, const SavedForward& s, const std::string& needle) {
    try {
      backward(b.layer, s, dy, g);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(Tensor({kT, kD + 1}, DType::f32), saved, "dy must be f32 or bf16");
  Tensor nan = b.dy.clone();
  nan.data_as<float>()[5 * kD + 3] = std::nanf("");
  expect_error(nan, saved, "row 5, column 3");
  expect_error(b.dy, SavedForward(), "saved state does not belong");
  // Another layer's saved state (other D).
  for (float v : std::vector<float>(g.up.data_as<float>(), g.up.data_as<float>() + g.up.numel())) ASSERT_EQ(v, 0.0f);
  MoeTensors wrong;
  wrong.up = Tensor({1, 2}, DType::f32);
  try {
    backward(b.layer, saved, b.dy, wrong);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("grads.up must be f32 [8, 8, 12]"), std::string::npos) << e.what();
  }
}

TEST(BackwardErrors, UntrainableRoutersRefused) {
  MoeConfig cfg = config_of(Case{});
  cfg.router.top_k = 1;
  cfg.router.score_func = ScoreFunc::softmax_selected;
  EXPECT_THROW(check_trainable(cfg), std::invalid_argument);
  cfg.router.score_func = ScoreFunc::softmax;
  cfg.router.renorm = Renorm::sum;
  EXPECT_THROW(check_trainable(cfg), std::invalid_argument);
  cfg.router.renorm_only_if_k_gt_1 = true;  // mlx-lm's DeepSeek: K = 1 skips the renorm
  EXPECT_NO_THROW(check_trainable(cfg));
  cfg.router.top_k = 2;
  cfg.router.renorm_only_if_k_gt_1 = false;
  EXPECT_NO_THROW(check_trainable(cfg));
}

// The router backward alone: renormalised sigmoid weights, the closed form of docs/training.md
// dz_j = σ_j(1 − σ_j)(a_j − Σ a_i g_i)/Σσ for j ∈ S, 0 elsewhere.
TEST(RouterBackward, SigmoidRenormClosedForm) {
  RouterConfig r;
  r.num_experts = 6;
  r.top_k = 3;
  r.score_func = ScoreFunc::sigmoid;
  r.renorm = Renorm::sum;
  const Tensor z = Tensor::from_f32({1, 6}, {0.3f, -1.0f, 2.0f, 0.1f, 1.2f, -0.4f});
  const Routing rt = route(r, z);
  const Tensor dw = Tensor::from_f32({1, 3}, {0.5f, -2.0f, 1.0f});
  const Tensor dz = router_backward(r, z, rt.ids, dw);
  const auto sg = [](float v) { return 1.0 / (1.0 + std::exp(-v)); };
  double ssum = 0, ag = 0;
  for (int k = 0; k < 3; ++k) ssum += sg(z.data_as<float>()[rt.ids.data_as<std::int32_t>()[k]]);
  for (int k = 0; k < 3; ++k) ag += dw.data_as<float>()[k] * rt.weights.data_as<float>()[k];
  std::vector<double> want(6, 0.0);
  for (int k = 0; k < 3; ++k) {
    const int e = rt.ids.data_as<std::int32_t>()[k];
    const double s = sg(z.data_as<float>()[e]);
    want[e] = s * (1 - s) * (dw.data_as<float>()[k] - ag) / ssum;
  }
  for (int e = 0; e < 6; ++e) EXPECT_NEAR(dz.data_as<float>()[e], want[e], 1e-6) << e;
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// The dispatch plan the backward walks: sorted_pairs and inverse are inverse permutations
// (permute -> unpermute is the identity), rows grouped by expert in pair order, and permuting
// the combine weights to sorted order and back gives them unchanged.
TEST(BackwardSparse, PermuteThenUnpermuteIsTheIdentity) {
  const Built b = build(Case{}, 21, 37);
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  const DispatchPlan& p = saved.routed.plan;
  const std::int64_t n = p.num_tokens * p.top_k;
  ASSERT_EQ(static_cast<std::int64_t>(p.sorted_pairs.size()), n);
  const std::int32_t* ids = saved.routing.ids.data_as<const std::int32_t>();
  const float* w = saved.routing.weights.data_as<const float>();
  std::vector<float> sorted(static_cast<std::size_t>(n)), back(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.inverse[p.sorted_pairs[i]], i);
    EXPECT_EQ(p.sorted_pairs[p.inverse[i]], i);
    sorted[i] = w[p.sorted_pairs[i]];
    if (i > 0) {
      const std::int32_t e0 = ids[p.sorted_pairs[i - 1]], e1 = ids[p.sorted_pairs[i]];
      EXPECT_TRUE(e0 < e1 || (e0 == e1 && p.sorted_pairs[i - 1] < p.sorted_pairs[i]));
    }
  }
  for (std::int64_t i = 0; i < n; ++i) back[i] = sorted[p.inverse[i]];
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(back[i], w[i]);
}

// experts_backward refuses what it cannot differentiate, naming it; grads stay untouched.
TEST(BackwardErrors, ExpertsBackwardNamesWhatIsWrong) {
  Case c;
  Built b = build(c, 21, 6);
  SavedForward saved;
  b.layer.forward_train(b.x, saved);
  const ExpertWeights& w = b.layer.weights().experts;
  MoeTensors g;
  Tensor dweights;
  const auto call = [&](const TensorView& x, const TensorView& dy, const ExpertTrace& trace) {
    return experts_backward(w, b.layer.body(), x, saved.routing.ids.view(), saved.routing.weights.view(), false, trace,
                            dy, g, dweights);
  };
  ExpertTrace other = saved.routed;
  other.plan.num_tokens = 5;
  EXPECT_THROW(
      {
        try {
          call(saved.x.view(), b.dy.view(), other);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("is not this forward's"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
  Tensor bad = b.dy.clone();
  bad.data_as<float>()[7] = std::nanf("");
  EXPECT_THROW(
      {
        try {
          call(saved.x.view(), bad.view(), saved.routed);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_THROW(call(b.dy.view().reshaped({3, 2 * kD}), b.dy.view(), saved.routed), std::invalid_argument);
  EXPECT_EQ(g.up.numel(), 0);  // untouched by the failed calls
}

}  // namespace
}  // namespace moekit
