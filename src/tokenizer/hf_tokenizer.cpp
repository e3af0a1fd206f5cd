// Tokenizer::from_folder: a Hugging Face folder's tokenizer.json, read as the tokenizers library
// runs it (docs/tokenizers.md, "Hugging Face folders"), with tokenizer_config.json for BOS / EOS and
// generation_config.json for the ids that end a generation.
//
// Supported: model BPE (byte-level, or SentencePiece-style with byte_fallback, fuse_unk,
// ignore_merges); normalizers NFC / NFD / NFKC / NFKD, Prepend, Replace, Sequence; pre-tokenizers
// Split (every behavior, invert), ByteLevel, Metaspace, Digits, Sequence; post-processors
// TemplateProcessing, ByteLevel, Sequence; decoders ByteLevel, Metaspace, Replace, ByteFallback,
// Fuse, Strip, Sequence. Anything else is an error that names it.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "tokenizer/tokenizer_impl.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

using json = nlohmann::json;
using tok::fail;

json read_json(const std::filesystem::path& p, bool required, const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    if (required) fail(dir, "no " + p.filename().string() + " (a tokenizer folder has tokenizer.json)");
    return json();
  }
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(p.string(), "cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(p.string(), std::string("is not JSON: ") + e.what());
  }
  if (!j.is_object()) fail(p.string(), "is not a JSON object");
  return j;
}

// Typed access to the tokenizer.json, every failure naming the file and the key's path.
struct Reader {
  std::string file;
  const json& object(const json& j, const std::string& key, const std::string& where) const {
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_object())
      fail(file, where + "." + key + " is missing or not an object");
    return j.at(key);
  }
  std::string string(const json& j, const std::string& key, const std::string& where,
                     const std::string& fallback) const {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    if (!j.at(key).is_string()) fail(file, where + "." + key + " is not a string");
    return j.at(key).get<std::string>();
  }
  bool boolean(const json& j, const std::string& key, const std::string& where, bool fallback) const {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    if (!j.at(key).is_boolean()) fail(file, where + "." + key + " is not a boolean");
    return j.at(key).get<bool>();
  }
  // `where` names the value, built only for the message (a callable, or a string).
  template <typename Where>
  std::int32_t id(const json& v, Where&& where) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > INT32_MAX - 1) {
      if constexpr (std::is_invocable_v<Where>)
        fail(file, where() + " is not a token id (" + v.dump() + ")");
      else
        fail(file, std::string(where) + " is not a token id (" + v.dump() + ")");
    }
    return static_cast<std::int32_t>(v.get<std::int64_t>());
  }
  // A Split / Replace pattern: {"String": s} (literal) or {"Regex": r}.
  std::shared_ptr<const tok::Regex> pattern(const json& j, const std::string& where) const {
    const json& p = object(j, "pattern", where);
    if (p.contains("Regex") && p.at("Regex").is_string())
      return tok::Regex::compile(p.at("Regex").get<std::string>(), file + " " + where + ".pattern");
    if (p.contains("String") && p.at("String").is_string())
      return tok::Regex::literal(p.at("String").get<std::string>(), file + " " + where + ".pattern");
    fail(file, where + ".pattern is neither {\"String\": ...} nor {\"Regex\": ...}");
  }
};

std::string type_of(const Reader& r, const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j.at("type").is_string()) fail(r.file, where + " has no \"type\"");
  return j.at("type").get<std::string>();
}

void read_normalizer(const Reader& r, const json& j, const std::string& where, std::vector<tok::NormStep>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(r, j, where);
  tok::NormStep s;
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j.at("normalizers").is_array())
      fail(r.file, where + ".normalizers is not an array");
    for (std::size_t i = 0; i < j.at("normalizers").size(); ++i)
      read_normalizer(r, j.at("normalizers")[i], MOEKIT_MSG(where << ".normalizers[" << i << "]"), out);
    return;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    s.kind = tok::NormStep::Kind::form;
    s.form = type == "NFC"    ? tok::NormalForm::nfc
             : type == "NFD"  ? tok::NormalForm::nfd
             : type == "NFKC" ? tok::NormalForm::nfkc
                              : tok::NormalForm::nfkd;
  } else if (type == "Prepend") {
    s.kind = tok::NormStep::Kind::prepend;
    s.text = r.string(j, "prepend", where, "");
  } else if (type == "Replace") {
    s.kind = tok::NormStep::Kind::replace;
    s.match = r.pattern(j, where);
    s.text = r.string(j, "content", where, "");
  } else {
    fail(r.file, where + ": normalizer '" + type +
                     "' is not supported (moekit runs NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)");
  }
  out.push_back(std::move(s));
}

