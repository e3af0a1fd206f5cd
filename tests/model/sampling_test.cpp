// Sampling, the random model and the whole-model errors: the same seed gives the same tokens, top-k
// 1 and temperature 0 are greedy, every out-of-range parameter and input is a named error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moekit/causal_lm.hpp"

namespace moekit {
namespace {

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/models/";

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Sampler, GreedyIsTheLowestArgmax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s{SamplingParams{}};
  EXPECT_EQ(s.sample(logits.data(), 4, {}), 1);
  SamplingParams one;
  one.temperature = 1.0;
  one.top_k = 1;
  Sampler k1{one};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(logits.data(), 4, {}), 1);
}

TEST(Sampler, TheSameSeedGivesTheSameTokens) {
  std::vector<float> logits(64);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.95;
  p.min_p = 0.01;
  p.seed = 42;
  std::vector<std::int32_t> a, b, c;
  Sampler sa{p}, sb{p};
  p.seed = 43;
  Sampler sc{p};
  for (int i = 0; i < 50; ++i) {
    a.push_back(sa.sample(logits.data(), 64, a));
    b.push_back(sb.sample(logits.data(), 64, b));
    c.push_back(sc.sample(logits.data(), 64, c));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, TopPAndMinPKeepOnlyTheHead) {
  // Token 3 carries almost all the mass: top-p 0.5 and min-p 0.5 each leave it alone.
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 10.0f};
  for (const bool top_p : {true, false}) {
    SamplingParams p;
    p.temperature = 5.0;  // flat after the cut, so a wrong cut shows
    (top_p ? p.top_p : p.min_p) = 0.5;
    Sampler s{p};
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits.data(), 4, {}), 3);
  }
}

TEST(Sampler, RepetitionPenaltyPushesSeenTokensDown) {
  const std::vector<float> logits = {1.0f, 0.9f};
  SamplingParams p;
  p.repetition_penalty = 2.0;
  Sampler s{p};
  EXPECT_EQ(s.sample(logits.data(), 2, {0}), 1);  // 1.0 / 2 < 0.9
}

TEST(Sampler, OutOfRangeParametersAreNamed) {
  const auto bad = [](auto edit, const char* what) {
    SamplingParams p;
    edit(p);
    EXPECT_NE(error_of([&] { validate(p); }).find(what), std::string::npos) << what;
  };
  bad([](SamplingParams& p) { p.temperature = -1; }, "temperature");
  bad([](SamplingParams& p) { p.top_p = 0; }, "top_p");
  bad([](SamplingParams& p) { p.min_p = 2; }, "min_p");
  bad([](SamplingParams& p) { p.top_k = -1; }, "top_k");
  bad([](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty");
  const std::vector<float> nan = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  Sampler s{SamplingParams{}};
  EXPECT_NE(error_of([&] { s.sample(nan.data(), 2, {}); }).find("logit 1 is nan"), std::string::npos);
}

TEST(RandomModel, GeneratesDeterministicallyAndBatchInvariantly) {
  const std::shared_ptr<CausalLm> lm = CausalLm::random(3);
  std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  SamplingParams p;
  p.temperature = 0.7;
  p.seed = 9;
  const std::vector<std::int32_t> a = lm->generate(prompt, 12, p), b = CausalLm::random(3)->generate(prompt, 12, p);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 12u);
  std::unique_ptr<Sequence> s1 = lm->new_sequence(), s2 = lm->new_sequence();
  const Tensor whole = lm->forward(*s1, prompt);
  Tensor last;
  for (const std::int32_t id : prompt) last = lm->forward(*s2, {id});
  EXPECT_EQ(std::memcmp(whole.data(), last.data(), whole.nbytes()), 0);
  EXPECT_EQ(s1->size(), 7);
  s1->truncate(3);
  EXPECT_EQ(s1->size(), 3);
}

TEST(WholeModelErrors, AreNamed) {
  LmOptions small;
  small.ctx = 8;
  const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + "qwen3moe.f32.gguf", small);
  std::unique_ptr<Sequence> seq = lm->new_sequence();
  EXPECT_NE(error_of([&] {
              lm->forward(*seq, {1, 256});
            }).find("token id 256 at 1 outside the vocabulary [0, 256)"),
            std::string::npos);
  EXPECT_EQ(seq->size(), 0);  // nothing appended
  EXPECT_NE(error_of([&] { lm->forward(*seq, std::vector<std::int32_t>(9, 1)); }).find("pass the context of 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lm->generate({}, 4, SamplingParams{}); }).find("empty prompt"), std::string::npos);
  const std::shared_ptr<CausalLm> other = CausalLm::random(1);
  std::unique_ptr<Sequence> foreign = other->new_sequence();
  EXPECT_NE(error_of([&] { lm->forward(*foreign, {1}); }).find("another model"), std::string::npos);
  // Not a model: the block-type GGUF of the format tests has no architecture moekit runs whole.
  EXPECT_NE(error_of([&] {
              CausalLm::open(std::string(MOEKIT_TEST_DATA_DIR) + "/gguf/blocks.gguf");
            }).find("architecture 'moekit-goldens' is not a model moekit runs whole"),
            std::string::npos);
  // A truncated file.
  const std::filesystem::path cut = std::filesystem::temp_directory_path() / "moekit_truncated.gguf";
  {
    std::ifstream in(kDir + "qwen3moe.f32.gguf", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(cut, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  EXPECT_NE(error_of([&] { CausalLm::open(cut.string()); }).find(cut.string()), std::string::npos);
  std::filesystem::remove(cut);
  // An HF folder of a model_type moekit does not run whole.
  const std::filesystem::path dense = std::filesystem::temp_directory_path() / "moekit_dense_model";
  std::filesystem::create_directories(dense);
  std::ofstream(dense / "config.json") << R"({"model_type": "llama", "hidden_size": 64})";
  const std::string why = error_of([&] { CausalLm::open(dense.string()); });
  EXPECT_NE(why.find("llama"), std::string::npos) << why;
  EXPECT_NE(why.find("qwen3_moe"), std::string::npos) << why;  // the supported ones are listed
  std::filesystem::remove_all(dense);
}

}  // namespace
}  // namespace moekit
