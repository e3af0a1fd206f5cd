// CausalLm::decode: several sequences' decode steps in one pass, and CausalLm::step: decode tokens
// and prompts' chunks in one pass. In the exact mode each row is the bits the sequence gets alone
// (batch invariance), for every family's attention (GQA, sinks, sliding and chunked windows, MLA);
// bad batches are named and leave the sequences unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/model_goldens.hpp"
#include "moekit/causal_lm.hpp"

namespace moekit {
namespace {

using testing::error_of;
const std::string& kDir = testing::kModelsDir;
std::vector<std::int32_t> prompt_of(const std::string& family) { return testing::golden_prompt(family); }

class BatchDecode : public ::testing::TestWithParam<std::string> {};

// Three sequences of different lengths (prefixes of the golden prompt) decode four steps together,
// the batch changing as one drops out; each alone must give the same bits at every step.
TEST_P(BatchDecode, ExactRowsAreTheBitsOfEachSequenceAlone) {
  const std::vector<std::int32_t> prompt = prompt_of(GetParam());
  LmOptions exact;
  exact.mode = ComputeMode::exact;
  const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + GetParam() + ".f32.gguf", exact);
  const std::int64_t V = lm->info().vocab_size;
  const std::vector<std::size_t> lengths = {12, 5, 9};
  std::vector<std::unique_ptr<Sequence>> together, alone;
  for (std::size_t len : lengths) {
    const std::vector<std::int32_t> p(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(len));
    together.push_back(lm->new_sequence());
    alone.push_back(lm->new_sequence());
    lm->forward(*together.back(), p);
    lm->forward(*alone.back(), p);
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<Sequence*> batch;
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (step == 2 && i == 1) continue;  // one sequence sits a step out
      batch.push_back(together[i].get());
      ids.push_back(prompt[(i * 7 + static_cast<std::size_t>(step) * 3) % prompt.size()]);
    }
    const Tensor rows = lm->decode(batch, ids);
    ASSERT_EQ(rows.dim(0), static_cast<std::int64_t>(batch.size()));
    std::size_t r = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (step == 2 && i == 1) continue;
      const Tensor one = lm->forward(*alone[i], {ids[r]});
      EXPECT_EQ(std::memcmp(one.data(), rows.data_as<float>() + static_cast<std::int64_t>(r) * V, one.nbytes()), 0)
          << GetParam() << ": step " << step << ", sequence " << i;
      EXPECT_EQ(together[i]->size(), alone[i]->size());
      ++r;
    }
  }
}