void read_pre_tokenizer(const Reader& r, const json& j, const std::string& where, std::vector<tok::PreStep>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(r, j, where);
  tok::PreStep s;
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j.at("pretokenizers").is_array())
      fail(r.file, where + ".pretokenizers is not an array");
    for (std::size_t i = 0; i < j.at("pretokenizers").size(); ++i)
      read_pre_tokenizer(r, j.at("pretokenizers")[i], MOEKIT_MSG(where << ".pretokenizers[" << i << "]"), out);
    return;
  } else if (type == "Split") {
    s.kind = tok::PreStep::Kind::split;
    s.regex = r.pattern(j, where);
    s.invert = r.boolean(j, "invert", where, false);
    const std::string b = r.string(j, "behavior", where, "");
    using B = tok::SplitBehavior;
    if (b == "Isolated")
      s.behavior = B::isolated;
    else if (b == "Removed")
      s.behavior = B::removed;
    else if (b == "MergedWithPrevious")
      s.behavior = B::merged_with_previous;
    else if (b == "MergedWithNext")
      s.behavior = B::merged_with_next;
    else if (b == "Contiguous")
      s.behavior = B::contiguous;
    else
      fail(r.file, where + ".behavior '" + b + "' is not a split behavior");
  } else if (type == "ByteLevel") {
    s.kind = tok::PreStep::Kind::byte_level;
    s.add_prefix_space = r.boolean(j, "add_prefix_space", where, true);
    s.use_regex = r.boolean(j, "use_regex", where, true);
  } else if (type == "Metaspace") {
    s.kind = tok::PreStep::Kind::metaspace;
    s.replacement = r.string(j, "replacement", where, "\xE2\x96\x81");
    if (s.replacement.empty() || tok::utf8_invalid_at(s.replacement) != std::string::npos)
      fail(r.file, where + ".replacement is not one character");
    s.split = r.boolean(j, "split", where, true);
    // Older files: add_prefix_space (true: always); newer: prepend_scheme.
    const std::string scheme =
        r.string(j, "prepend_scheme", where, r.boolean(j, "add_prefix_space", where, true) ? "always" : "never");
    if (scheme == "always")
      s.prepend = tok::PreStep::Prepend::always;
    else if (scheme == "first")
      s.prepend = tok::PreStep::Prepend::first;
    else if (scheme == "never")
      s.prepend = tok::PreStep::Prepend::never;
    else
      fail(r.file, where + ".prepend_scheme '" + scheme + "' is not always, first or never");
  } else if (type == "Digits") {
    s.kind = tok::PreStep::Kind::split;
    s.regex = tok::Regex::compile(r.boolean(j, "individual_digits", where, false) ? R"(\p{N})" : R"(\p{N}+)",
                                  r.file + " " + where);
  } else {
    fail(r.file, where + ": pre-tokenizer '" + type +
                     "' is not supported (moekit runs Split, ByteLevel, Metaspace, Digits, Sequence)");
  }
  out.push_back(std::move(s));
}

// The ids a TemplateProcessing puts before and after a single sequence ($A).
void read_post_processor(const Reader& r, const Tokenizer::Impl& t, const json& j, const std::string& where,
                         bool& has_template, std::vector<std::int32_t>& prefix, std::vector<std::int32_t>& suffix) {
  if (j.is_null()) return;
  const std::string type = type_of(r, j, where);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j.at("processors").is_array())
      fail(r.file, where + ".processors is not an array");
    for (std::size_t i = 0; i < j.at("processors").size(); ++i)
      read_post_processor(r, t, j.at("processors")[i], MOEKIT_MSG(where << ".processors[" << i << "]"), has_template,
                          prefix, suffix);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only
  if (type != "TemplateProcessing")
    fail(r.file, where + ": post-processor '" + type +
                     "' is not supported (moekit runs TemplateProcessing, ByteLevel, Sequence)");
  has_template = true;
  prefix.clear();
  suffix.clear();
  if (!j.contains("single") || !j.at("single").is_array()) fail(r.file, where + ".single is not an array");
  bool after = false;
  for (const json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item.at("SpecialToken").is_object())
      fail(r.file, where + ".single has an item that is neither Sequence nor SpecialToken");
    const std::string name = r.string(item.at("SpecialToken"), "id", where + ".single[]", "");
    const json& specials = r.object(j, "special_tokens", where);
    if (!specials.contains(name)) fail(r.file, where + ".special_tokens has no '" + name + "'");
    const json& ids = specials.at(name).contains("ids") ? specials.at(name).at("ids") : json();
    if (!ids.is_array()) fail(r.file, where + ".special_tokens['" + name + "'].ids is not an array");
    for (const json& v : ids) {
      const std::int32_t id = r.id(v, where + ".special_tokens['" + name + "'].ids[]");
      if (static_cast<std::size_t>(id) >= t.texts.size())
        fail(r.file,
             MOEKIT_MSG(where << ": special token '" << name << "' has id " << id << ", outside the vocabulary"));
      (after ? suffix : prefix).push_back(id);
    }
  }
}

