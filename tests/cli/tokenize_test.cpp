// `moekit tokenize` as a user runs it: the ids of llama.cpp's vocabulary tests and of the
// tokenizers library from a vocabulary-only GGUF and from a folder, json and text output, --ids
// back to text, and one named error for a bad model or text.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/run_cli.hpp"
#include "io/safetensors_writer.hpp"

namespace moekit {
namespace {

const std::string kTok = std::string(MOEKIT_TEST_DATA_DIR) + "/tokenizer/";

testing::RunResult run(const std::vector<std::string>& args) {
  const testing::TempDir scratch("cli_tokenize");
  return testing::run_cli(args, scratch.path());
}

TEST(CliTokenize, JsonIdsOfAVocabularyGgufEqualLlamaCppsGoldens) {
  // ggml-vocab-qwen2.gguf.inp: texts 11 and 12 are "Hello world" and " Hello world" (their .out lines).
  const std::string model = kTok + "ggml-vocab-qwen2.gguf";
  const testing::RunResult r =
      run({"tokenize", "--model", model, "--text", "Hello world", "--no-special", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"].get<std::vector<std::int32_t>>(), (std::vector<std::int32_t>{9707, 1879}));
  EXPECT_EQ(j["pieces"].get<std::vector<std::string>>(), (std::vector<std::string>{"Hello", " world"}));
  // Text output: the ids on one line; special tokens parsed unless --no-special.
  const testing::RunResult text = run({"tokenize", "--model", model, "--text", " Hello world<|im_end|>"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, "21927 1879 151645\n");
  const testing::RunResult plain = run({"tokenize", "--model", model, "--text", "<|im_end|>", "--no-special"});
  EXPECT_NE(plain.out, "151645\n");
}

TEST(CliTokenize, AFolderAndATextFileGiveTheTokenizersLibrarysIds) {
  std::ifstream f(kTok + "mixtral/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const testing::TempDir dir("cli_tokenize_file");
  for (const std::size_t i : {std::size_t{19}, ref["texts"].size() - 1}) {
    const std::string text = ref["texts"][i].get<std::string>();
    std::ofstream(dir.file("text.txt"), std::ios::binary) << text;
    for (const std::string& model : {kTok + "mixtral", kTok + "mixtral/vocab.gguf"}) {
      const testing::RunResult r =
          run({"tokenize", "--model", model, "--text-file", dir.file("text.txt"), "-o", "json"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], ref["special"][i]) << model << ": '" << text << "'";
    }
  }
}

TEST(CliTokenize, IdsBackToText) {
  const testing::RunResult r =
      run({"tokenize", "--model", kTok + "ggml-vocab-llama-spm.gguf", "--ids", "1,15043,3186"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s> Hello world\n");
  const testing::RunResult skip = run({"tokenize", "--model", kTok + "ggml-vocab-llama-spm.gguf", "--ids",
                                       "1,15043,3186", "--no-special", "-o", "json"});
  ASSERT_EQ(skip.exit_code, 0) << skip.err;
  EXPECT_EQ(nlohmann::json::parse(skip.out)["text"], "Hello world");
}

TEST(CliTokenize, AModelsWeightsAreNotNeeded) {
  // A whole model's GGUF: its vocabulary only is read (the test models' stub: <t0>..<t255>).
  const testing::RunResult r =
      run({"tokenize", "--model", std::string(MOEKIT_TEST_DATA_DIR) + "/models/qwen3moe.f32.gguf", "--ids", "0,255"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<t0><t255>\n");
}

TEST(CliTokenize, ABadModelOrTextIsOneNamedError) {
  const auto expect_error = [](const testing::RunResult& r, const std::string& named) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("moekit: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos) << r.err;
  };
  expect_error(run({"tokenize", "--model", "/no/such/model", "--text", "hi"}),
               "/no/such/model: no such file or folder");
  expect_error(run({"tokenize", "--model", kTok + "mixtral/reference.json", "--text", "hi"}),
               "is neither a GGUF file (*.gguf) nor a folder with tokenizer.json");
  expect_error(run({"tokenize", "--model", kTok + "qwen3"}),
               "[moekit tokenize] give one of --text, --text-file or --ids");
  expect_error(run({"tokenize", "--model", kTok + "qwen3", "--ids", "1,99999"}),
               "token id 99999 at 1 outside the vocabulary");
  expect_error(run({"tokenize", "--model", kTok + "qwen3", "--text-file", "/no/such/file"}),
               "[moekit tokenize] --text-file '/no/such/file' cannot be read");
  const testing::TempDir dir("cli_tokenize_bad");
  std::ofstream(dir.file("bad.txt"), std::ios::binary) << "ok \xFF";
  expect_error(run({"tokenize", "--model", kTok + "qwen3", "--text-file", dir.file("bad.txt")}),
               "not valid UTF-8: byte 0xff at offset 3");
}

}  // namespace
}  // namespace moekit
