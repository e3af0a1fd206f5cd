// Optimizers, clipping and schedules against their formulas in double, and a block that learns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "moekit/train.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

MoeConfig small_config() {
  MoeConfig c;
  c.model_type = "test";
  c.hidden_size = 8;
  c.expert_width = 6;
  c.num_layers = 1;
  c.router.num_experts = 4;
  c.router.top_k = 2;
  c.router.renorm = Renorm::sum;
  return c;
}

TEST(Optimizer, AdamWMatchesItsFormulaInDouble) {
  const MoeConfig cfg = small_config();
  MoeTensors p = init_parameters(cfg, 1);
  const MoeTensors p0 = trainable_parameters(make_trainable_layer(cfg, p));  // a copy
  std::mt19937 rng(4);
  MoeTensors g = MoeTensors::zeros_like(make_trainable_layer(cfg, p));
  AdamWOptions o;
  o.weight_decay = 0.1;
  Optimizer opt = Optimizer::adamw(o);
  // Reference for element 5 of experts.up (decayed) in double, over three steps.
  double ref = p0.up.data_as<float>()[5], m = 0, v = 0;
  const double lrs[] = {1e-2, 5e-3, 2e-3};
  for (int s = 0; s < 3; ++s) {
    g.for_each([&](const std::string&, const Tensor& t) {
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = std::normal_distribution<float>(0, 1)(rng);
    });
    const double gi = g.up.data_as<float>()[5];
    opt.step(p, g, lrs[s]);
    m = 0.9 * m + 0.1 * gi;
    v = 0.999 * v + 0.001 * gi * gi;
    const double mh = m / (1 - std::pow(0.9, s + 1)), vh = v / (1 - std::pow(0.999, s + 1));
    ref = ref * (1 - lrs[s] * 0.1) - lrs[s] * mh / (std::sqrt(vh) + 1e-8);
  }
  EXPECT_NEAR(p.up.data_as<float>()[5], ref, 1e-6);
  EXPECT_EQ(opt.steps(), 3);
}

TEST(Optimizer, SgdMomentumAndNoDecayOnBiases) {
  MoeConfig cfg = small_config();
  cfg.expert_bias = true;
  cfg.body = BodyKind::swiglu_clamped;
  MoeTensors p = init_parameters(cfg, 2);
  const MoeLayer layer = make_trainable_layer(cfg, p);
  MoeTensors g = MoeTensors::zeros_like(layer);
  for (std::int64_t i = 0; i < g.up_bias.numel(); ++i) g.up_bias.data_as<float>()[i] = 1.0f;
  SgdOptions o;
  o.momentum = 0.5;
  o.weight_decay = 0.3;
  Optimizer opt = Optimizer::sgd(o);
  const float w0 = p.up.data_as<float>()[0];
  opt.step(p, g, 0.1);  // bias: buf = 1, b -= 0.1; weight: g = 0.3 w
  opt.step(p, g, 0.1);  // bias: buf = 1.5, b -= 0.15
  EXPECT_FLOAT_EQ(p.up_bias.data_as<float>()[0], -0.25f);
  const float w1 = w0 - 0.1f * 0.3f * w0;
  const float buf2 = 0.5f * (0.3f * w0) + 0.3f * w1;
  EXPECT_NEAR(p.up.data_as<float>()[0], w1 - 0.1f * buf2, 1e-7);
}

TEST(Optimizer, StateRoundTripAndErrors) {
  const MoeConfig cfg = small_config();
  MoeTensors p = init_parameters(cfg, 3);
  const MoeLayer layer = make_trainable_layer(cfg, p);
  MoeTensors g = MoeTensors::zeros_like(layer);
  g.up.data_as<float>()[0] = 1.0f;
  Optimizer a = Optimizer::adamw();
  a.step(p, g, 1e-3);
  Optimizer b = Optimizer::adamw();
  b.load_state(a.state(), a.steps(), p);
  EXPECT_EQ(b.steps(), 1);
  MoeTensors pa = trainable_parameters(layer), pb = trainable_parameters(layer);
  a.step(pa, g, 1e-3);
  b.step(pb, g, 1e-3);
  EXPECT_EQ(std::memcmp(pa.up.data(), pb.up.data(), pa.up.nbytes()), 0);
  auto st = a.state();
  st.pop_back();
  EXPECT_THROW(b.load_state(st, 1, p), std::invalid_argument);
  EXPECT_THROW(Optimizer::sgd().load_state(a.state(), 1, p), std::invalid_argument);
  MoeTensors wrong = g;
  wrong.up = Tensor({1}, DType::f32);
  EXPECT_THROW(a.step(p, wrong, 1e-3), std::invalid_argument);
  EXPECT_THROW(a.step(p, g, -1), std::invalid_argument);
}

