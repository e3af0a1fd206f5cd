// Bad tokenizer files and bad input: each a named error (never a crash), from GGUF images built
// field by field and tokenizer.json files written here; and the regex bridge to Oniguruma.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "io/gguf_writer.hpp"
#include "io/safetensors_writer.hpp"
#include "moekit/gguf.hpp"
#include "moekit/tokenizer.hpp"
#include "tokenizer/regex.hpp"

namespace moekit {
namespace {

using testing::GgufImage;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// A small valid byte-level vocabulary: the byte alphabet's "h", "i", "hi", a control token.
GgufImage vocab(const std::string& model = "gpt2", const std::string& pre = "qwen2") {
  GgufImage g;
  g.str("general.architecture", "qwen2").str("tokenizer.ggml.model", model).str("tokenizer.ggml.pre", pre);
  return g;
}

std::string from_image(const GgufImage& g) {
  return error_of([&] { Tokenizer::from_gguf(*GgufFile::from_bytes(g.image(), "bad.gguf")); });
}

const std::vector<std::string> kTokens = {"h", "i", "hi", "<|im_end|>"};

TEST(TokenizerErrors, AGgufItCannotReadIsANamedError) {
  {
    GgufImage g = vocab("bert");
    g.strs("tokenizer.ggml.tokens", kTokens);
    const std::string e = from_image(g);
    EXPECT_NE(e.find("bad.gguf"), std::string::npos) << e;
    EXPECT_NE(e.find("tokenizer.ggml.model 'bert'"), std::string::npos) << e;
    EXPECT_NE(e.find("gpt2"), std::string::npos) << e;
  }
  {
    GgufImage g = vocab("gpt2", "frobnicate");
    g.strs("tokenizer.ggml.tokens", kTokens);
    const std::string e = from_image(g);
    EXPECT_NE(e.find("tokenizer.ggml.pre 'frobnicate'"), std::string::npos) << e;
    EXPECT_NE(e.find("qwen2"), std::string::npos) << e;  // the known names are listed
  }
  {
    GgufImage g;
    g.str("general.architecture", "qwen2");
    EXPECT_NE(from_image(g).find("has no tokenizer"), std::string::npos);
  }
  {
    GgufImage g = vocab();
    g.i32s("tokenizer.ggml.tokens", {1, 2, 3});  // not strings
    EXPECT_NE(from_image(g).find("tokenizer.ggml.tokens is arr[i32, 3]"), std::string::npos) << from_image(g);
  }
  {
    GgufImage g = vocab();
    g.strs("tokenizer.ggml.tokens", kTokens).i32s("tokenizer.ggml.token_type", {1, 1, 1});
    const std::string e = from_image(g);
    EXPECT_NE(e.find("tokenizer.ggml.token_type has 3 elements for 4 tokens (truncated)"), std::string::npos) << e;
  }
  {
    GgufImage g = vocab("llama");
    g.strs("tokenizer.ggml.tokens", kTokens).f32s("tokenizer.ggml.scores", {0.0f});
    EXPECT_NE(from_image(g).find("tokenizer.ggml.scores has 1 elements"), std::string::npos);
  }
  {
    GgufImage g = vocab();
    g.strs("tokenizer.ggml.tokens", kTokens).strs("tokenizer.ggml.merges", {"h i", "hi"});
    const std::string e = from_image(g);
    EXPECT_NE(e.find("tokenizer.ggml.merges[1] 'hi' is not two pieces"), std::string::npos) << e;
  }
  {
    GgufImage g = vocab();
    g.strs("tokenizer.ggml.tokens", {"h", "i", "h"});
    EXPECT_NE(from_image(g).find("tokenizer.ggml.tokens[2] 'h' repeats token 0"), std::string::npos);
  }
  {
    GgufImage g = vocab("llama");
    g.strs("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "<0xZZ>"}).i32s("tokenizer.ggml.token_type", {2, 3, 3, 6});
    EXPECT_NE(from_image(g).find("'<0xZZ>' has token type byte but is not <0xXX>"), std::string::npos);
  }
  {
    GgufImage g = vocab();
    g.strs("tokenizer.ggml.tokens", kTokens).u32("tokenizer.ggml.eos_token_id", 4);
    const std::string e = from_image(g);
    EXPECT_NE(e.find("tokenizer.ggml.eos_token_id = 4 is outside the vocabulary [0, 4)"), std::string::npos) << e;
  }
  {
    GgufImage g = vocab();
    g.strs("tokenizer.ggml.tokens", kTokens).boolean("tokenizer.ggml.add_bos_token", true);
    EXPECT_NE(from_image(g).find("add_bos_token is true but the file has no BOS id"), std::string::npos);
  }
}

TEST(TokenizerErrors, AMergeOfPiecesWithoutTokensStillMerges) {
  // llama.cpp merges by text: "h" + "i" merges although "hi" is no token, and falls back to the
  // pieces' single-byte tokens at the end.
  GgufImage g = vocab();
  g.strs("tokenizer.ggml.tokens", {"h", "i", "x"}).strs("tokenizer.ggml.merges", {"h i"});
  const auto tok = Tokenizer::from_gguf(*GgufFile::from_bytes(g.image(), "m.gguf"));
  EXPECT_EQ(tok->encode("hix", false), (std::vector<std::int32_t>{0, 1, 2}));
}

// The chat template a GGUF carries (tokenizer.chat_template) comes back as stored; one that is not a
// string is named.
TEST(TokenizerErrors, TheChatTemplateIsReadAndAWrongTypeNamed) {
  GgufImage g = vocab();
  g.strs("tokenizer.ggml.tokens", {"h", "i", "x"}).strs("tokenizer.ggml.merges", {"h i"});
  EXPECT_EQ(Tokenizer::from_gguf(*GgufFile::from_bytes(g.image(), "m.gguf"))->chat_template(), "");
  const std::string tmpl = "{% for m in messages %}{{ m.content }}{% endfor %}";
  GgufImage with = g;
  with.str("tokenizer.chat_template", tmpl);
  EXPECT_EQ(Tokenizer::from_gguf(*GgufFile::from_bytes(with.image(), "m.gguf"))->chat_template(), tmpl);
  GgufImage bad = g;
  bad.i32s("tokenizer.chat_template", {1});
  EXPECT_NE(from_image(bad).find("tokenizer.chat_template is"), std::string::npos) << from_image(bad);
}

TEST(TokenizerErrors, BadInputIsANamedError) {
  GgufImage g = vocab();
  g.strs("tokenizer.ggml.tokens", kTokens).i32s("tokenizer.ggml.token_type", {1, 1, 1, 3});
  g.strs("tokenizer.ggml.merges", {"h i"});
  const auto tok = Tokenizer::from_gguf(*GgufFile::from_bytes(g.image(), "m.gguf"));
  EXPECT_EQ(tok->encode("hi<|im_end|>"), (std::vector<std::int32_t>{2, 3}));
  // Not UTF-8: named with the byte and its offset.
  for (const std::string& bad : {std::string("hi\xFFthere"), std::string("hi\xC3"), std::string("hi\xED\xA0\x80"),
                                 std::string("hi\xC0\xAF"), std::string("hi\xF4\x90\x80\x80")}) {
    const std::string e = error_of([&] { tok->encode(bad); });
    EXPECT_NE(e.find("not valid UTF-8"), std::string::npos) << e;
    EXPECT_NE(e.find("at offset 2"), std::string::npos) << e;
    EXPECT_THROW(tok->encode(bad), std::invalid_argument);
  }
  // Ids outside the vocabulary.
  const std::vector<std::int32_t> ids = {0, 4};
  EXPECT_NE(error_of([&] { tok->decode(ids); }).find("token id 4 at 1 outside the vocabulary [0, 4)"),
            std::string::npos);
  EXPECT_THROW(tok->decode(std::vector<std::int32_t>{-1}), std::out_of_range);
  EXPECT_THROW(tok->token_bytes(7), std::out_of_range);
  EXPECT_THROW(tok->token_text(-3), std::out_of_range);
  EXPECT_EQ(tok->find("no such token"), -1);
}

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A minimal byte-level tokenizer.json with `part` replacing one of its components.
std::string tokenizer_json(const std::string& key, const std::string& value) {
  std::string model = R"({"type": "BPE", "vocab": {"h": 0, "i": 1, "hi": 2}, "merges": ["h i"]})";
  std::string normalizer = "null", pre = R"({"type": "ByteLevel", "add_prefix_space": false})";
  std::string post = "null", decoder = R"({"type": "ByteLevel"})";
  if (key == "model") model = value;
  if (key == "normalizer") normalizer = value;
  if (key == "pre_tokenizer") pre = value;
  if (key == "post_processor") post = value;
  if (key == "decoder") decoder = value;
  return R"({"added_tokens": [], "normalizer": )" + normalizer + R"(, "pre_tokenizer": )" + pre +
         R"(, "post_processor": )" + post + R"(, "decoder": )" + decoder + R"(, "model": )" + model + "}";
}

TEST(TokenizerErrors, AFolderItCannotRunIsANamedError) {
  const testing::TempDir dir("tokenizer_errors");
  const auto error = [&](const std::string& json_text) {
    write(dir.path() / "tokenizer.json", json_text);
    return error_of([&] { Tokenizer::from_folder(dir.path().string()); });
  };
  EXPECT_EQ(error(tokenizer_json("", "")), "(no error)");
  EXPECT_NE(error(tokenizer_json("model", R"({"type": "WordPiece", "vocab": {}})"))
                .find("model 'WordPiece' is not supported"),
            std::string::npos);
  EXPECT_NE(
      error(tokenizer_json("normalizer", R"({"type": "Lowercase"})")).find("normalizer 'Lowercase' is not supported"),
      std::string::npos);
  EXPECT_NE(error(tokenizer_json("pre_tokenizer", R"({"type": "Whitespace"})")).find("pre-tokenizer 'Whitespace'"),
            std::string::npos);
  EXPECT_NE(
      error(tokenizer_json("post_processor", R"({"type": "BertProcessing"})")).find("post-processor 'BertProcessing'"),
      std::string::npos);
  EXPECT_NE(error(tokenizer_json("decoder", R"({"type": "WordPiece"})")).find("decoder 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error(tokenizer_json("model", R"({"type": "BPE", "vocab": {"h": 0}, "merges": ["h i"]})"))
                .find("model.merges[0] ('h' + 'i'): 'i' is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(
      error(tokenizer_json("model", R"({"type": "BPE", "vocab": {"h": -4}, "merges": []})")).find("model.vocab['h']"),
      std::string::npos);
  EXPECT_NE(error(tokenizer_json("pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "(unclosed"},
                                                      "behavior": "Isolated"})"))
                .find("does not compile"),
            std::string::npos);
  EXPECT_NE(error("{ not json").find("is not JSON"), std::string::npos);
  EXPECT_NE(error(R"({"model": {"type": "BPE", "vocab": {"h": "zero"}, "merges": []}})").find("not a token id"),
            std::string::npos);
  std::filesystem::remove(dir.path() / "tokenizer.json");
  EXPECT_NE(error_of([&] { Tokenizer::from_folder(dir.path().string()); }).find("no tokenizer.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::open("/no/such/model"); }).find("/no/such/model: no such file or folder"),
            std::string::npos);
}

TEST(TokenizerRegex, OnigurumasSpacesIncludeNextLine) {
  EXPECT_EQ(tok::onig_compatible(R"(\s+(?!\S)|[^\s\p{L}]+)"), R"([\s\x{85}]+(?![^\s\x{85}])|[^\s\x{85}\p{L}]+)");
  EXPECT_EQ(tok::onig_compatible(R"([]\s]\\s\Q\s\E)"), R"([]\s\x{85}]\\s\Q\s\E)");
  const auto re = tok::Regex::compile(R"(\s+)", "test");
  std::vector<std::pair<std::size_t, std::size_t>> m;
  re->find_all("a\xC2\x85 b", m);  // U+0085, then a space
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<std::size_t, std::size_t>{1, 4}));
}

}  // namespace
}  // namespace moekit
