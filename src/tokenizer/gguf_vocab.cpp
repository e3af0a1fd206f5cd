// Tokenizer::from_gguf: a GGUF file's `tokenizer.ggml.*` metadata, read as llama.cpp's
// llama_vocab::impl::load reads it (docs/tokenizers.md, "GGUF").
//
// The file names its tokenizer (`tokenizer.ggml.model`) and, for byte-level BPE, the pre-tokenizer
// (`tokenizer.ggml.pre`): a name whose regexes are not in the file. The table below gives each name
// moekit knows the splits of the model's own tokenizer.json (the tokenizers library runs them one
// after the other, each splitting every piece of the previous one, matches and gaps alike kept),
// and what llama.cpp sets with the name (ignore_merges, a BOS added by default, no BOS id). A GGUF
// does not say how its release normalizes text, and llama.cpp does not: neither does moekit here
// (Qwen's tokenizer.json files apply NFC; llama.cpp's own qwen35 test texts expect none).
#include <algorithm>
#include <stdexcept>

#include "moekit/gguf.hpp"
#include "tokenizer/tokenizer_impl.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

using tok::fail;

// The splits, as the releases' tokenizer.json files write them.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekken = R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
                                R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
                                R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek's splits spell their classes out: CJK, the cased letters of many scripts (Unicode's
// Lu / Ll / Lt ranges), ASCII and full-width punctuation.
constexpr const char* kDeepseekCjk = R"([\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+)";
constexpr const char* kDeepseekKana = R"([\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+)";
constexpr const char* kDeepseekLlmLetters =
    R"(\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293}\x{295}-)"
    R"(\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a}\x{38c}\x{38e}-)"
    R"(\x{3a1}\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}\x{10a0}-\x{10c5}\x{13a0}-)"
    R"(\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77})"
    R"(\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d}\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-)"
    R"(\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d}\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe})"
    R"(\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-)"
    R"(\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107}\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124})"
    R"(\x{2126}\x{2128}\x{212a}-\x{212d}\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149})"
    R"(\x{214e}\x{2183}\x{2184}\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3})"
    R"(\x{a640}-\x{a66d}\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-)"
    R"(\x{abbf}\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f})"
    R"(\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2}\x{118a0}-\x{118df})"
    R"(\x{1e900}-\x{1e943}]+)";
constexpr const char* kDeepseekLlmPunct =
    R"(\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+)";
constexpr const char* kDeepseek3Letters =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Kimi-K2 (tokenization_kimi.py): gpt-4o's split with Han runs taken first and excluded from the
// letter classes. Its classes intersect sets (`[\p{Lu}...&&[^\p{Han}]]`), which PCRE2 spells as a
// class behind a negative lookahead.
#define MOEKIT_NOT_HAN(cls) "(?:(?!\\p{Han})[" cls "])"
constexpr const char* kKimiK2 =
    R"(\p{Han}+)"
    "|[^\\r\\n\\p{L}\\p{N}]?" MOEKIT_NOT_HAN(R"(\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M})") "*" MOEKIT_NOT_HAN(
        R"(\p{Ll}\p{Lm}\p{Lo}\p{M})") "+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?" MOEKIT_NOT_HAN(R"(\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M})") "+" MOEKIT_NOT_HAN(
        R"(\p{Ll}\p{Lm}\p{Lo}\p{M})") "*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
#undef MOEKIT_NOT_HAN
// llama.cpp's own split for a byte-level vocabulary whose pre-tokenizer is "default" (or missing).
constexpr const char* kDefaultPunct = R"([\p{P}\$\+<=>\^~\|]+)";
constexpr const char* kGpt2NoTail = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

struct PreDef {
  std::vector<const char*> names;
  std::vector<const char*> regexes;  // applied in order, each an isolated split
  bool ignore_merges = false;        // a word that is a token is that token, merges or not
  bool add_bos = false;              // BOS added unless the file says otherwise
  bool no_bos = false;               // no BOS id unless the file gives one
};

