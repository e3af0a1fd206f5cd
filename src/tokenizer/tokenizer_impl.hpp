// The tokenizer's parts, shared by its two readers (gguf_vocab.cpp, hf_tokenizer.cpp) and its run
// (pipeline.cpp, bpe.cpp, tokenizer.cpp). A reader fills a Tokenizer::Impl; everything after that
// is the same code for a GGUF file and a tokenizer.json:
//
//   text -> added tokens cut out (raw matcher) -> each other piece normalized -> added tokens cut
//   out again (normalized matcher) -> pre-tokenizer steps -> words -> model -> ids -> BOS / EOS
//
// which is the tokenizers library's order (AddedVocabulary::extract_and_normalize, then
// pre_tokenize, model, post_process). llama.cpp's order is the same with no normalizer (a GGUF
// reads as llama.cpp's: SentencePiece's space prefix and ▁ are its only normalization) and every
// special token raw.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "moekit/tokenizer.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace moekit::tok {

/// Text -> id, looked up by string_view without a copy (C++20's heterogeneous lookup).
struct TextHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TextIds = std::unordered_map<std::string, std::int32_t, TextHash, std::equal_to<>>;

[[noreturn]] void fail(const std::string& source, const std::string& what);

// ---- Normalizer ------------------------------------------------------------------------------

struct NormStep {
  enum class Kind { form, prepend, replace };
  Kind kind = Kind::form;
  NormalForm form = NormalForm::nfc;
  std::string text;                    // prepend: what; replace: the replacement
  std::shared_ptr<const Regex> match;  // replace: what is replaced
};

/// `text` through the steps, in order.
std::string normalize(const std::vector<NormStep>& steps, std::string_view text);

// ---- Pre-tokenizer ---------------------------------------------------------------------------

/// The tokenizers library's SplitDelimiterBehavior.
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreStep {
  enum class Kind { split, byte_level, metaspace };
  Kind kind = Kind::split;
  // split: every match of `regex` (the non-matches too with `invert`), arranged by `behavior`
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  // byte_level: an optional leading space, GPT-2's split (use_regex), then bytes as characters
  bool add_prefix_space = false;
  bool use_regex = false;
  // metaspace: ' ' -> replacement, prepended per scheme, optionally split before each replacement
  std::string replacement = "\xE2\x96\x81";
  enum class Prepend { always, first, never } prepend = Prepend::always;
  bool split = false;
};

/// A word on its way through the pre-tokenizer: its text and whether it starts the input (the
/// Metaspace pre-tokenizer's "first" scheme).
struct Word {
  std::string text;
  bool at_start = false;
};

/// The GPT-2 split of byte-level BPE (the ByteLevel pre-tokenizer's use_regex).
std::shared_ptr<const Regex> gpt2_regex();

/// `words` through the steps, in order; empty words are dropped.
void pre_tokenize(const std::vector<PreStep>& steps, std::vector<Word>& words);

// ---- Added (special) tokens ------------------------------------------------------------------

struct AddedToken {
  std::int32_t id = -1;
  std::string content;   // as matched: the normalized content for a normalized token
  bool special = false;  // matched only with parse_special
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;  // matched in the normalized text (else in the raw text)
};

/// Leftmost-longest matching of a set of strings (a byte trie), as the tokenizers library's
/// Aho-Corasick matcher (MatchKind::LeftmostLongest) finds added tokens.
class Matcher {
 public:
  void add(std::string_view text, std::int32_t value);
  bool empty() const noexcept { return nodes_.size() <= 1; }
  /// The longest entry starting at `pos` that `accept(value)` allows: its value and length in
  /// `len`, or -1.
  template <typename Accept>
  std::int32_t longest_at(std::string_view s, std::size_t pos, std::size_t& len, Accept&& accept) const;

 private:
  struct Node {
    std::int32_t value = -1;
    std::vector<std::pair<unsigned char, std::int32_t>> next;  // sorted by byte
  };
  std::int32_t child(std::int32_t node, unsigned char b) const noexcept;
  std::vector<Node> nodes_{Node{}};
};

template <typename Accept>
std::int32_t Matcher::longest_at(std::string_view s, std::size_t pos, std::size_t& len, Accept&& accept) const {
  std::int32_t node = 0, best = -1;
  for (std::size_t i = pos; i < s.size(); ++i) {
    node = child(node, static_cast<unsigned char>(s[i]));
    if (node < 0) break;
    const std::int32_t v = nodes_[static_cast<std::size_t>(node)].value;
    if (v >= 0 && accept(v)) {
      best = v;
      len = i + 1 - pos;
    }
  }
  return best;
}

