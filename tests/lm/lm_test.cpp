// The language model around the MoE blocks: every parameter's gradient by central finite
// differences of the loss, determinism across threads and micro-batching, a run that overfits a
// tiny text, the one list of the parameters' members, and the family presets it is built from.
#include "moekit/lm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "moekit/threading.hpp"

namespace moekit {
namespace {

LmConfig tiny_lm(const std::string& family, std::int64_t layers = 2, std::int64_t shared = -1, bool bias = false) {
  BlockShape s;
  s.hidden_size = 8;
  s.num_experts = 4;
  s.top_k = 2;
  s.expert_width = 6;
  s.shared_experts = shared;
  s.num_layers = layers;
  s.selection_bias = bias;
  LmConfig c;
  c.block = parse_hf_config(preset_config_json(family, s));
  c.vocab = 16;
  c.context = 3;
  return c;
}

std::vector<std::uint8_t> text_of(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::uint8_t> t(static_cast<std::size_t>(n));
  std::uint64_t s = seed;
  for (auto& b : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::uint8_t>((s >> 33) % static_cast<std::uint64_t>(vocab));
  }
  return t;
}

std::vector<std::int32_t> ids_of(const LmSaved& s) {
  std::vector<std::int32_t> out;
  for (const SavedForward& b : s.blocks) {
    const auto* p = b.routing.ids.data_as<const std::int32_t>();
    out.insert(out.end(), p, p + b.routing.ids.numel());
  }
  return out;
}

class LmGradient : public ::testing::TestWithParam<const char*> {};

TEST_P(LmGradient, EveryParameterMatchesFiniteDifferences) {
  const LmConfig cfg = tiny_lm(GetParam(), 2, -1, std::string(GetParam()) == "qwen3_moe");
  LmParams p = init_lm_parameters(cfg, 7);
  std::vector<Tensor> biases;
  if (cfg.block.router.has_selection_bias) {
    for (int l = 0; l < 2; ++l) biases.push_back(Tensor::from_f32({4}, {0.05f, -0.02f, 0.0f, 0.01f}));
  }
  const LanguageModel lm(cfg, p, biases);
  const auto text = text_of(64, cfg.vocab, 3);
  const LmBatch batch = make_lm_batch(text, {0, 30}, 12, cfg.context);  // 24 tokens, the first window padded
  LmSaved saved;
  lm.forward_train(batch, saved);
  const auto ids0 = ids_of(saved);
  LmParams g;
  lm.backward(saved, 1.0, g, false);  // the gradient of the summed loss
  const NamedTensors params = p.named(), grads = g.named();
  ASSERT_EQ(params.size(), grads.size());
  int checked = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& t = params[i].second;
    float* w = t.data_as<float>();
    const float* gr = grads[i].second.data_as<const float>();
    // A spread of elements of every tensor (all of the small ones).
    const std::int64_t stride = std::max<std::int64_t>(1, t.numel() / 7);
    for (std::int64_t k = 0; k < t.numel(); k += stride) {
      const float orig = w[k];
      const float h = 1e-2f * std::max(1.0f, std::fabs(orig));
      LmSaved sp, sm;
      w[k] = orig + h;
      const double lp = lm.forward_train(batch, sp) * static_cast<double>(batch.tokens);
      w[k] = orig - h;
      const double lmn = lm.forward_train(batch, sm) * static_cast<double>(batch.tokens);
      w[k] = orig;
      if (ids_of(sp) != ids0 || ids_of(sm) != ids0) continue;  // the selection moved: not differentiable here
      const double fd = (lp - lmn) / (2.0 * static_cast<double>(h));
      EXPECT_NEAR(gr[k], fd, 2e-3 + 2e-2 * std::fabs(fd)) << GetParam() << " " << params[i].first << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
}

INSTANTIATE_TEST_SUITE_P(Families, LmGradient,
                         ::testing::Values("deepseek_v3", "qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss",
                                           "llama4_text"));

TEST(Lm, DeterministicAcrossThreadsAndMicroBatches) {
  const LmConfig cfg = tiny_lm("deepseek_v3");
  const LmParams p = init_lm_parameters(cfg, 11);
  const LanguageModel lm(cfg, p);
  const auto text = text_of(400, cfg.vocab, 5);
  const std::vector<std::int64_t> starts = {0, 50, 100, 150};
  const LmBatch whole = make_lm_batch(text, starts, 16, cfg.context);
  const auto grads_with = [&](int threads) {
    set_num_threads(threads);
    LmSaved s;
    lm.forward_train(whole, s);
    LmParams g;
    lm.backward(s, 1.0 / 64, g, false);
    return g;
  };
  const LmParams g1 = grads_with(1), g2 = grads_with(2);
  set_num_threads(0);
  const NamedTensors a = g1.named(), b = g2.named();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.nbytes()), 0) << a[i].first;
  // Two micro-batches of two sequences accumulate to the whole batch's gradient (to rounding:
  // the sums over rows are split differently).
  LmParams gm;
  for (int m = 0; m < 2; ++m) {
    const LmBatch half = make_lm_batch(text, {starts[2 * m], starts[2 * m + 1]}, 16, cfg.context);
    LmSaved s;
    lm.forward_train(half, s);
    lm.backward(s, 1.0 / 64, gm, m > 0);
  }
  const NamedTensors c = gm.named();
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::int64_t k = 0; k < a[i].second.numel(); ++k)
      ASSERT_NEAR(c[i].second.data_as<float>()[k], a[i].second.data_as<float>()[k], 1e-6)
          << a[i].first << "[" << k << "]";
  // The inference loss equals the training forward's, bit for bit.
  LmSaved s;
  const double train_loss = lm.forward_train(whole, s) * 64;
  std::vector<std::vector<std::int64_t>> counts;
  EXPECT_EQ(lm.loss_sum(whole, &counts), train_loss);
  ASSERT_EQ(counts.size(), 2u);
  std::int64_t total = 0;
  for (auto v : counts[0]) total += v;
  EXPECT_EQ(total, 64 * cfg.block.router.top_k);
}