const std::vector<PreDef>& pre_defs() {
  static const std::vector<PreDef> defs = {
      {{"default"}, {kDefaultPunct, kGpt2NoTail, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
       {kLlama3},
       true,
       true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"deepseek-llm"}, {"[\r\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"}, {R"(\p{N}{1,3})", kDeepseekKana, kDeepseek3Letters}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2NoTail, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"},
       {R"(\p{N})", kGpt2}},
      {{"gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "mpt", "olmo", "jais", "trillion", "granite-docling",
        "exaone4"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"chatglm-bpe"}, {kLlama3}, false, false, true},
      {{"glm4", "glm5"}, {kLlama3}, true, false, true},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
      {{"tekken"}, {kTekken}, true, true},
      {{"kimi-k2"}, {kKimiK2}},
  };
  return defs;
}

std::string known_pre_names() {
  std::vector<std::string> names;
  for (const PreDef& d : pre_defs()) names.insert(names.end(), d.names.begin(), d.names.end());
  std::sort(names.begin(), names.end());
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

const GgufValue* find_key(const GgufFile& f, const std::string& key) { return f.has(key) ? &f.get(key) : nullptr; }

// An array key's elements, checked: of the given element types, at least `n` of them.
const GgufValue* array_key(const GgufFile& f, const std::string& key, std::initializer_list<GgufType> types,
                           std::uint64_t n) {
  const GgufValue* v = find_key(f, key);
  if (!v) return nullptr;
  const bool ok =
      v->type() == GgufType::array && std::find(types.begin(), types.end(), v->element_type()) != types.end();
  if (!ok)
    fail(f.path(),
         MOEKIT_MSG(key << " is " << v->describe() << ", expected an array of " << gguf_type_name(*types.begin())));
  if (v->size() < n)
    fail(f.path(), MOEKIT_MSG(key << " has " << v->size() << " elements for " << n << " tokens (truncated)"));
  return v;
}

bool bool_key(const GgufFile& f, const std::string& key, bool fallback) {
  const GgufValue* v = find_key(f, key);
  if (!v) return fallback;
  if (v->type() != GgufType::boolean) fail(f.path(), MOEKIT_MSG(key << " is " << v->describe() << ", expected a bool"));
  return v->as_bool();
}

// A token id key: -1 when absent; an error when it is not an id of the vocabulary.
std::int32_t id_key(const GgufFile& f, const std::string& key, std::int32_t fallback, std::size_t n) {
  const GgufValue* v = find_key(f, key);
  if (!v) return fallback;
  if (!v->is_integer()) fail(f.path(), MOEKIT_MSG(key << " is " << v->describe() << ", expected a token id"));
  const std::int64_t id = v->as_int();
  if (id < 0 || static_cast<std::uint64_t>(id) >= n)
    fail(f.path(), MOEKIT_MSG(key << " = " << id << " is outside the vocabulary [0, " << n << ")"));
  return static_cast<std::int32_t>(id);
}

}  // namespace

std::vector<std::string> tok::gguf_pre_regexes(const std::string& pre) {
  for (const PreDef& d : pre_defs())
    if (std::find(d.names.begin(), d.names.end(), pre) != d.names.end())
      return std::vector<std::string>(d.regexes.begin(), d.regexes.end());
  return {};
}

