// `moekit generate` and `bench --e2e` as a user runs them: the greedy tokens of the command equal
// transformers' (tests/goldens/models), json and text output, and a named error for a bad model.
#include <gtest/gtest.h>

#include <filesystem>
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
  for (const std::string& model : {kModels + "qwen2moe.f32.gguf", kModels + "qwen2moe"}) {
    const testing::RunResult r = run({"generate", "--model", model, "--prompt-ids", ids_arg(prompt), "--max-tokens",
                                      std::to_string(want.size()), "-o", "json", "--threads", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json out = nlohmann::json::parse(r.out);
    EXPECT_EQ(out["ids"].get<std::vector<std::int32_t>>(), want) << model;
    EXPECT_EQ(out["prompt_ids"].get<std::vector<std::int32_t>>(), prompt);
    EXPECT_GT(out["timings"]["prefill_tokens_per_s"].get<double>(), 0.0);
  }
  // Text output: the text as it is made (the converter's stub vocabulary spells token i '<ti>').
  const testing::RunResult text =
      run({"generate", "--model", kModels + "qwen2moe.f32.gguf", "--prompt-ids", ids_arg(prompt), "--max-tokens", "3"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  std::string spelled;
  for (int i = 0; i < 3; ++i) spelled += "<t" + std::to_string(want[static_cast<std::size_t>(i)]) + ">";
  EXPECT_EQ(text.out, spelled + "\n");
}

// GPT-2's byte-to-character map (byte-level BPE vocabularies spell byte b as this character).
std::string byte_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int c = 0; c < b; ++c)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The qwen3moe folder with a tokenizer.json: byte-level BPE without merges, token b the byte b,
// except `eog`, a special <|im_end|> (an end-of-generation token).
void write_byte_tokenizer(const std::filesystem::path& dir, std::int32_t eog) {
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    std::filesystem::copy_file(kModels + "qwen3moe/" + f, dir / f);
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b)
    if (b != eog) vocab[byte_char(b)] = b;
  const nlohmann::json tok = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", eog},
         {"content", "<|im_end|>"},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
}

TEST(CliGenerate, TextPromptsUseTheModelsTokenizerAndGenerationStopsAtItsEndToken) {
  std::ifstream f(kModels + "qwen3moe.ref.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<std::int32_t> prompt = ref["prompt_ids"].get<std::vector<std::int32_t>>();
  const std::vector<std::int32_t> want = ref["greedy_ids"].get<std::vector<std::int32_t>>();
  const testing::TempDir model("cli_generate_tokenizer");
  write_byte_tokenizer(model.path(), want[1]);  // transformers' second greedy token ends the generation
  // The golden prompt as ids: the golden continuation, cut after the end-of-generation token.
  const testing::RunResult stop = run({"generate", "--model", model.path().string(), "--prompt-ids", ids_arg(prompt),
                                       "--max-tokens", "16", "-o", "json"});
  ASSERT_EQ(stop.exit_code, 0) << stop.err;
  const nlohmann::json out = nlohmann::json::parse(stop.out);
  EXPECT_EQ(out["ids"].get<std::vector<std::int32_t>>(), (std::vector<std::int32_t>{want[0], want[1]}));
  // Byte 227 alone is an incomplete UTF-8 character: U+FFFD, then the special token's text.
  EXPECT_EQ(out["text"].get<std::string>(), "\xEF\xBF\xBD<|im_end|>");
  // Text: ASCII bytes are their own tokens here.
  const testing::RunResult text =
      run({"generate", "--model", model.path().string(), "--prompt", "Hello", "--max-tokens", "2", "-o", "json"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(nlohmann::json::parse(text.out)["prompt_ids"].get<std::vector<std::int32_t>>(),
            (std::vector<std::int32_t>{'H', 'e', 'l', 'l', 'o'}));
  // Without a tokenizer, --prompt names what is missing.
  const testing::RunResult none = run({"generate", "--model", kModels + "qwen3moe", "--prompt", "Hello"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("--prompt needs the model's tokenizer"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("no tokenizer.json"), std::string::npos) << none.err;
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
