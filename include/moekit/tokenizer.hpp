// Tokenizers: text to token ids and back, exactly as the model's own tokenizer does it
// (docs/tokenizers.md).
//
// Two sources, one pipeline:
//  - a GGUF file's vocabulary (`tokenizer.ggml.*`), read as llama.cpp reads it: `gpt2` is byte-level
//    BPE split by the regexes of its `tokenizer.ggml.pre` name, `llama` is SentencePiece BPE
//    (merging by the merged piece's score, byte fallback);
//  - a Hugging Face folder's `tokenizer.json` (+ `tokenizer_config.json`, `generation_config.json`),
//    read as the `tokenizers` library runs it: normalizer, pre-tokenizer, BPE model, added tokens,
//    post-processor.
// Encoding: special (added) tokens are cut out of the text first, then each remaining piece is
// normalized, pre-tokenized into words and each word merged into tokens; BOS / EOS as the file says.
// Decoding: each token's raw bytes, concatenated.
//
// A tokenizer is immutable once built: every const method may run on several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moekit {

class GgufFile;

/// What a token is, with the numbering of llama.cpp's `tokenizer.ggml.token_type`.
enum class TokenType : std::uint8_t {
  undefined = 0,
  normal = 1,        ///< a piece of text the model merges into
  unknown = 2,       ///< the unknown token (<unk>)
  control = 3,       ///< special: BOS, EOS, <|im_start|>, ...; matched in text only with parse_special
  user_defined = 4,  ///< an added token that is not special: always matched in text, always decoded
  unused = 5,
  byte = 6,  ///< <0xXX>: one raw byte (SentencePiece's byte fallback)
};

/// "normal", "control", ... (messages).
const char* token_type_name(TokenType type) noexcept;

/// A model's tokenizer. Errors, when a tokenizer is read: std::runtime_error naming the file and the
/// key, component or token that is wrong or unsupported (a caller may treat that as "no tokenizer").
class Tokenizer {
 public:
  /// The tokenizer of a GGUF file's metadata: `tokenizer.ggml.model` (`gpt2` or `llama`), `.pre`,
  /// `.tokens`, `.token_type`, `.merges`, `.scores`, the bos / eos / eot / eom / unknown / padding
  /// ids, `.add_bos_token`, `.add_eos_token`, `.add_space_prefix`. A vocabulary-only file (no
  /// tensors) is enough. A model name or pre-tokenizer name moekit does not know is an error that
  /// names it and lists the known ones.
  static std::shared_ptr<const Tokenizer> from_gguf(const GgufFile& file);
  /// The tokenizer of a Hugging Face folder: `tokenizer.json` (model BPE, byte-level or
  /// SentencePiece-style with byte fallback), `tokenizer_config.json` for BOS / EOS where the
  /// post-processor does not say, `generation_config.json`'s eos ids for end_of_generation(). A
  /// component moekit does not run (a WordPiece or Unigram model, a BertNormalizer, ...) is an
  /// error that names it.
  static std::shared_ptr<const Tokenizer> from_folder(const std::string& dir);
  /// `path` a GGUF file (any part of a split model: the first part's metadata) or a folder with
  /// tokenizer.json. Reads only metadata and tokenizer files, never the weights.
  static std::shared_ptr<const Tokenizer> open(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// The ids of `text` (UTF-8). `add_special`: the file's own BOS / EOS rule (adds_bos(),
  /// adds_eos()). `parse_special`: control tokens written in the text (`<|im_start|>`) become their
  /// ids, as llama.cpp's llama_tokenize(..., parse_special = true) and the tokenizers library do;
  /// without it they are tokenized as text (user-defined tokens are matched either way). Throws
  /// std::invalid_argument for text that is not valid UTF-8 (naming the offset of the first bad
  /// byte): nothing is replaced silently.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = true) const;

  /// The raw bytes token `id` stands for: byte-level BPE's character-to-byte mapping undone,
  /// SentencePiece's ▁ turned into a space and <0xXX> into its byte; special and user-defined tokens
  /// as their text; unused tokens as nothing (as llama.cpp prints them). Throws std::out_of_range
  /// for an id outside [0, vocab_size()).
  std::string token_bytes(std::int32_t id) const;
  /// The token's text as the vocabulary stores it ("Ġthe", "▁the", "<0x0A>", "<|im_end|>").
  const std::string& token_text(std::int32_t id) const;
  TokenType token_type(std::int32_t id) const;
  /// The id whose vocabulary text is `text`, or -1.
  std::int32_t find(std::string_view text) const noexcept;

  /// The bytes of `ids`, concatenated; with `skip_special` control and unknown tokens are left
  /// out. A tokenizer that puts a space before the text (SentencePiece) removes one leading space
  /// from the result, as its decoder does. The result may be invalid UTF-8 where the ids end
  /// inside a character. Throws std::out_of_range naming the first id outside the vocabulary.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  std::int64_t vocab_size() const noexcept;
  /// Special ids, -1 where the file has none.
  std::int32_t bos() const noexcept;
  std::int32_t eos() const noexcept;
  std::int32_t eot() const noexcept;
  std::int32_t eom() const noexcept;
  std::int32_t unk() const noexcept;
  std::int32_t pad() const noexcept;
  /// Whether encode(add_special = true) puts BOS before the text / EOS after it.
  bool adds_bos() const noexcept;
  bool adds_eos() const noexcept;
  /// The ids that end a generation, sorted: llama.cpp's set (eos, eot, eom, the fill-in-the-middle
  /// pad / repo / file-separator tokens, and the control tokens named <|endoftext|>, <|im_end|>,
  /// <|eot_id|>, <|eom_id|>, <|end|>, <|return|>, <|call|>, <end_of_turn>, </s>, ...), plus a
  /// folder's generation_config.json eos ids.
  const std::vector<std::int32_t>& end_of_generation() const noexcept;
  bool is_end_of_generation(std::int32_t id) const noexcept;
  /// The model's Jinja chat template as its file stores it (a GGUF's tokenizer.chat_template; a
  /// folder's chat_template.jinja or tokenizer_config.json's chat_template), or "" where it has none.
  const std::string& chat_template() const noexcept;
  /// Whether decode() removes a leading space (see decode).
  bool strips_leading_space() const noexcept;

  /// "byte-level BPE, pre 'qwen2', 151936 tokens, 151387 merges, bos none, eos 151643
  /// '<|endoftext|>', adds bos no" (one line).
  std::string describe() const;

  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// Streaming detokenization: text as tokens arrive, never cutting a UTF-8 character in two.
/// Concatenating every push() and the final flush() gives decode() of the same ids, where that is
/// valid UTF-8; bytes that can never form a character come out as U+FFFD (one per maximal invalid
/// sequence, as Python's errors="replace" does).
class TextStream {
 public:
  explicit TextStream(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special = false);
  /// The bytes that now complete whole characters (an incomplete multi-byte sequence at the end is
  /// held back until it completes). Throws std::out_of_range for an id outside the vocabulary
  /// (the stream is unchanged then).
  std::string push(std::int32_t id);
  /// What is held back, an incomplete sequence as U+FFFD; the stream starts afresh.
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  bool started_ = false;  // a piece has been emitted (the leading-space rule applies once)
  std::string pending_;
};

}  // namespace moekit