TEST(Lm, OverfitsATinyText) {
  LmConfig cfg = tiny_lm("qwen3_moe", 1);
  cfg.vocab = 256;
  const std::string s = "the quick brown fox jumps over the lazy dog. ";
  std::vector<std::uint8_t> text;
  for (int r = 0; r < 6; ++r) text.insert(text.end(), s.begin(), s.end());
  LmParams p = init_lm_parameters(cfg, 1);
  const LanguageModel lm(cfg, p);
  const LmBatch batch = make_lm_batch(text, {0, 64, 128, 200}, 64, cfg.context);
  Optimizer opt = Optimizer::adamw({0.9, 0.999, 1e-8, 0.0});
  double first = 0, last = 0;
  LmSaved saved;
  LmParams g;
  for (int step = 0; step < 150; ++step) {
    last = lm.forward_train(batch, saved);
    if (step == 0) first = last;
    lm.backward(saved, 1.0 / static_cast<double>(batch.tokens), g, false);
    opt.step(p.named(), g.named(), 1e-2);
  }
  EXPECT_GT(first, 4.0);  // ~ln 256 at the start
  EXPECT_LT(last, 0.35);  // the text is memorised (a context of 3 bytes determines the next one)
}

TEST(Lm, ErrorsNameWhatIsWrong) {
  const LmConfig cfg = tiny_lm("mixtral");
  const LmParams p = init_lm_parameters(cfg, 1);
  LmParams bad = p;
  bad.head = Tensor({3, 8}, DType::f32);
  try {
    LanguageModel lm(cfg, bad);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head must be f32 [16, 8]"), std::string::npos) << e.what();
  }
  const LanguageModel lm(cfg, p);
  LmBatch b = make_lm_batch(text_of(40, 16, 1), {0}, 8, cfg.context);
  b.targets[3] = 99;
  LmSaved s;
  EXPECT_THROW(lm.forward_train(b, s), std::invalid_argument);
  EXPECT_THROW(make_lm_batch(text_of(10, 16, 1), {2}, 8, 3), std::invalid_argument);
  LmConfig dense = cfg;
  dense.block.moe_layers = {0};
  EXPECT_THROW(dense.validate(), std::invalid_argument);
}