// The decoder: how normal tokens become bytes, and whether a leading space goes.
void read_decoder(const Reader& r, Tokenizer::Impl& t, const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = type_of(r, j, where);
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j.at("decoders").is_array()) fail(r.file, where + ".decoders is not an array");
    for (std::size_t i = 0; i < j.at("decoders").size(); ++i)
      read_decoder(r, t, j.at("decoders")[i], MOEKIT_MSG(where << ".decoders[" << i << "]"));
  } else if (type == "ByteLevel") {
    t.decode_style = tok::DecodeStyle::byte_level;
  } else if (type == "Replace") {
    t.decode_style = tok::DecodeStyle::metaspace;  // ▁ -> ' ' (the only Replace decoders use)
  } else if (type == "Metaspace") {
    t.decode_style = tok::DecodeStyle::metaspace;
    const std::string scheme =
        r.string(j, "prepend_scheme", where, r.boolean(j, "add_prefix_space", where, true) ? "always" : "never");
    t.strip_leading_space = scheme != "never";
  } else if (type == "Strip") {
    const std::string content = r.string(j, "content", where, " ");
    if (content == " " && j.value("start", 0) > 0) t.strip_leading_space = true;
  } else if (type != "ByteFallback" && type != "Fuse") {
    fail(r.file, where + ": decoder '" + type +
                     "' is not supported (moekit runs ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)");
  }
}

// tokenizer_config.json's bos_token / eos_token: a string, or an added-token object's content. A
// token the vocabulary lacks is an error, unless `optional` (the pad token, which moekit never uses).
std::int32_t config_token(const Tokenizer::Impl& t, const json& cfg, const std::string& key, const std::string& file,
                          bool optional = false) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg.at(key).is_null()) return -1;
  const json& v = cfg.at(key);
  std::string content;
  if (v.is_string())
    content = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v.at("content").is_string())
    content = v.at("content").get<std::string>();
  else
    fail(file, key + " is neither a string nor a token object");
  const auto it = t.ids.find(content);
  if (it == t.ids.end() && optional) return -1;
  if (it == t.ids.end()) fail(file, key + " '" + content + "' is not a token of the vocabulary");
  return it->second;
}

}  // namespace

namespace {

std::shared_ptr<const Tokenizer> read_folder(const std::string& dir);

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::from_folder(const std::string& dir) {
  try {
    return read_folder(dir);
  } catch (const json::exception& e) {  // a value of another type than the reader checked for
    fail((std::filesystem::path(dir) / "tokenizer.json").string(), std::string("unexpected JSON: ") + e.what());
  }
}

namespace {

std::shared_ptr<const Tokenizer> read_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  using Impl = Tokenizer::Impl;
  const fs::path tj = fs::path(dir) / "tokenizer.json";
  const json root = read_json(tj, true, dir);
  const Reader r{tj.string()};
  auto t = std::make_unique<Impl>();
  t->source = tj.string();
  t->pre = "tokenizer.json";