// ---- Model -----------------------------------------------------------------------------------

/// BPE (the tokenizers library's, or llama.cpp's for a `gpt2` GGUF) or llama.cpp's SentencePiece
/// merge by score (a `llama` GGUF).
struct Model {
  enum class Kind { bpe, spm };
  Kind kind = Kind::bpe;
  std::int32_t n_vocab = 0;
  /// Text -> id of what the model merges over: the model's vocabulary (a GGUF: every token), then
  /// strings only merges name (ids from n_vocab on, their text in `interned`; a GGUF only).
  TextIds vocab;
  std::vector<std::string> interned;
  struct Merge {
    std::int32_t rank = 0, result = 0;
  };
  std::unordered_map<std::uint64_t, Merge> merges;  // (left id << 32 | right id)
  std::vector<float> scores;                        // spm: per token
  bool byte_fallback = false;                       // a character outside the vocabulary as its bytes' <0xXX> tokens
  bool fuse_unk = false;                            // consecutive unknown characters as one unk
  bool ignore_merges = false;                       // a word that is a token is that token
  bool llama_fallback = false;  // llama.cpp's rule for pieces without a token: their single bytes' tokens
  std::int32_t unk = -1;

  std::int32_t lookup(std::string_view text) const noexcept;
  /// Adds a merge of rank `rank`, element `rank` of the file's array `key`. `strict`: both sides
  /// and the result must be tokens (the tokenizers library's rule; an error naming the element
  /// otherwise); else they are interned.
  void add_merge(std::string_view left, std::string_view right, std::int32_t rank, bool strict,
                 const std::string& source, const char* key);
  /// Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

 private:
  void encode_bpe(std::string_view word, std::vector<std::int32_t>& out) const;
  void encode_spm(std::string_view text, std::vector<std::int32_t>& out) const;
  void push_bytes(std::string_view piece, std::vector<std::int32_t>& out) const;
};

// ---- The whole tokenizer ---------------------------------------------------------------------

/// How a normal token's text turns into bytes.
enum class DecodeStyle {
  byte_level,  // GPT-2's alphabet undone
  metaspace,   // ▁ -> ' '
};

}  // namespace moekit::tok

namespace moekit {

struct Tokenizer::Impl {
  std::string source;  // the file or folder (messages)
  std::string kind;    // "byte-level BPE", "SentencePiece BPE", ...
  std::string pre;     // the GGUF pre-tokenizer name, or the tokenizer.json pre-tokenizer's type

  std::vector<std::string> texts;  // per id
  std::vector<TokenType> types;
  tok::TextIds ids;  // every token's text (find)

  std::vector<tok::NormStep> normalizer;
  std::vector<tok::PreStep> pre_steps;
  std::vector<tok::AddedToken> added;
  tok::Matcher raw_matcher, normalized_matcher;  // values: indices into `added`
  tok::Model model;
  std::int64_t n_merges = 0;

  tok::DecodeStyle decode_style = tok::DecodeStyle::byte_level;
  bool strip_leading_space = false;
  std::vector<std::int32_t> prefix, suffix;  // what add_special puts around the text

  std::int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  // Fill-in-the-middle tokens (a GGUF's keys, else found by their text): pad, repo and file
  // separator end a generation in llama.cpp.
  std::int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  std::vector<std::int32_t> extra_eog;  // a folder's generation_config.json eos ids
  std::string chat_template;            // the model's Jinja chat template, or empty
  std::vector<std::int32_t> eog;        // sorted

  /// Builds the matchers from `added` (contents final) and checks the parts against each other.
  void finish();
  void encode(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const;
  std::string bytes_of(std::int32_t id) const;
};

namespace tok {

/// llama.cpp's end-of-generation set for `t` (sorted into t.eog), from its special ids and token
/// texts; `gguf_attrs`: also llama.cpp's changes to the token types (the EOG-looking tokens made
/// control, gpt-oss's <|channel|> ... made user-defined).
void compute_end_of_generation(Tokenizer::Impl& t, bool gguf_attrs);

/// The regexes of llama.cpp's byte-level pre-tokenizer `pre` (tokenizer.ggml.pre), each an isolated
/// split applied in order; empty for a name moekit does not know (gguf_vocab.cpp). Exposed for tests.
std::vector<std::string> gguf_pre_regexes(const std::string& pre);

/// Whether `text` is SentencePiece's byte token "<0xXX>"; its byte in `b`.
bool parse_byte_token(std::string_view text, std::uint8_t& b) noexcept;

}  // namespace tok
}  // namespace moekit
