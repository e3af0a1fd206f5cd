// The tokenizers against their references, never against moekit itself (tests/goldens/tokenizer,
// made by make_tokenizer_goldens.py):
//  - llama.cpp's vocabulary tests: every text of ggml-vocab-*.gguf.inp gives the .gguf.out ids
//    (add_special and parse_special off, as llama.cpp's test-tokenizer-0 runs them);
//  - the tokenizers library's ids for more texts (special tokens in text, emoji, CJK, non-NFC text,
//    whitespace runs, code), three ways (plain, with the BOS / EOS rule, special tokens as text),
//    for those vocabularies and for seven small tokenizers shaped as moekit's families' releases,
//    each read both from its folder (tokenizer.json) and from its GGUF;
//  - decode against the library's decode, token bytes against the vocabulary's spelling,
//    streaming decode against decode, the end-of-generation sets against llama.cpp's rules.
#include "moekit/tokenizer.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/gguf.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/tokenizer_impl.hpp"
#include "tokenizer/unicode.hpp"
#include "util/files.hpp"

namespace moekit {
namespace {

using json = nlohmann::json;
const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/tokenizer/";

using testing::load_json;
using testing::slurp_file;

std::shared_ptr<const Tokenizer> gguf_tokenizer(const std::string& path) {
  return Tokenizer::from_gguf(*GgufFile::open(path));
}

std::string ids_text(const std::vector<std::int32_t>& ids) {
  std::string s;
  for (const std::int32_t id : ids) {  // piecewise: GCC 12 warns falsely (-Wrestrict) on "literal" + string
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// The texts of a .inp file: each followed by the line __ggml_vocab_test__.
std::vector<std::string> read_inp(const std::string& path) {
  const std::string raw = slurp_file(path), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (std::size_t pos = 0; pos < raw.size();) {
    const std::size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(raw.substr(pos));
      break;
    }
    texts.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return texts;
}

std::vector<std::vector<std::int32_t>> read_out(const std::string& path) {
  std::vector<std::vector<std::int32_t>> out;
  std::istringstream in(slurp_file(path));
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::int32_t> ids;
    for (std::int32_t id; words >> id;) ids.push_back(id);
    out.push_back(ids);
  }
  return out;
}

const std::vector<std::string> kVocabs = {"llama-spm", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "gpt-2"};
const std::vector<std::string> kStyles = {"qwen3", "mixtral", "gpt-oss", "llama4", "glm45", "minimax-m2", "olmoe"};

TEST(TokenizerGguf, EveryLlamaCppVocabTextGivesTheOutIds) {
  for (const std::string& name : kVocabs) {
    const std::string path = kDir + "ggml-vocab-" + name + ".gguf";
    const auto tok = gguf_tokenizer(path);
    const std::vector<std::string> texts = read_inp(path + ".inp");
    const auto want = read_out(path + ".out");
    ASSERT_EQ(texts.size(), want.size()) << name;
    ASSERT_GE(texts.size(), 46u) << name;
    for (std::size_t i = 0; i < texts.size(); ++i)
      EXPECT_EQ(ids_text(tok->encode(texts[i], false, false)), ids_text(want[i]))
          << name << " text " << i << ": '" << texts[i] << "'";
  }
}

TEST(TokenizerGguf, Qwen35sTextsGiveTheirOutIds) {
  // llama.cpp's qwen35 vocabulary is its qwen2 one with tokenizer.ggml.pre "qwen35" (the generator
  // checked it byte for byte): rebuilt here from the qwen2 file, the one value changed.
  std::string bytes = slurp_file(kDir + "ggml-vocab-qwen2.gguf");
  const std::string key = "tokenizer.ggml.pre";
  const std::size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::size_t value = at + key.size() + 4;  // after the key, its u32 type (string)
  ASSERT_EQ(bytes.substr(value, 13), std::string("\x05\0\0\0\0\0\0\0qwen2", 13));
  bytes.replace(value, 13, std::string("\x06\0\0\0\0\0\0\0qwen35", 14));
  const auto file =
      GgufFile::from_bytes(std::vector<std::uint8_t>(bytes.begin(), bytes.end()), "ggml-vocab-qwen35.gguf");
  const auto tok = Tokenizer::from_gguf(*file);
  EXPECT_NE(tok->describe().find("pre 'qwen35'"), std::string::npos);
  const std::vector<std::string> texts = read_inp(kDir + "ggml-vocab-qwen35.gguf.inp");
  const auto want = read_out(kDir + "ggml-vocab-qwen35.gguf.out");
  ASSERT_EQ(texts.size(), want.size());
  ASSERT_EQ(texts.size(), 50u);
  for (std::size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(ids_text(tok->encode(texts[i], false, false)), ids_text(want[i]))
        << "text " << i << ": '" << texts[i] << "'";
}

// Whether NFC changes `text` (a release that normalizes and a GGUF, which cannot say so, differ).
bool not_nfc(const std::string& text) { return tok::normalize(text, tok::NormalForm::nfc) != text; }

// Which comparisons of a text moekit's reading is meant to fail (see the callers).
struct Differs {
  bool parsed = false;    // with parse_special
  bool no_parse = false;  // without
};

// encode three ways and decode, against a reference's "plain", "special", "no_parse", "decode".
template <typename Why>
void expect_reference(const Tokenizer& tok, const json& ref, const json& texts, const std::string& what,
                      Why&& differs) {
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const std::string where = what + " text " + std::to_string(i) + " '" + text + "'";
    const Differs d = differs(text);
    const auto plain = ref["plain"][i].get<std::vector<std::int32_t>>();
    if (!d.parsed) {
      EXPECT_EQ(ids_text(tok.encode(text, false, true)), ids_text(plain)) << where << " (plain)";
      EXPECT_EQ(ids_text(tok.encode(text, true, true)), ids_text(ref["special"][i].get<std::vector<std::int32_t>>()))
          << where << " (with BOS/EOS)";
    }
    if (!d.no_parse) {
      EXPECT_EQ(ids_text(tok.encode(text, false, false)), ids_text(ref["no_parse"][i].get<std::vector<std::int32_t>>()))
          << where << " (special tokens as text)";
    }
    // Added tokens decode as their text. The library runs them through its ByteLevel decoder too,
    // which changes those spelled with non-ASCII characters of the byte alphabet (DeepSeek's
    // user-defined "ö" becomes the byte F6, then U+FFFD): not compared.
    bool added = false;
    for (const std::int32_t id : plain) added = added || tok.token_type(id) == TokenType::user_defined;
    if (ref.contains("decode") && !d.parsed && !added) {
      EXPECT_EQ(tok::utf8_lossy(tok.decode(plain)), ref["decode"][i].get<std::string>()) << where << " (decode)";
    }
  }
}

// Kimi-K2's pre-tokenizer ("kimi-k2"): its tiktoken pattern intersects classes with `&&`, which
// moekit spells for PCRE2 with lookaheads; the spans must be those Python's `regex` gives for the
// original (make_tokenizer_goldens.py, kimi_k2_splits).
TEST(TokenizerGguf, KimiK2sSplitIsItsTiktokenPatterns) {
  std::ifstream f(kDir + "kimi_k2_splits.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<std::string> regexes = tok::gguf_pre_regexes("kimi-k2");
  ASSERT_EQ(regexes.size(), 1u);
  const std::shared_ptr<const tok::Regex> re = tok::Regex::compile(regexes[0], "kimi-k2");
  for (const nlohmann::json& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    re->find_all(text, spans);
    std::vector<std::pair<std::size_t, std::size_t>> want;
    for (const nlohmann::json& s : c["spans"]) want.emplace_back(s[0].get<std::size_t>(), s[1].get<std::size_t>());
    EXPECT_EQ(spans, want) << text;
  }
}

TEST(TokenizerGguf, MoreTextsGiveTheTokenizersLibrarysIds) {
  const json ref = load_json(kDir + "gguf_reference.json");
  for (const std::string& name : kVocabs) {
    SCOPED_TRACE(name);
    const auto tok = gguf_tokenizer(kDir + "ggml-vocab-" + name + ".gguf");
    // Qwen's vocabulary has an ordinary token "</s>"; llama.cpp makes it a control token (its
    // end-of-generation names list it), so with parse_special it is that one token in text. And
    // Qwen's tokenizer.json normalizes to NFC, which a GGUF does not say (nor llama.cpp do).
    const auto qwen_s = [&](const std::string& text) {
      const bool nfc = name == "qwen2" && not_nfc(text);
      return Differs{nfc || (name == "qwen2" && text.find("</s>") != std::string::npos), nfc};
    };
    expect_reference(*tok, ref["vocabs"][name], ref["texts"], name, qwen_s);
    if (name == "qwen2") {
      EXPECT_EQ(tok->encode("</s>", false, true), (std::vector<std::int32_t>{128247}));
    }
  }
}

TEST(TokenizerStyles, FoldersGiveTheTokenizersLibrarysIds) {
  for (const std::string& style : kStyles) {
    SCOPED_TRACE(style);
    const json ref = load_json(kDir + style + "/reference.json");
    const auto tok = Tokenizer::from_folder(kDir + style);
    expect_reference(*tok, ref, ref["texts"], style + " folder", [](const std::string&) { return Differs{}; });
  }
}

TEST(TokenizerStyles, TheOtherComponentsGiveTheTokenizersLibrarysIds) {
  // NFKC, a regex Replace, Digits, every Split behavior, ByteLevel's prefix space, lstrip / rstrip
  // / single_word / normalized added tokens, a BOS + EOS template; Metaspace and its decoder.
  for (const char* style : {"features-bytelevel", "features-metaspace"}) {
    SCOPED_TRACE(style);
    const json ref = load_json(kDir + style + "/reference.json");
    const auto tok = Tokenizer::from_folder(kDir + style);
    expect_reference(*tok, ref, ref["texts"], std::string(style), [](const std::string&) { return Differs{}; });
  }
  const auto bytes = Tokenizer::from_folder(kDir + "features-bytelevel");
  EXPECT_TRUE(bytes->adds_bos());
  EXPECT_TRUE(bytes->adds_eos());
  EXPECT_EQ(bytes->token_type(bytes->find("word")), TokenType::user_defined);
}

TEST(TokenizerStyles, GgufsAsTheConverterWritesThemGiveTheSameIds) {
  for (const std::string& style : kStyles) {
    SCOPED_TRACE(style);
    const json ref = load_json(kDir + style + "/reference.json");
    const auto tok = gguf_tokenizer(kDir + style + "/vocab.gguf");
    // llama.cpp makes gpt-oss's <|channel|>, <|message|>, <|start|>, <|constrain|> (and <|end|>,
    // no longer an end of generation) user-defined tokens: matched in text even without
    // parse_special, where the tokenizers library leaves them to be text.
    // And Qwen's NFC is not in its GGUF (as for the full vocabulary above).
    const auto harmony = [&](const std::string& text) {
      Differs d;
      for (const char* t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"})
        d.no_parse = d.no_parse || (style == "gpt-oss" && text.find(t) != std::string::npos);
      if (style == "qwen3" && not_nfc(text)) d.parsed = d.no_parse = true;
      return d;
    };
    expect_reference(*tok, ref, ref["texts"], style + " gguf", harmony);
  }
}

TEST(TokenizerStyles, TheThreeGpt4oPreNamesSplitAlike) {
  // gpt-oss, llama4 and minimax-m2 share the o200k split; their GGUFs name it three ways.
  EXPECT_NE(gguf_tokenizer(kDir + "gpt-oss/vocab.gguf")->describe().find("pre 'gpt-4o'"), std::string::npos);
  EXPECT_NE(gguf_tokenizer(kDir + "llama4/vocab.gguf")->describe().find("pre 'llama4'"), std::string::npos);
  EXPECT_NE(gguf_tokenizer(kDir + "minimax-m2/vocab.gguf")->describe().find("pre 'minimax-m2'"), std::string::npos);
}

// The ids of named tokens, sorted.
std::vector<std::int32_t> ids_of(const Tokenizer& tok, const std::vector<std::string>& names) {
  std::vector<std::int32_t> ids;
  for (const std::string& n : names) {
    const std::int32_t id = tok.find(n);
    EXPECT_GE(id, 0) << n;
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(TokenizerEog, LlamaCppsEndOfGenerationSets) {
  const std::map<std::string, std::vector<std::string>> want = {
      // eos, <|im_end|> and <|endoftext|> by name, and the FIM pad / repo / file-separator tokens
      {"qwen3", {"<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}},
      // <|end|> ends a message, not the generation, where <|return|> and <|call|> exist
      {"gpt-oss", {"<|endoftext|>", "<|return|>", "<|call|>"}},
      {"llama4", {"<|end_of_text|>", "<|eot|>"}},
      // the converter's eot <|user|> and eom <|observation|>
      {"glm45", {"<|endoftext|>", "<|user|>", "<|observation|>"}},
      {"minimax-m2", {"[e~["}},
      {"olmoe", {"<|endoftext|>"}},
      {"mixtral", {"</s>"}},
  };
  for (const auto& [style, names] : want) {
    const auto tok = gguf_tokenizer(kDir + style + "/vocab.gguf");
    EXPECT_EQ(tok->end_of_generation(), ids_of(*tok, names)) << style;
    for (const std::int32_t id : tok->end_of_generation()) EXPECT_TRUE(tok->is_end_of_generation(id));
  }
  // The folders: the same rules, plus generation_config.json's eos ids.
  const auto qwen = Tokenizer::from_folder(kDir + "qwen3");
  EXPECT_EQ(qwen->end_of_generation(), ids_of(*qwen, want.at("qwen3")));
  EXPECT_EQ(qwen->eos(), qwen->find("<|im_end|>"));
  EXPECT_EQ(qwen->bos(), -1);
  const auto llama4 = Tokenizer::from_folder(kDir + "llama4");
  EXPECT_EQ(llama4->end_of_generation(), ids_of(*llama4, {"<|end_of_text|>", "<|eom|>", "<|eot|>"}));
  const auto oss = Tokenizer::from_folder(kDir + "gpt-oss");
  EXPECT_FALSE(oss->is_end_of_generation(oss->find("<|end|>")));
  EXPECT_TRUE(oss->is_end_of_generation(oss->find("<|return|>")));
  // The full Qwen2 vocabulary: <|endoftext|> (eos), <|im_end|>, and its ordinary "</s>" token,
  // which llama.cpp's list of names catches too.
  const auto qwen2 = gguf_tokenizer(kDir + "ggml-vocab-qwen2.gguf");
  EXPECT_EQ(qwen2->end_of_generation(), (std::vector<std::int32_t>{128247, 151643, 151645}));
  EXPECT_EQ(qwen2->token_text(128247), "</s>");
  EXPECT_EQ(qwen2->token_type(128247), TokenType::control);
}

TEST(TokenizerSpecials, BosAndEosAsTheFilesSay) {
  const auto spm = gguf_tokenizer(kDir + "ggml-vocab-llama-spm.gguf");
  EXPECT_TRUE(spm->adds_bos());
  EXPECT_FALSE(spm->adds_eos());
  EXPECT_EQ(spm->bos(), 1);
  EXPECT_EQ(spm->eos(), 2);
  EXPECT_EQ(spm->unk(), 0);
  EXPECT_EQ(spm->encode("", true), (std::vector<std::int32_t>{1}));
  EXPECT_EQ(spm->encode("", false), (std::vector<std::int32_t>{}));
  const auto llama3 = gguf_tokenizer(kDir + "ggml-vocab-llama-bpe.gguf");  // llama-bpe: BOS by default
  EXPECT_TRUE(llama3->adds_bos());
  EXPECT_EQ(llama3->encode("Hi").front(), 128000);
  const auto qwen2 = gguf_tokenizer(kDir + "ggml-vocab-qwen2.gguf");
  EXPECT_FALSE(qwen2->adds_bos());
  EXPECT_NE(qwen2->describe().find("byte-level BPE, pre 'qwen2', 151936 tokens"), std::string::npos)
      << qwen2->describe();
  const auto mixtral = Tokenizer::from_folder(kDir + "mixtral");
  EXPECT_TRUE(mixtral->adds_bos());
  EXPECT_EQ(mixtral->bos(), 1);
  EXPECT_TRUE(mixtral->strips_leading_space());
  // parse_special: <|im_start|> is one token, or text.
  const std::vector<std::int32_t> parsed = qwen2->encode("<|im_start|>", false, true);
  EXPECT_EQ(parsed, (std::vector<std::int32_t>{151644}));
  EXPECT_GT(qwen2->encode("<|im_start|>", false, false).size(), 1u);
}

TEST(TokenizerDecode, EveryTokensBytesSpellItsVocabularyText) {
  for (const std::string& name : kVocabs) {
    const auto tok = gguf_tokenizer(kDir + "ggml-vocab-" + name + ".gguf");
    const bool spm = tok->strips_leading_space();
    std::size_t checked = 0;
    for (std::int32_t id = 0; id < tok->vocab_size(); ++id) {
      const std::string bytes = tok->token_bytes(id);
      std::string spelled;
      switch (tok->token_type(id)) {
        case TokenType::normal:
          if (spm) {
            for (const char c : bytes) spelled += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
          } else {
            for (const char c : bytes) spelled += tok::byte_level_char(static_cast<std::uint8_t>(c));
          }
          break;
        case TokenType::byte: {
          char buf[8];
          std::snprintf(buf, sizeof buf, "<0x%02X>", static_cast<unsigned char>(bytes.at(0)));
          spelled = buf;
          break;
        }
        default:
          spelled = bytes;  // special and user-defined tokens are their text
      }
      EXPECT_EQ(spelled, tok->token_text(id)) << name << " id " << id;
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<std::size_t>(tok->vocab_size()));
  }
}

TEST(TokenizerDecode, SpmDropsTheLeadingSpaceItsEncodingAdded) {
  const auto tok = gguf_tokenizer(kDir + "ggml-vocab-llama-spm.gguf");
  for (const char* text : {"Hello world", " Hello", "  two spaces", "\n newline"})
    EXPECT_EQ(tok->decode(tok->encode(text, false)), text);
  // With BOS: skipped as special, the space still goes; kept, the text follows it.
  EXPECT_EQ(tok->decode(tok->encode("Hello", true), true), "Hello");
  EXPECT_EQ(tok->decode(tok->encode("Hello", true)), "<s> Hello");
}

TEST(TokenizerStream, PushAndFlushEqualDecodeAndNeverCutACharacter) {
  std::size_t held_back = 0;
  for (const std::string& style : kStyles) {
    const json ref = load_json(kDir + style + "/reference.json");
    for (const bool folder : {true, false}) {
      const auto tok = folder ? Tokenizer::from_folder(kDir + style) : gguf_tokenizer(kDir + style + "/vocab.gguf");
      for (std::size_t i = 0; i < ref["texts"].size(); ++i) {
        const auto ids = ref["special"][i].get<std::vector<std::int32_t>>();
        for (const bool skip : {false, true}) {
          TextStream stream(tok, skip);
          std::string streamed;
          for (const std::int32_t id : ids) {
            const std::string piece = stream.push(id);
            EXPECT_EQ(tok::utf8_invalid_at(piece), std::string::npos) << style << " text " << i;
            held_back += piece.empty();
            streamed += piece;
          }
          streamed += stream.flush();
          const std::string whole = tok->decode(ids, skip);
          if (tok::utf8_invalid_at(whole) == std::string::npos) {
            EXPECT_EQ(streamed, whole) << style << " text " << i << (folder ? " folder" : " gguf");
          }
        }
      }
    }
  }
  EXPECT_GT(held_back, 0u);  // some emoji and CJK characters span several byte tokens
}

TEST(TokenizerStream, AnIncompleteCharacterWaitsAndABrokenOneIsReplaced) {
  const auto tok = gguf_tokenizer(kDir + "ggml-vocab-gpt-2.gguf");
  // "€" is E2 82 AC: three byte tokens of the byte alphabet.
  std::vector<std::int32_t> bytes;
  for (const char c : std::string("\xE2\x82\xAC"))
    bytes.push_back(tok->find(tok::byte_level_char(static_cast<std::uint8_t>(c))));
  TextStream s(tok);
  EXPECT_EQ(s.push(bytes[0]), "");
  EXPECT_EQ(s.push(bytes[1]), "");
  EXPECT_EQ(s.push(bytes[2]), "\xE2\x82\xAC");
  EXPECT_EQ(s.flush(), "");
  EXPECT_EQ(s.push(bytes[0]), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");         // the stream ended inside a character
  EXPECT_EQ(s.push(bytes[2]), "\xEF\xBF\xBD");  // a continuation byte alone can never complete
  EXPECT_THROW(s.push(999999), std::out_of_range);
}

TEST(TokenizerModels, TheTestModelsStubVocabularyOpens) {
  // tests/goldens/models/*.f32.gguf: gpt2, pre "default", 256 tokens <t0>..<t255>, no merges.
  for (const char* family :
       {"qwen3moe", "qwen2moe", "mixtral", "olmoe", "glm4moe", "gpt-oss", "minimax-m2", "llama4"}) {
    const auto tok = Tokenizer::open(std::string(MOEKIT_TEST_DATA_DIR) + "/models/" + family + ".f32.gguf");
    EXPECT_EQ(tok->vocab_size(), 256) << family;
    EXPECT_EQ(tok->bos(), -1);
    EXPECT_FALSE(tok->adds_bos());
    EXPECT_EQ(tok->decode(std::vector<std::int32_t>{0, 255}), "<t0><t255>");
    EXPECT_NE(tok->describe().find("pre 'default', 256 tokens, 0 merges"), std::string::npos) << tok->describe();
    EXPECT_NO_THROW(tok->encode("any text at all"));
  }
}

}  // namespace
}  // namespace moekit