// Continuous batching's steps: one sequence's prompt prefilled in chunks of 4 beside another's
// decode tokens and a third's prompt in one chunk of 3 then decoding; at every step each row is the
// bits of the same tokens run alone (forward of the chunk, or of the one token).
TEST_P(BatchDecode, StepsMixingPromptChunksAndDecodeTokensAreTheBitsOfEachAlone) {
  const std::vector<std::int32_t> prompt = prompt_of(GetParam());
  LmOptions exact;
  exact.mode = ComputeMode::exact;
  const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + GetParam() + ".f32.gguf", exact);
  const std::int64_t V = lm->info().vocab_size;
  constexpr std::size_t kSeqs = 3;
  std::vector<std::unique_ptr<Sequence>> together, alone;
  for (std::size_t i = 0; i < kSeqs; ++i) {
    together.push_back(lm->new_sequence());
    alone.push_back(lm->new_sequence());
  }
  // Sequence 1 starts with a prompt of 6 and decodes from the first step.
  const std::vector<std::int32_t> p1(prompt.begin(), prompt.begin() + 6);
  lm->forward(*together[1], p1);
  lm->forward(*alone[1], p1);
  std::size_t fed0 = 0;  // sequence 0's prompt tokens run so far (chunks of 4)
  for (int step = 0; step < 4; ++step) {
    std::vector<Sequence*> batch;
    std::vector<std::vector<std::int32_t>> lists;
    std::vector<std::size_t> who;
    if (fed0 < prompt.size()) {
      const std::size_t n = std::min<std::size_t>(4, prompt.size() - fed0);
      lists.emplace_back(prompt.begin() + static_cast<std::ptrdiff_t>(fed0),
                         prompt.begin() + static_cast<std::ptrdiff_t>(fed0 + n));
      fed0 += n;
    } else {
      lists.push_back({prompt[static_cast<std::size_t>(step)]});
    }
    batch.push_back(together[0].get());
    who.push_back(0);
    batch.push_back(together[1].get());
    lists.push_back({prompt[(static_cast<std::size_t>(step) * 5 + 1) % prompt.size()]});
    who.push_back(1);
    if (step == 1) {  // sequence 2's prompt in one chunk, then a decode token each step
      batch.push_back(together[2].get());
      lists.emplace_back(prompt.end() - 3, prompt.end());
      who.push_back(2);
    } else if (step > 1) {
      batch.push_back(together[2].get());
      lists.push_back({prompt[static_cast<std::size_t>(step)]});
      who.push_back(2);
    }
    const Tensor rows = lm->step(batch, lists);
    ASSERT_EQ(rows.dim(0), static_cast<std::int64_t>(batch.size()));
    for (std::size_t r = 0; r < batch.size(); ++r) {
      const Tensor one = lm->forward(*alone[who[r]], lists[r]);
      EXPECT_EQ(std::memcmp(one.data(), rows.data_as<float>() + static_cast<std::int64_t>(r) * V, one.nbytes()), 0)
          << GetParam() << ": step " << step << ", sequence " << who[r] << " (" << lists[r].size() << " tokens)";
      EXPECT_EQ(together[who[r]]->size(), alone[who[r]]->size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecode,
                         ::testing::Values("qwen3moe", "gpt-oss", "llama4", "deepseek-v2", "deepseek-v3"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Two threads forwarding and decoding their own sequences of one model at once (a Python server's
// threads): the same bits as one after the other, and the statistics count both.
TEST(BatchDecode, ConcurrentCallsOnDifferentSequencesAreSafe) {
  const std::vector<std::int32_t> prompt = prompt_of("deepseek-v3");
  LmOptions exact;
  exact.mode = ComputeMode::exact;
  const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + "deepseek-v3.f32.gguf", exact);
  const auto run = [&](std::size_t offset) {
    std::unique_ptr<Sequence> a = lm->new_sequence(), b = lm->new_sequence();
    lm->forward(*a, std::vector<std::int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(offset), prompt.end()));
    lm->forward(*b, {prompt[offset]});
    return lm->decode({a.get(), b.get()}, {prompt[0], prompt[1]});
  };
  const Tensor serial0 = run(0), serial1 = run(3);
  lm->reset_stats();
  Tensor concurrent0, concurrent1;
  std::thread t([&] { concurrent0 = run(0); });
  concurrent1 = run(3);
  t.join();
  EXPECT_EQ(std::memcmp(serial0.data(), concurrent0.data(), serial0.nbytes()), 0);
  EXPECT_EQ(std::memcmp(serial1.data(), concurrent1.data(), serial1.nbytes()), 0);
  EXPECT_EQ(lm->stats().tokens, 2 * (static_cast<std::int64_t>(prompt.size()) + 1 + 2) - 3);
}

TEST(BatchDecodeErrors, AreNamedAndChangeNothing) {
  LmOptions small;
  small.ctx = 4;
  const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + "qwen3moe.f32.gguf", small);
  std::unique_ptr<Sequence> a = lm->new_sequence(), b = lm->new_sequence();
  lm->forward(*b, {1, 2, 3, 4});  // full
  EXPECT_NE(error_of([&] { lm->decode({}, {}); }).find("no sequences"), std::string::npos);
  EXPECT_NE(error_of([&] { lm->decode({a.get()}, {1, 2}); }).find("2 token ids for 1 sequences"), std::string::npos);
  EXPECT_NE(error_of([&] { lm->decode({a.get(), a.get()}, {1, 2}); }).find("are the same sequence"), std::string::npos);
  EXPECT_NE(error_of([&] { lm->decode({a.get(), b.get()}, {1, 2}); }).find("sequence 1 is full"), std::string::npos);
  EXPECT_NE(error_of([&] { lm->decode({a.get()}, {256}); }).find("token id 256 of sequence 0 outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lm->decode({a.get(), nullptr}, {1, 2}); }).find("sequence 1 is null"), std::string::npos);
  const std::shared_ptr<CausalLm> other = CausalLm::random(1);
  std::unique_ptr<Sequence> foreign = other->new_sequence();
  EXPECT_NE(error_of([&] { lm->decode({foreign.get()}, {1}); }).find("made by another model"), std::string::npos);
  EXPECT_NE(error_of([&] {
              lm->step({a.get(), b.get()}, {{1}});
            }).find("1 token lists for 2 sequences"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lm->step({a.get()}, {{}}); }).find("no tokens for sequence 0"), std::string::npos);
  EXPECT_NE(error_of([&] {
              lm->step({a.get()}, {{1, 2, 3, 4, 5}});
            }).find("0 + 5 tokens pass its context of 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              lm->step({a.get(), b.get()}, {{1, 2}, {3}});
            }).find("sequence 1 is full"),
            std::string::npos);
  EXPECT_EQ(a->size(), 0);
  EXPECT_EQ(b->size(), 4);
}

}  // namespace
}  // namespace moekit