// LmParams::for_each_member is the one list of the members: named() is its non-empty block
// tensors and every other member, in its order; zeros_like() zeroes every member into new storage
// and keeps a block's empty members empty.
TEST(Lm, OneMemberListForNamesAndZeros) {
  const LmConfig cfg = tiny_lm("gpt_oss");  // expert biases and a router bias: more kinds of member
  const LmParams p = init_lm_parameters(cfg, 3);
  std::vector<std::string> walked;
  std::size_t visited = 0;
  p.for_each_member([&](const std::string& name, const Tensor& t, const MoeTensorMember* in_block) {
    ++visited;
    if (!in_block || t.numel() > 0) walked.push_back(name);
  });
  const std::size_t per_block = std::size(kMoeTensorMembers);
  EXPECT_EQ(visited, 4 + 2 * (1 + per_block));  // embed, context_proj, final_norm, head; per layer a norm and a block
  const NamedTensors named = p.named();
  ASSERT_EQ(walked.size(), named.size());
  for (std::size_t i = 0; i < named.size(); ++i) EXPECT_EQ(walked[i], named[i].first);
  EXPECT_EQ(named.front().first, "embed");
  EXPECT_EQ(named[2].first, "layers.0.norm");
  EXPECT_EQ(named[3].first, "layers.0.router");
  EXPECT_EQ(named.back().first, "head");

  const LmParams z = LmParams::zeros_like(p);
  const NamedTensors zn = z.named();
  ASSERT_EQ(zn.size(), named.size());
  for (std::size_t i = 0; i < zn.size(); ++i) {
    EXPECT_EQ(zn[i].first, named[i].first);
    EXPECT_EQ(zn[i].second.shape(), named[i].second.shape()) << zn[i].first;
    EXPECT_NE(zn[i].second.data(), named[i].second.data()) << zn[i].first;
    const float* v = zn[i].second.data_as<const float>();
    EXPECT_TRUE(std::all_of(v, v + zn[i].second.numel(), [](float x) { return x == 0.0f; })) << zn[i].first;
  }
  for (std::size_t l = 0; l < z.blocks.size(); ++l)
    for (const MoeTensorMember& m : kMoeTensorMembers)
      EXPECT_EQ((z.blocks[l].*m.member).numel() == 0, (p.blocks[l].*m.member).numel() == 0) << m.name;
}

TEST(Presets, EveryFamilyReadsBackWithItsSizes) {
  for (const char* family : {"deepseek_v2", "deepseek_v3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss",
                             "llama4_text", "minimax_m2"}) {
    BlockShape s;
    s.hidden_size = 32;
    s.num_experts = 8;
    s.top_k = 2;
    s.expert_width = 16;
    s.num_layers = 3;
    s.selection_bias = true;
    const MoeConfig c = parse_hf_config(preset_config_json(family, s));
    EXPECT_EQ(c.model_type, family);
    EXPECT_EQ(c.hidden_size, 32);
    EXPECT_EQ(c.router.num_experts, 8) << family;
    EXPECT_EQ(c.router.top_k, 2) << family;
    EXPECT_EQ(c.expert_width, 16) << family;
    EXPECT_EQ(c.num_layers, 3);
    EXPECT_EQ(c.moe_layer_indices().size(), 3u) << family;
    EXPECT_TRUE(c.router.has_selection_bias) << family;
  }
  BlockShape s{32, 8, 2, 16, 2, 1, false};
  EXPECT_EQ(parse_hf_config(preset_config_json("deepseek_v3", s)).shared_width, 32);
  EXPECT_FALSE(parse_hf_config(preset_config_json("qwen3_moe", BlockShape{32, 8, 2, 16, 0, 1, false}))
                   .router.has_selection_bias);
  EXPECT_THROW(preset_config_json("mixtral", s), std::invalid_argument);      // no shared experts
  EXPECT_THROW(preset_config_json("llama4_text", s), std::invalid_argument);  // exactly one
  EXPECT_THROW(preset_config_json("gpt5", s), std::invalid_argument);
  EXPECT_THROW(preset_config_json("qwen3_moe", BlockShape{32, 8, 9, 16, 0, 1, false}), std::invalid_argument);  // K > E
}

}  // namespace
}  // namespace moekit
