// Tokenizer's public side (moekit/tokenizer.hpp): encode / decode around the pipeline, the special
// ids, llama.cpp's end-of-generation set, streaming detokenization, and opening by path.
#include <algorithm>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "moekit/gguf.hpp"
#include "tokenizer/tokenizer_impl.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

const char* kHex = "0123456789abcdef";

void check_id(const Tokenizer::Impl& t, std::int32_t id, const char* fn) {
  if (id < 0 || static_cast<std::size_t>(id) >= t.texts.size())
    throw std::out_of_range(MOEKIT_MSG("[moekit::Tokenizer::" << fn << "] token id " << id
                                                              << " outside the vocabulary [0, " << t.texts.size()
                                                              << ")"));
}

bool is_special(TokenType t) { return t == TokenType::control || t == TokenType::unknown; }

}  // namespace

const char* token_type_name(TokenType type) noexcept {
  switch (type) {
    case TokenType::undefined:
      return "undefined";
    case TokenType::normal:
      return "normal";
    case TokenType::unknown:
      return "unknown";
    case TokenType::control:
      return "control";
    case TokenType::user_defined:
      return "user-defined";
    case TokenType::unused:
      return "unused";
    case TokenType::byte:
      return "byte";
  }
  return "?";
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    tok::fail(path, "no such file or folder (a tokenizer is a GGUF file or a folder with tokenizer.json)");
  if (fs::is_directory(path, ec)) return from_folder(path);
  if (fs::path(path).filename() == "tokenizer.json") return from_folder(fs::path(path).parent_path().string());
  if (!is_gguf_path(path)) tok::fail(path, "is neither a GGUF file (*.gguf) nor a folder with tokenizer.json");
  // A split model's metadata is its first part's; opening the model finds it from any part.
  const std::shared_ptr<const GgufModel> model = GgufModel::open(path);
  return from_gguf(model->first());
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const std::size_t bad = tok::utf8_invalid_at(text);
  if (bad != std::string_view::npos) {
    const auto b = static_cast<unsigned char>(text[bad]);
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Tokenizer::encode] the text is not valid UTF-8: byte 0x"
                                           << kHex[b >> 4] << kHex[b & 15] << " at offset " << bad));
  }
  std::vector<std::int32_t> out;
  if (add_special) out = impl_->prefix;
  impl_->encode(text, parse_special, out);
  if (add_special) out.insert(out.end(), impl_->suffix.begin(), impl_->suffix.end());
  return out;
}

std::string Tokenizer::Impl::bytes_of(std::int32_t id) const {
  const std::string& text = texts[static_cast<std::size_t>(id)];
  switch (types[static_cast<std::size_t>(id)]) {
    case TokenType::normal: {
      if (decode_style == tok::DecodeStyle::metaspace) {
        std::string r;
        for (std::size_t at = 0;;) {
          const std::size_t p = text.find("\xE2\x96\x81", at);
          r.append(text, at, p == std::string::npos ? std::string::npos : p - at);
          if (p == std::string::npos) break;
          r += ' ';
          at = p + 3;
        }
        return r;
      }
      // Byte-level: each character back to its byte; a token with a character outside the
      // alphabet is its text as it stands (the tokenizers library's ByteLevel decoder).
      if (tok::utf8_invalid_at(text) != std::string::npos) return text;
      std::string r;
      for (std::size_t i = 0; i < text.size();) {
        std::size_t len = 0;
        const int b = tok::byte_level_byte(tok::utf8_decode(text, i, len));
        if (b < 0) return text;
        r += static_cast<char>(b);
        i += len;
      }
      return r;
    }
    case TokenType::byte: {
      std::uint8_t b = 0;
      tok::parse_byte_token(text, b);  // checked when the vocabulary was read
      return std::string(1, static_cast<char>(b));
    }
    case TokenType::control:
    case TokenType::unknown:
    case TokenType::user_defined:
      return text;
    case TokenType::unused:
    case TokenType::undefined:
      break;
  }
  return {};  // llama.cpp prints unused and undefined tokens as nothing
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  check_id(*impl_, id, "token_bytes");
  return impl_->bytes_of(id);
}