  // The model: BPE only.
  const json& m = r.object(root, "model", "tokenizer.json");
  const std::string mtype = r.string(m, "type", "model", m.contains("merges") ? "BPE" : "");
  if (mtype != "BPE")
    fail(r.file, "model '" + mtype + "' is not supported (moekit runs BPE; not WordPiece, Unigram, WordLevel)");
  if (m.contains("dropout") && m.at("dropout").is_number() && m.at("dropout").get<double>() != 0.0)
    fail(r.file, "model.dropout is set: BPE dropout (random merges) is for training, moekit does not run it");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!r.string(m, affix, "model", "").empty())
      fail(r.file, std::string("model.") + affix + " is set: moekit runs BPE without word affixes");
  const json& vocab = r.object(m, "vocab", "model");
  std::int64_t n = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    n = std::max<std::int64_t>(n, r.id(it.value(), [&] { return "model.vocab['" + it.key() + "']"; }) + 1);
  const json added = root.contains("added_tokens") ? root.at("added_tokens") : json::array();
  if (!added.is_array()) fail(r.file, "added_tokens is not an array");
  for (const json& a : added)
    n = std::max<std::int64_t>(n,
                               r.id(a.is_object() && a.contains("id") ? a.at("id") : json(), "added_tokens[].id") + 1);
  if (n == 0) fail(r.file, "the vocabulary is empty");
  t->texts.resize(static_cast<std::size_t>(n));
  t->types.assign(static_cast<std::size_t>(n), TokenType::unused);  // ids no token names stay unused
  tok::Model& model = t->model;
  model.n_vocab = static_cast<std::int32_t>(n);
  model.byte_fallback = r.boolean(m, "byte_fallback", "model", false);
  model.fuse_unk = r.boolean(m, "fuse_unk", "model", false);
  model.ignore_merges = r.boolean(m, "ignore_merges", "model", false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::int32_t id = it.value().get<std::int32_t>();
    if (t->types[static_cast<std::size_t>(id)] != TokenType::unused)
      fail(r.file, MOEKIT_MSG("model.vocab gives id " << id << " to '" << t->texts[static_cast<std::size_t>(id)]
                                                      << "' and to '" << it.key() << "'"));
    t->texts[static_cast<std::size_t>(id)] = it.key();
    std::uint8_t b = 0;
    t->types[static_cast<std::size_t>(id)] =
        model.byte_fallback && tok::parse_byte_token(it.key(), b) ? TokenType::byte : TokenType::normal;
    model.vocab.emplace(it.key(), id);
  }
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const std::string where = MOEKIT_MSG("added_tokens[" << i << "]");
    tok::AddedToken at;
    at.id = r.id(a.at("id"), where + ".id");
    at.content = r.string(a, "content", where, "");
    if (at.content.empty()) fail(r.file, where + ".content is empty");
    at.special = r.boolean(a, "special", where, false);
    at.lstrip = r.boolean(a, "lstrip", where, false);
    at.rstrip = r.boolean(a, "rstrip", where, false);
    at.single_word = r.boolean(a, "single_word", where, false);
    at.normalized = r.boolean(a, "normalized", where, !at.special);
    t->texts[static_cast<std::size_t>(at.id)] = at.content;
    t->types[static_cast<std::size_t>(at.id)] = at.special ? TokenType::control : TokenType::user_defined;
    t->added.push_back(std::move(at));
  }
  for (std::size_t i = 0; i < t->texts.size(); ++i)
    if (t->types[i] != TokenType::unused) t->ids.emplace(t->texts[i], static_cast<std::int32_t>(i));
  const std::string unk = r.string(m, "unk_token", "model", "");
  if (!unk.empty()) {
    model.unk = model.lookup(unk);
    if (model.unk < 0) fail(r.file, "model.unk_token '" + unk + "' is not in model.vocab");
    t->unk = model.unk;
    if (t->types[static_cast<std::size_t>(t->unk)] == TokenType::normal)
      t->types[static_cast<std::size_t>(t->unk)] = TokenType::unknown;
  }
  // Merges: "left right" strings or [left, right] pairs, in rank order.
  if (m.contains("merges")) {
    const json& merges = m.at("merges");
    if (!merges.is_array()) fail(r.file, "model.merges is not an array");
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json& e = merges[i];
      const auto where = [&] { return MOEKIT_MSG("model.merges[" << i << "]"); };
      std::string left, right;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const std::size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(r.file, where() + " '" + s + "' is not two pieces separated by one space");
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        left = e[0].get<std::string>();
        right = e[1].get<std::string>();
      } else {
        fail(r.file, where() + " is neither \"left right\" nor [left, right]");
      }
      model.add_merge(left, right, static_cast<std::int32_t>(i), /*strict=*/true, r.file, "model.merges");
    }
    t->n_merges = static_cast<std::int64_t>(merges.size());
  }

  read_normalizer(r, root.value("normalizer", json()), "normalizer", t->normalizer);
  read_pre_tokenizer(r, root.value("pre_tokenizer", json()), "pre_tokenizer", t->pre_steps);
  // With no decoder, a byte-level pre-tokenizer says how tokens are spelled.
  t->decode_style = tok::DecodeStyle::metaspace;
  for (const tok::PreStep& s : t->pre_steps)
    if (s.kind == tok::PreStep::Kind::byte_level) t->decode_style = tok::DecodeStyle::byte_level;
  read_decoder(r, *t, root.value("decoder", json()), "decoder");
  t->kind = t->decode_style == tok::DecodeStyle::byte_level ? "byte-level BPE"
            : model.byte_fallback                           ? "BPE with byte fallback"
                                                            : "BPE";
  if (!t->pre_steps.empty()) {
    const json& p = root.at("pre_tokenizer");
    t->pre = p.value("type", std::string("?"));
  }

  // BOS / EOS: the post-processor's template, else tokenizer_config.json's add_bos_token /
  // add_eos_token; the ids from tokenizer_config.json, else the template's.
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  const json cfg = read_json(cfg_path, false, dir);
  const fs::path gen_path = fs::path(dir) / "generation_config.json";
  const json gen = read_json(gen_path, false, dir);
  bool has_template = false;
  read_post_processor(r, *t, root.value("post_processor", json()), "post_processor", has_template, t->prefix,
                      t->suffix);
  t->bos = config_token(*t, cfg, "bos_token", cfg_path.string());
  t->eos = config_token(*t, cfg, "eos_token", cfg_path.string());
  t->pad = config_token(*t, cfg, "pad_token", cfg_path.string(), /*optional=*/true);
  if (t->bos < 0 && !t->prefix.empty()) t->bos = t->prefix.front();
  const Reader cr{cfg_path.string()};
  if (!has_template) {
    if (cr.boolean(cfg, "add_bos_token", "tokenizer_config.json", false)) {
      if (t->bos < 0) fail(cfg_path.string(), "add_bos_token is true but there is no bos_token");
      t->prefix = {t->bos};
    }
    if (cr.boolean(cfg, "add_eos_token", "tokenizer_config.json", false)) {
      if (t->eos < 0) fail(cfg_path.string(), "add_eos_token is true but there is no eos_token");
      t->suffix = {t->eos};
    }
  }
  // The chat template: chat_template.jinja (transformers' own file since 4.43), else
  // tokenizer_config.json's chat_template — a string, or a list of {name, template} of which
  // transformers' apply_chat_template takes "default".
  if (const fs::path jinja = fs::path(dir) / "chat_template.jinja"; fs::exists(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    t->chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else if (cfg.is_object() && cfg.contains("chat_template") && !cfg.at("chat_template").is_null()) {
    const json& ct = cfg.at("chat_template");
    if (ct.is_string()) {
      t->chat_template = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const json& e : ct)
        if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
            e.at("template").is_string())
          t->chat_template = e.at("template").get<std::string>();
    } else {
      fail(cfg_path.string(), "chat_template is neither a string nor a list of {name, template}");
    }
  }
  // generation_config.json: eos_token_id, one id or a list; each ends a generation.
  if (gen.is_object() && gen.contains("eos_token_id") && !gen.at("eos_token_id").is_null()) {
    const json& e = gen.at("eos_token_id");
    const Reader gr{gen_path.string()};
    for (const json& v : e.is_array() ? e : json::array({e})) {
      const std::int32_t id = gr.id(v, "eos_token_id");
      if (id >= n)
        fail(gen_path.string(), MOEKIT_MSG("eos_token_id " << id << " is outside the vocabulary [0, " << n << ")"));
      t->extra_eog.push_back(id);
    }
    if (t->eos < 0 && !t->extra_eog.empty()) t->eos = t->extra_eog.front();
  }

  tok::compute_end_of_generation(*t, /*gguf_attrs=*/false);
  // Normalized added tokens are matched in the normalized text: their normalized content.
  for (tok::AddedToken& a : t->added)
    if (a.normalized && !t->normalizer.empty()) a.content = tok::normalize(t->normalizer, a.content);
  t->finish();
  return std::make_shared<const Tokenizer>(std::move(t));
}

}  // namespace
}  // namespace moekit
