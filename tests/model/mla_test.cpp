// DeepSeek's MLA models beyond the golden comparisons of causal_lm_test.cpp: Kimi-K2's model_type
// runs DeepSeek-V3's decoder, the cache holds one latent row per token and layer, the results do
// not depend on the thread count (decode splits one key head's query heads over the threads), and
// bad MLA configs are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_goldens.hpp"
#include "moekit/causal_lm.hpp"
#include "moekit/threading.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
const std::string& kDir = testing::kModelsDir;
std::vector<std::int32_t> prompt_of(const std::string& family) { return testing::golden_prompt(family); }

// A copy of a golden folder with config.json edited by `edit`.
fs::path edited_copy(const std::string& family, const std::string& name,
                     const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / ("moekit_mla_" + name);
  fs::remove_all(dir);
  fs::copy(kDir + family, dir, fs::copy_options::recursive);
  nlohmann::json c;
  {
    std::ifstream in(dir / "config.json");
    c = nlohmann::json::parse(in);
  }
  edit(c);
  std::ofstream(dir / "config.json") << c.dump();
  return dir;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Mla, KimiK2RunsAsDeepseekV3) {
  const fs::path kimi = edited_copy("deepseek-v3", "kimi", [](nlohmann::json& c) { c["model_type"] = "kimi_k2"; });
  const std::vector<std::int32_t> prompt = prompt_of("deepseek-v3");
  const std::shared_ptr<CausalLm> a = CausalLm::open(kDir + "deepseek-v3"), b = CausalLm::open(kimi.string());
  std::unique_ptr<Sequence> sa = a->new_sequence(), sb = b->new_sequence();
  EXPECT_TRUE(same_bits(a->forward(*sa, prompt, true), b->forward(*sb, prompt, true)));
  EXPECT_EQ(b->info().arch, "kimi_k2");
  fs::remove_all(kimi);
}

// DeepSeek-V3's release layouts of the tiny V3 (make_model_goldens.py, release_layouts): FP8 with
// block scales on every decoder matrix (attention's kv_b_proj included, decoded per head at load),
// the same with power-of-two scales (DeepSeek-V3.1's scale_fmt ue8m0), and Kimi-K2-Thinking's int4
// experts beside bf16 attention; transformers on the decoded weights.
TEST(Mla, ReleaseLayoutsMatchTransformersOnTheirDecodedWeights) {
  std::ifstream f(kDir + "deepseek-v3.ref.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<std::int32_t> prompt = ref["prompt_ids"].get<std::vector<std::int32_t>>();
  for (const std::string kind : {"fp8", "fp8_ue8m0", "int4"}) {
    std::string folder = kind;
    std::replace(folder.begin(), folder.end(), '_', '-');
    const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + "deepseek-v3-" + folder);
    std::unique_ptr<Sequence> seq = lm->new_sequence();
    const Tensor logits = lm->forward(*seq, prompt, true);
    const nlohmann::json& want = ref[std::string("logits_") + kind];
    double err = 0.0, scale = 0.0;
    const std::int64_t V = logits.dim(1);
    for (std::int64_t t = 0; t < logits.dim(0); ++t)
      for (std::int64_t v = 0; v < V; ++v) {
        const double w = want[static_cast<std::size_t>(t)][static_cast<std::size_t>(v)].get<double>();
        err = std::max(err, std::abs(logits.data_as<float>()[t * V + v] - w));
        scale = std::max(scale, std::abs(w));
      }
    EXPECT_LT(err / scale, 2e-5) << kind;
    const std::vector<std::int32_t> greedy = ref[std::string("greedy_ids_") + kind].get<std::vector<std::int32_t>>();
    EXPECT_EQ(lm->generate(prompt, static_cast<std::int64_t>(greedy.size()), SamplingParams{}), greedy) << kind;
  }
}

// An older converter's deepseek2 file: kv_b_proj unsplit (attn_kv_b), decoded per head at load —
// the same values as the split attn_k_b / attn_v_b used in place, so the same bits.
TEST(Mla, AnUnsplitKvBGivesTheSameBitsAsTheSplitOne) {
  const std::vector<std::int32_t> prompt = prompt_of("deepseek-v2");
  const std::shared_ptr<CausalLm> split = CausalLm::open(kDir + "deepseek-v2.f32.gguf");
  const std::shared_ptr<CausalLm> legacy = CausalLm::open(kDir + "deepseek-v2.kv_b.f32.gguf");
  std::unique_ptr<Sequence> a = split->new_sequence(), b = legacy->new_sequence();
  EXPECT_TRUE(same_bits(split->forward(*a, prompt, true), legacy->forward(*b, prompt, true)));
}

TEST(Mla, TheCacheHoldsOneLatentRowPerTokenAndLayer) {
  for (const std::string& path :
       {kDir + "deepseek-v3", kDir + "deepseek-v3.q8_0.gguf", kDir + "deepseek-v2.f32.gguf"}) {
    LmOptions o;
    o.ctx = 40;
    const std::shared_ptr<CausalLm> lm = CausalLm::open(path, o);
    const LmInfo& info = lm->info();
    EXPECT_EQ(info.num_kv_heads, 1) << path;
    EXPECT_NE(info.attention.find("MLA"), std::string::npos) << info.attention;
    // the tiny models: kv_lora_rank 32 + qk_rope_head_dim 8 floats per token (llama.cpp's f16 MLA
    // cache holds the same row in half the bytes; an expanded cache 4 heads x (24 + 12))
    EXPECT_EQ(lm->new_sequence()->nbytes(), static_cast<std::size_t>(info.num_layers * 40 * (32 + 8) * 4)) << path;
  }
}

TEST(Mla, ResultsDoNotDependOnTheThreadCount) {
  const std::vector<std::int32_t> prompt = prompt_of("deepseek-v2");
  const std::shared_ptr<CausalLm> lm = CausalLm::open(kDir + "deepseek-v2.f32.gguf");
  const int before = num_threads();
  std::vector<Tensor> prefill, step;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::unique_ptr<Sequence> s = lm->new_sequence();
    prefill.push_back(lm->forward(*s, prompt, true));
    step.push_back(lm->forward(*s, {prompt[0]}));  // a decode step: the heads split over the threads
  }
  set_num_threads(before);
  for (std::size_t i = 1; i < step.size(); ++i) {
    EXPECT_TRUE(same_bits(prefill[0], prefill[i])) << i + 1 << " threads";
    EXPECT_TRUE(same_bits(step[0], step[i])) << i + 1 << " threads";
  }
}

TEST(Mla, BadConfigsAreNamed) {
  const fs::path no_rank = edited_copy("deepseek-v2", "no_rank", [](nlohmann::json& c) { c.erase("kv_lora_rank"); });
  EXPECT_NE(error_of([&] { CausalLm::open(no_rank.string()); }).find("kv_lora_rank"), std::string::npos);
  const fs::path odd_rope =
      edited_copy("deepseek-v2", "odd_rope", [](nlohmann::json& c) { c["qk_rope_head_dim"] = 7; });
  EXPECT_NE(error_of([&] { CausalLm::open(odd_rope.string()); }).find("qk_rope_head_dim 7"), std::string::npos);
  fs::remove_all(no_rank);
  fs::remove_all(odd_rope);
}

}  // namespace
}  // namespace moekit