const std::string& Tokenizer::token_text(std::int32_t id) const {
  check_id(*impl_, id, "token_text");
  return impl_->texts[static_cast<std::size_t>(id)];
}

TokenType Tokenizer::token_type(std::int32_t id) const {
  check_id(*impl_, id, "token_type");
  return impl_->types[static_cast<std::size_t>(id)];
}

std::int32_t Tokenizer::find(std::string_view text) const noexcept {
  const auto it = impl_->ids.find(text);
  return it == impl_->ids.end() ? -1 : it->second;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int32_t id = ids[i];
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->texts.size())
      throw std::out_of_range(MOEKIT_MSG("[moekit::Tokenizer::decode] token id "
                                         << id << " at " << i << " outside the vocabulary [0, " << impl_->texts.size()
                                         << ")"));
    if (skip_special && is_special(impl_->types[static_cast<std::size_t>(id)])) continue;
    out += impl_->bytes_of(id);
  }
  if (impl_->strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::int64_t Tokenizer::vocab_size() const noexcept { return static_cast<std::int64_t>(impl_->texts.size()); }
std::int32_t Tokenizer::bos() const noexcept { return impl_->bos; }
std::int32_t Tokenizer::eos() const noexcept { return impl_->eos; }
std::int32_t Tokenizer::eot() const noexcept { return impl_->eot; }
std::int32_t Tokenizer::eom() const noexcept { return impl_->eom; }
std::int32_t Tokenizer::unk() const noexcept { return impl_->unk; }
std::int32_t Tokenizer::pad() const noexcept { return impl_->pad; }
bool Tokenizer::adds_bos() const noexcept { return !impl_->prefix.empty(); }
const std::string& Tokenizer::chat_template() const noexcept { return impl_->chat_template; }
bool Tokenizer::adds_eos() const noexcept { return !impl_->suffix.empty(); }
const std::vector<std::int32_t>& Tokenizer::end_of_generation() const noexcept { return impl_->eog; }
bool Tokenizer::is_end_of_generation(std::int32_t id) const noexcept {
  return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}
bool Tokenizer::strips_leading_space() const noexcept { return impl_->strip_leading_space; }

std::string Tokenizer::describe() const {
  const Impl& t = *impl_;
  const auto named = [&](std::int32_t id) -> std::string {
    if (id < 0) return "none";
    return MOEKIT_MSG(id << " '" << tok::utf8_lossy(t.texts[static_cast<std::size_t>(id)]) << "'");
  };
  return MOEKIT_MSG(t.kind << ", pre '" << t.pre << "', " << t.texts.size() << " tokens, " << t.n_merges
                           << " merges, bos " << named(t.bos) << ", eos " << named(t.eos) << ", adds bos "
                           << (adds_bos() ? "yes" : "no") << ", " << t.eog.size() << " end-of-generation tokens");
}

// ---- End of generation -----------------------------------------------------------------------

namespace tok {

void compute_end_of_generation(Tokenizer::Impl& t, bool gguf_attrs) {
  const auto find = [&](std::string_view text) {
    const auto it = t.ids.find(text);
    return it == t.ids.end() ? -1 : it->second;
  };
  // llama.cpp marks the tokens it recognizes by their text as control (load(), "auto-detect special
  // tokens by text"); a tokenizer.json's own flags stand as they are.
  const auto make_control = [&](std::int32_t id) {
    if (gguf_attrs && id >= 0) t.types[static_cast<std::size_t>(id)] = TokenType::control;
  };
  // The first of `names` the vocabulary has (llama.cpp takes whichever its hash map meets first).
  const auto detect = [&](std::int32_t& id, std::initializer_list<std::string_view> names) {
    if (id >= 0) return;
    for (const std::string_view n : names) {
      id = find(n);
      if (id >= 0) break;
    }
    make_control(id);
  };
  detect(t.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
                 "_<EOT>", "[EOT]",
                 "<\xEF\xBD\x9C"
                 "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                 "<end_of_utterance>"});
  detect(t.eom, {"<|eom_id|>"});
  std::int32_t fim_pre = t.fim_pre, fim_suf = t.fim_suf, fim_mid = t.fim_mid;
  detect(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                   "<\xEF\xBD\x9C"
                   "fim\xE2\x96\x81"
                   "begin\xEF\xBD\x9C>",
                   "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                   "<\xEF\xBD\x9C"
                   "fim\xE2\x96\x81"
                   "hole\xEF\xBD\x9C>",
                   "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                   "<\xEF\xBD\x9C"
                   "fim\xE2\x96\x81"
                   "end\xEF\xBD\x9C>",
                   "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  detect(t.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(t.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(t.fim_sep, {"<|file_sep|>"});

  std::set<std::int32_t> eog;
  for (const std::int32_t id : {t.fim_pad, t.fim_rep, t.fim_sep})
    if (id >= 0) eog.insert(id);
  for (const std::string_view name : {"<|eot_id|>",
                                      "<|im_end|>",
                                      "<|end|>",
                                      "<|return|>",
                                      "<|call|>",
                                      "<|flush|>",
                                      "<|calls|>",
                                      "<end_of_turn>",
                                      "<|endoftext|>",
                                      "</s>",
                                      "<|eom_id|>",
                                      "<EOT>",
                                      "_<EOT>",
                                      "[EOT]",
                                      "[EOS]",
                                      "<|end_of_text|>",
                                      "<end_of_utterance>",
                                      "<eos>",
                                      "<turn|>",
                                      "<|tool_response>",
                                      "<\xEF\xBD\x9C"
                                      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                      "[e~["}) {
    const std::int32_t id = find(name);
    if (id < 0) continue;
    eog.insert(id);
    make_control(id);
  }
  // gpt-oss's harmony tokens are printed, not hidden (llama.cpp makes them user-defined).
  if (gguf_attrs)
    for (const std::string_view name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
      if (const std::int32_t id = find(name); id >= 0) t.types[static_cast<std::size_t>(id)] = TokenType::user_defined;
  for (const std::int32_t id : {t.eos, t.eot, t.eom})
    if (id >= 0) eog.insert(id);
  for (const std::int32_t id : t.extra_eog) eog.insert(id);

  // With <|return|> and <|call|> (gpt-oss), or <|calls|> and <|flush|> (solar-open), <|end|> ends a
  // message, not the generation.
  bool has_return = false, has_call = false, has_flush = false;
  std::int32_t end_id = -1, s_id = -1;
  bool has_normal_s = false;
  for (const std::int32_t id : eog) {
    const std::string& text = t.texts[static_cast<std::size_t>(id)];
    has_return = has_return || text == "<|return|>";
    has_call = has_call || text == "<|call|>" || text == "<|calls|>";
    has_flush = has_flush || text == "<|flush|>";
    has_normal_s = has_normal_s || text == "<|tool_response>" || text == "<|plamo:eos|>";
    if (text == "<|end|>") end_id = id;
    if (text == "</s>") s_id = id;
  }
  if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
    eog.erase(end_id);
    if (gguf_attrs) t.types[static_cast<std::size_t>(end_id)] = TokenType::user_defined;
  }
  // Gemma-4 and PLaMo have a </s> that is ordinary text.
  if (s_id >= 0 && has_normal_s) {
    eog.erase(s_id);
    if (gguf_attrs) t.types[static_cast<std::size_t>(s_id)] = TokenType::normal;
  }
  t.eog.assign(eog.begin(), eog.end());
}

}  // namespace tok

// ---- Streaming -------------------------------------------------------------------------------

TextStream::TextStream(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special)
    : tok_(std::move(tokenizer)), skip_special_(skip_special) {
  if (!tok_) throw std::invalid_argument("[moekit::TextStream] no tokenizer");
}

std::string TextStream::push(std::int32_t id) {
  std::string piece = tok_->token_bytes(id);  // throws for an id outside the vocabulary
  if (skip_special_ && is_special(tok_->token_type(id))) return {};
  if (!started_ && !piece.empty()) {
    started_ = true;
    if (tok_->strips_leading_space() && piece[0] == ' ') piece.erase(0, 1);
  }
  pending_ += piece;
  const std::size_t n = tok::utf8_emittable(pending_);
  std::string out = tok::utf8_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string TextStream::flush() {
  std::string out = tok::utf8_lossy(pending_);
  pending_.clear();
  started_ = false;
  return out;
}

}  // namespace moekit
