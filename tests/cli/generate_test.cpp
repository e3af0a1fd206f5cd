// `moekit generate` and `bench --e2e` as a user runs them: the greedy tokens of the command equal
// transformers' (tests/goldens/models), json and text output, and a named error for a bad model.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/run_cli.hpp"
#include "io/safetensors_writer.hpp"

namespace moekit {
namespace {

const std::string kModels = std::string(MOEKIT_TEST_DATA_DIR) + "/models/";

testing::RunResult run(const std::vector<std::string>& args) {
  const testing::TempDir scratch("cli_generate");
  return testing::run_cli(args, scratch.path());
}

std::string ids_arg(const std::vector<std::int32_t>& ids) {
  std::string s;
  for (const std::int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

TEST(CliGenerate, GreedyTokensEqualTransformersFromGgufAndFolder) {
  std::ifstream f(kModels + "qwen2moe.ref.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<std::int32_t> prompt = ref["prompt_ids"].get<std::vector<std::int32_t>>();
  const std::vector<std::int32_t> want = ref["greedy_ids"].get<std::vector<std::int32_t>>();
  for (const std::string model : {kModels + "qwen2moe.f32.gguf", kModels + "qwen2moe"}) {
    const testing::RunResult r = run({"generate", "--model", model, "--prompt-ids", ids_arg(prompt), "--max-tokens",
                                      std::to_string(want.size()), "-o", "json", "--threads", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json out = nlohmann::json::parse(r.out);
    EXPECT_EQ(out["ids"].get<std::vector<std::int32_t>>(), want) << model;
    EXPECT_EQ(out["prompt_ids"].get<std::vector<std::int32_t>>(), prompt);
    EXPECT_GT(out["timings"]["prefill_tokens_per_s"].get<double>(), 0.0);
  }
  // Text output: the ids as they are made, on one line.
  const testing::RunResult text =
      run({"generate", "--model", kModels + "qwen2moe.f32.gguf", "--prompt-ids", ids_arg(prompt), "--max-tokens", "3"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, std::to_string(want[0]) + " " + std::to_string(want[1]) + " " + std::to_string(want[2]) + " \n");
}

TEST(CliGenerate, ABadModelOrTokenIsOneNamedError) {
  const testing::RunResult missing = run({"generate", "--model", "/no/such/model", "--prompt-ids", "1"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/no/such/model: no such file or folder"), std::string::npos) << missing.err;
  const testing::RunResult vocab = run({"generate", "--model", kModels + "olmoe.f32.gguf", "--prompt-ids", "1,999"});
  EXPECT_EQ(vocab.exit_code, 1);
  EXPECT_NE(vocab.err.find("token id 999 at 1 outside the vocabulary [0, 256)"), std::string::npos) << vocab.err;
}

TEST(CliBench, E2eReportsPromptAndGenerationRates) {
  const testing::RunResult r = run({"bench", "--e2e", "--model", kModels + "mixtral.q8_0.gguf", "-p", "8", "-n", "4",
                                    "--reps", "1", "--threads", "1", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["test"], "pp8");
  EXPECT_EQ(j["results"][1]["test"], "tg4");
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GE(row["outside_moe"].get<double>(), 0.0);
    EXPECT_LE(row["outside_moe"].get<double>(), 1.0);
  }
}

}  // namespace
}  // namespace moekit