std::shared_ptr<const Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  auto t = std::make_unique<Impl>();
  t->source = f.path();
  const GgufValue* model_v = find_key(f, "tokenizer.ggml.model");
  if (!model_v) fail(f.path(), "has no tokenizer (no tokenizer.ggml.model)");
  if (model_v->type() != GgufType::string)
    fail(f.path(), "tokenizer.ggml.model is " + model_v->describe() + ", expected a string");
  const std::string model = model_v->as_string();
  const bool spm = model == "llama";
  if (model != "gpt2" && !spm)
    fail(f.path(),
         "tokenizer.ggml.model '" + model +
             "' is not a tokenizer moekit runs (supported: gpt2 = byte-level BPE, llama = SentencePiece BPE)");
  std::string pre = "default";
  if (const GgufValue* p = find_key(f, "tokenizer.ggml.pre")) {
    if (p->type() != GgufType::string) fail(f.path(), "tokenizer.ggml.pre is " + p->describe() + ", expected a string");
    if (!p->as_string().empty()) pre = p->as_string();
  }

  // The vocabulary.
  const GgufValue* tokens = array_key(f, "tokenizer.ggml.tokens", {GgufType::string}, 0);
  if (!tokens) fail(f.path(), "has no tokenizer.ggml.tokens");
  if (tokens->size() == 0 || tokens->size() > static_cast<std::uint64_t>(INT32_MAX))
    fail(f.path(), MOEKIT_MSG("tokenizer.ggml.tokens has " << tokens->size() << " tokens"));
  const std::size_t n = static_cast<std::size_t>(tokens->size());
  const std::vector<std::string_view> words = tokens->as_strings();
  const GgufValue* types = array_key(f, "tokenizer.ggml.token_type", {GgufType::i32}, n);
  const GgufValue* scores = array_key(f, "tokenizer.ggml.scores", {GgufType::f32, GgufType::i32}, n);
  t->texts.resize(n);
  t->ids.reserve(n);
  t->types.assign(n, TokenType::normal);
  const std::vector<std::int64_t> type_values = types ? types->as_ints() : std::vector<std::int64_t>();
  const std::vector<double> score_values = scores ? scores->as_floats() : std::vector<double>();
  t->model.n_vocab = static_cast<std::int32_t>(n);
  t->model.scores.assign(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    std::string& text = t->texts[i];
    // llama.cpp names an empty token so that it stays distinct.
    text = words[i].empty() ? MOEKIT_MSG("[EMPTY_" << i << "]") : std::string(words[i]);
    const auto inserted = t->ids.emplace(text, static_cast<std::int32_t>(i));
    if (!inserted.second) {
      const std::int32_t first = inserted.first->second;
      fail(f.path(),
           MOEKIT_MSG("tokenizer.ggml.tokens[" << i << "] '" << tok::utf8_lossy(text) << "' repeats token " << first));
    }
    if (types) {
      const std::int64_t ty = type_values[i];
      t->types[i] = ty >= 1 && ty <= 6 ? static_cast<TokenType>(ty) : TokenType::undefined;
    }
    if (scores) t->model.scores[i] = static_cast<float>(score_values[i]);
    std::uint8_t b = 0;
    if (t->types[i] == TokenType::byte && !tok::parse_byte_token(text, b))
      fail(f.path(), MOEKIT_MSG("tokenizer.ggml.tokens[" << i << "] '" << tok::utf8_lossy(text)
                                                         << "' has token type byte but is not <0xXX>"));
  }
  t->model.vocab = t->ids;  // llama.cpp's text_to_token: every token, special ones included

  // The kind, the pre-tokenizer and the defaults llama.cpp takes with them.
  bool add_bos = false;
  if (spm) {
    t->kind = "SentencePiece BPE";
    t->pre = pre;
    t->model.kind = tok::Model::Kind::spm;
    t->decode_style = tok::DecodeStyle::metaspace;
    add_bos = true;
    // llama.cpp's (and SentencePiece's) ids when the file has no keys: <unk> 0, <s> 1, </s> 2.
    t->unk = n > 0 ? 0 : -1;
    t->bos = n > 1 ? 1 : -1;
    t->eos = n > 2 ? 2 : -1;
    // A space before the text (and after each special token), spaces as ▁.
    const bool space_prefix = bool_key(f, "tokenizer.ggml.add_space_prefix", true);
    if (space_prefix) t->normalizer.push_back({tok::NormStep::Kind::prepend, tok::NormalForm::nfc, " ", nullptr});
    t->normalizer.push_back({tok::NormStep::Kind::replace, tok::NormalForm::nfc, "\xE2\x96\x81",
                             tok::Regex::literal(" ", "SentencePiece whitespace")});
    t->strip_leading_space = space_prefix;
  } else {
    t->kind = "byte-level BPE";
    t->pre = pre;
    t->decode_style = tok::DecodeStyle::byte_level;
    const PreDef* def = nullptr;
    for (const PreDef& d : pre_defs())
      if (std::find(d.names.begin(), d.names.end(), pre) != d.names.end()) def = &d;
    if (!def)
      fail(f.path(),
           "tokenizer.ggml.pre '" + pre + "' is not a pre-tokenizer moekit knows (known: " + known_pre_names() + ")");
    for (const char* re : def->regexes) {
      tok::PreStep s;
      s.regex = tok::Regex::compile(re, "pre-tokenizer '" + pre + "'");
      t->pre_steps.push_back(std::move(s));
    }
    tok::PreStep bytes;
    bytes.kind = tok::PreStep::Kind::byte_level;
    t->pre_steps.push_back(bytes);
    t->model.ignore_merges = def->ignore_merges;
    t->model.llama_fallback = true;
    add_bos = def->add_bos;

    // Merges "left right" (split at the first space after the first byte), in rank order. A
    // vocabulary without merges (moekit's test models) tokenizes into the tokens of single
    // characters, where it has them (llama.cpp would refuse it).
    if (const GgufValue* merges = array_key(f, "tokenizer.ggml.merges", {GgufType::string}, 0)) {
      const std::vector<std::string_view> m = merges->as_strings();
      if (m.size() > static_cast<std::size_t>(INT32_MAX)) fail(f.path(), "tokenizer.ggml.merges: too many merges");
      for (std::size_t i = 0; i < m.size(); ++i) {
        const std::size_t sp = m[i].size() > 1 ? m[i].find(' ', 1) : std::string_view::npos;
        if (sp == std::string_view::npos)
          fail(f.path(), MOEKIT_MSG("tokenizer.ggml.merges[" << i << "] '" << tok::utf8_lossy(m[i])
                                                             << "' is not two pieces separated by a space"));
        t->model.add_merge(m[i].substr(0, sp), m[i].substr(sp + 1), static_cast<std::int32_t>(i), false, f.path(),
                           "tokenizer.ggml.merges");
      }
      t->n_merges = static_cast<std::int64_t>(m.size());
    }
    if (def->no_bos) t->bos = -1;
  }

  // Special ids and flags: the file's keys over the defaults.
  t->bos = id_key(f, "tokenizer.ggml.bos_token_id", t->bos, n);
  t->eos = id_key(f, "tokenizer.ggml.eos_token_id", t->eos, n);
  t->eot = id_key(f, "tokenizer.ggml.eot_token_id", -1, n);
  t->eom = id_key(f, "tokenizer.ggml.eom_token_id", -1, n);
  t->unk = id_key(f, "tokenizer.ggml.unknown_token_id", t->unk, n);
  t->pad = id_key(f, "tokenizer.ggml.padding_token_id", -1, n);
  t->fim_pre = id_key(f, "tokenizer.ggml.fim_pre_token_id", -1, n);
  t->fim_suf = id_key(f, "tokenizer.ggml.fim_suf_token_id", -1, n);
  t->fim_mid = id_key(f, "tokenizer.ggml.fim_mid_token_id", -1, n);
  t->fim_pad = id_key(f, "tokenizer.ggml.fim_pad_token_id", -1, n);
  t->fim_rep = id_key(f, "tokenizer.ggml.fim_rep_token_id", -1, n);
  t->fim_sep = id_key(f, "tokenizer.ggml.fim_sep_token_id", -1, n);
  t->model.unk = t->unk;
  if (const GgufValue* ct = find_key(f, "tokenizer.chat_template")) {
    if (ct->type() != GgufType::string)
      fail(f.path(), "tokenizer.chat_template is " + ct->describe() + ", not a string");
    t->chat_template = ct->as_string();
  }
  add_bos = bool_key(f, "tokenizer.ggml.add_bos_token", add_bos);
  const bool add_eos = bool_key(f, "tokenizer.ggml.add_eos_token", false);
  if (add_bos && t->bos < 0) fail(f.path(), "tokenizer.ggml.add_bos_token is true but the file has no BOS id");
  if (add_eos && t->eos < 0) fail(f.path(), "tokenizer.ggml.add_eos_token is true but the file has no EOS id");
  if (add_bos) t->prefix = {t->bos};
  if (add_eos) t->suffix = {t->eos};

  tok::compute_end_of_generation(*t, /*gguf_attrs=*/true);
  // Control, user-defined and unknown tokens are cut out of the text before anything else
  // (llama.cpp's tokenizer_st_partition); control and unknown ones only with parse_special.
  for (std::size_t i = 0; i < n; ++i) {
    const TokenType ty = t->types[i];
    if (ty != TokenType::control && ty != TokenType::user_defined && ty != TokenType::unknown) continue;
    tok::AddedToken a;
    a.id = static_cast<std::int32_t>(i);
    a.content = t->texts[i];
    a.special = ty != TokenType::user_defined;
    t->added.push_back(std::move(a));
  }
  // Longest first, as llama.cpp sorts them (the matcher keeps the first of equal texts).
  std::stable_sort(t->added.begin(), t->added.end(), [](const tok::AddedToken& a, const tok::AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  t->finish();
  return std::make_shared<const Tokenizer>(std::move(t));
}

}  // namespace moekit