TEST(Optimizer, ClipAndSchedules) {
  const MoeConfig cfg = small_config();
  MoeTensors p = init_parameters(cfg, 4);
  MoeTensors g = MoeTensors::zeros_like(make_trainable_layer(cfg, p));
  g.up.data_as<float>()[0] = 3.0f;
  g.router.data_as<float>()[1] = 4.0f;
  EXPECT_DOUBLE_EQ(clip_grad_norm({&g}, 10.0), 5.0);  // below: unchanged
  EXPECT_EQ(g.up.data_as<float>()[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm({&g}, 1.0), 5.0);
  EXPECT_NEAR(grad_norm({&g}), 1.0, 1e-6);
  g.up.data_as<float>()[2] = std::nanf("");
  EXPECT_THROW(clip_grad_norm({&g}, 1.0), std::runtime_error);
  LrSchedule s;
  s.lr = 1.0;
  s.warmup = 10;
  s.total_steps = 110;
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  s.decay = LrSchedule::Decay::linear;
  EXPECT_NEAR(s.at(35), 1.0 - 0.9 * 0.25, 1e-12);
  s.total_steps = 5;
  EXPECT_THROW(s.validate(), std::invalid_argument);
}

// A tiny block fits a teacher block of the same shape: the loss falls by 10x with AdamW.
TEST(Optimizer, BlockLearnsATeacher) {
  const MoeConfig cfg = small_config();
  const MoeLayer teacher = make_trainable_layer(cfg, init_parameters(cfg, 100));
  MoeTensors p = init_parameters(cfg, 200);
  const MoeLayer student = make_trainable_layer(cfg, p);
  Optimizer opt = Optimizer::adamw({0.9, 0.999, 1e-8, 0.0});
  std::mt19937 rng(9);
  const Tensor x = testing::randn({64, 8}, rng);
  const Tensor target = teacher.forward(x);
  MoeTensors g;
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    SavedForward saved;
    const Tensor y = student.forward_train(x, saved);
    Tensor dy({64, 8}, DType::f32);
    double loss = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      const float d = y.data_as<float>()[i] - target.data_as<float>()[i];
      loss += 0.5 * d * d / 64;
      dy.data_as<float>()[i] = d / 64;
    }
    if (step == 0) first = loss;
    last = loss;
    backward(student, saved, dy, g);
    opt.step(p, g, 1e-2);
  }
  EXPECT_LT(last, first / 10) << first << " -> " << last;
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

TEST(Optimizer, GradScaleEqualsClippingFirst) {
  const MoeConfig cfg = small_config();
  for (const bool adam : {true, false}) {
    MoeTensors p1 = init_parameters(cfg, 3), p2 = init_parameters(cfg, 3);
    MoeTensors g1 = init_parameters(cfg, 4), g2 = init_parameters(cfg, 4);  // any values will do
    Optimizer o1 = adam ? Optimizer::adamw() : Optimizer::sgd(), o2 = o1;
    const NamedTensors n1 = named_tensors(g1), n2 = named_tensors(g2);
    const double norm = clip_grad_norm(n1, 0.5);
    o1.step(named_tensors(p1), n1, 1e-2);
    o2.step(named_tensors(p2), n2, 1e-2, clip_factor(norm, 0.5));
    ASSERT_LT(clip_factor(norm, 0.5), 1.0f);
    const NamedTensors a = named_tensors(p1), b = named_tensors(p2);
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.nbytes()), 0) << a[i].first;
  }
}

}  // namespace
}  // namespace moekit
