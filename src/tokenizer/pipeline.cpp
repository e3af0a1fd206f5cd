// The text side of encoding (tokenizer_impl.hpp): added tokens cut out, normalization,
// pre-tokenization. Each step follows the tokenizers library's semantics (AddedVocabulary's
// find_matches, NormalizedString::split's behaviors, the ByteLevel and Metaspace pre-tokenizers),
// which llama.cpp's byte-level path equals for the steps it has.
#include <algorithm>
#include <stdexcept>

#include "tokenizer/tokenizer_impl.hpp"
#include "util/error.hpp"

namespace moekit::tok {

void fail(const std::string& source, const std::string& what) {
  throw std::runtime_error("[moekit::Tokenizer] " + source + ": " + what);
}

// ---- Normalizer ------------------------------------------------------------------------------

std::string normalize(const std::vector<NormStep>& steps, std::string_view text) {
  std::string s(text);
  for (const NormStep& step : steps) {
    switch (step.kind) {
      case NormStep::Kind::form:
        s = normalize(s, step.form);
        break;
      case NormStep::Kind::prepend:
        if (!s.empty()) s.insert(0, step.text);  // the tokenizers library leaves an empty string alone
        break;
      case NormStep::Kind::replace: {
        std::vector<std::pair<std::size_t, std::size_t>> m;
        step.match->find_all(s, m);
        if (m.empty()) break;
        std::string r;
        std::size_t at = 0;
        for (const auto& [b, e] : m) {
          r.append(s, at, b - at);
          r += step.text;
          at = e;
        }
        r.append(s, at, std::string::npos);
        s = std::move(r);
        break;
      }
    }
  }
  return s;
}

// ---- Pre-tokenizer ---------------------------------------------------------------------------

std::shared_ptr<const Regex> gpt2_regex() {
  // The ByteLevel pre-tokenizer's split (tokenizers' byte_level.rs, GPT-2's encoder.py).
  static const std::shared_ptr<const Regex> re =
      Regex::compile(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "ByteLevel");
  return re;
}

namespace {

struct Span {
  std::size_t begin, end;
  bool match;
};

// `text` cut at every match of `re` into matches and the gaps between them (the tokenizers
// library's Pattern::find_matches), then arranged by `behavior` (NormalizedString::split).
std::vector<Span> split_spans(const Regex& re, std::string_view text, SplitBehavior behavior, bool invert) {
  std::vector<std::pair<std::size_t, std::size_t>> found;
  re.find_all(text, found);
  std::vector<Span> spans;
  std::size_t prev = 0;
  for (const auto& [b, e] : found) {
    if (prev != b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  if (invert)
    for (Span& s : spans) s.match = !s.match;

  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      return spans;
    case SplitBehavior::removed:
      for (const Span& s : spans)
        if (!s.match) out.push_back(s);
      return out;
    case SplitBehavior::contiguous:
      for (const Span& s : spans) {
        if (s.match == previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.match;
      }
      return out;
    case SplitBehavior::merged_with_previous:
      for (const Span& s : spans) {
        if (s.match && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.match;
      }
      return out;
    case SplitBehavior::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous_match && !out.empty())
          out.back().begin = it->begin;
        else
          out.push_back(*it);
        previous_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      return out;
  }
  return spans;
}

void emit_spans(const Word& w, const std::vector<Span>& spans, std::vector<Word>& out) {
  for (const Span& s : spans)
    if (s.end > s.begin) out.push_back({w.text.substr(s.begin, s.end - s.begin), w.at_start && s.begin == 0});
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string r;
  std::size_t at = 0;
  for (std::size_t p; (p = s.find(from, at)) != std::string_view::npos; at = p + from.size()) {
    r.append(s, at, p - at);
    r += to;
  }
  r.append(s, at, std::string_view::npos);
  return r;
}

void byte_level(const PreStep& step, const Word& w, std::vector<Word>& out) {
  Word word = w;
  if (step.add_prefix_space && word.text.rfind(' ', 0) != 0) word.text.insert(word.text.begin(), ' ');
  std::vector<Word> pieces;
  if (step.use_regex)
    emit_spans(word, split_spans(*gpt2_regex(), word.text, SplitBehavior::isolated, false), pieces);
  else
    pieces.push_back(std::move(word));
  for (Word& p : pieces) {
    std::string mapped;
    mapped.reserve(p.text.size() * 2);
    for (const char c : p.text) mapped += byte_level_char(static_cast<std::uint8_t>(c));
    if (!mapped.empty()) out.push_back({std::move(mapped), p.at_start});
  }
}

void metaspace(const PreStep& step, const Word& w, std::vector<Word>& out) {
  std::string s = replace_all(w.text, " ", step.replacement);
  const bool starts = s.rfind(step.replacement, 0) == 0;
  if (!starts && (step.prepend == PreStep::Prepend::always || (step.prepend == PreStep::Prepend::first && w.at_start)))
    s.insert(0, step.replacement);
  if (!step.split) {
    if (!s.empty()) out.push_back({std::move(s), w.at_start});
    return;
  }
  // Split before each replacement character (MergedWithNext).
  std::size_t begin = 0;
  for (std::size_t p = s.find(step.replacement, 1); p != std::string::npos; p = s.find(step.replacement, p + 1)) {
    if (p > begin) out.push_back({s.substr(begin, p - begin), w.at_start && begin == 0});
    begin = p;
  }
  if (s.size() > begin) out.push_back({s.substr(begin), w.at_start && begin == 0});
}

}  // namespace

void pre_tokenize(const std::vector<PreStep>& steps, std::vector<Word>& words) {
  std::vector<Word> next;
  for (const PreStep& step : steps) {
    next.clear();
    for (const Word& w : words) {
      switch (step.kind) {
        case PreStep::Kind::split:
          emit_spans(w, split_spans(*step.regex, w.text, step.behavior, step.invert), next);
          break;
        case PreStep::Kind::byte_level:
          byte_level(step, w, next);
          break;
        case PreStep::Kind::metaspace:
          metaspace(step, w, next);
          break;
      }
    }
    words.swap(next);
  }
  words.erase(std::remove_if(words.begin(), words.end(), [](const Word& w) { return w.text.empty(); }), words.end());
}

// ---- Added tokens ----------------------------------------------------------------------------

std::int32_t Matcher::child(std::int32_t node, unsigned char b) const noexcept {
  const auto& next = nodes_[static_cast<std::size_t>(node)].next;
  const auto it =
      std::lower_bound(next.begin(), next.end(), b,
                       [](const std::pair<unsigned char, std::int32_t>& e, unsigned char k) { return e.first < k; });
  return it != next.end() && it->first == b ? it->second : -1;
}

void Matcher::add(std::string_view text, std::int32_t value) {
  if (text.empty()) return;  // an empty token matches nothing
  std::int32_t node = 0;
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    std::int32_t c = child(node, b);
    if (c < 0) {
      c = static_cast<std::int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& next = nodes_[static_cast<std::size_t>(node)].next;
      next.insert(std::lower_bound(next.begin(), next.end(), std::make_pair(b, std::int32_t{-1})), {b, c});
    }
    node = c;
  }
  // Two tokens with the same text: the first one added keeps it.
  if (nodes_[static_cast<std::size_t>(node)].value < 0) nodes_[static_cast<std::size_t>(node)].value = value;
}

namespace {

// The code point before byte `pos` of valid UTF-8 text, and where it starts.
char32_t char_before(std::string_view s, std::size_t pos, std::size_t& begin) {
  begin = pos - 1;
  while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
  std::size_t len = 0;
  return utf8_decode(s, begin, len);
}

// Cuts `s` at the added tokens `matcher` finds (AddedVocabulary::find_matches): `piece(text,
// offset)` for the text between them, `token(id)` for each token, in order.
template <typename Piece, typename Token>
void split_added(const Tokenizer::Impl& t, const Matcher& matcher, std::string_view s, bool parse_special,
                 Piece&& piece, Token&& token) {
  if (matcher.empty()) {
    if (!s.empty()) piece(s, 0);
    return;
  }
  const auto accept = [&](std::int32_t v) { return parse_special || !t.added[static_cast<std::size_t>(v)].special; };
  std::size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    std::size_t len = 0;
    const std::int32_t v = matcher.longest_at(s, pos, len, accept);
    if (v < 0) {
      pos += utf8_char_len(static_cast<unsigned char>(s[pos]));
      continue;
    }
    const AddedToken& a = t.added[static_cast<std::size_t>(v)];
    std::size_t start = pos, stop = pos + len;
    pos = stop;
    if (a.single_word) {
      std::size_t b = 0, l = 0;
      const bool word_before = start > 0 && is_word_char(char_before(s, start, b));
      const bool word_after = stop < s.size() && is_word_char(utf8_decode(s, stop, l));
      if (word_before || word_after) continue;  // not a word of its own: stays text
    }
    if (a.lstrip) {  // the white space before it goes with it (not past an earlier match)
      std::size_t b = start;
      while (b > start_offset) {
        std::size_t cb = 0;
        if (!is_white_space(char_before(s, b, cb))) break;
        b = cb;
      }
      start = b;
    }
    if (a.rstrip) {  // and the white space after it
      while (stop < s.size()) {
        std::size_t l = 0;
        if (!is_white_space(utf8_decode(s, stop, l))) break;
        stop += l;
      }
      pos = stop;
    }
    if (start_offset < start) piece(s.substr(start_offset, start - start_offset), start_offset);
    token(a.id);
    start_offset = stop;
  }
  if (start_offset < s.size()) piece(s.substr(start_offset), start_offset);
}

}  // namespace

}  // namespace moekit::tok

namespace moekit {

void Tokenizer::Impl::finish() {
  raw_matcher = tok::Matcher();
  normalized_matcher = tok::Matcher();
  for (std::size_t i = 0; i < added.size(); ++i) {
    const tok::AddedToken& a = added[i];
    if (a.id < 0 || a.id >= static_cast<std::int32_t>(texts.size()))
      tok::fail(source, MOEKIT_MSG("added token '" << a.content << "' has id " << a.id
                                                   << ", outside the vocabulary [0, " << texts.size() << ")"));
    (a.normalized ? normalized_matcher : raw_matcher).add(a.content, static_cast<std::int32_t>(i));
  }
}

void Tokenizer::Impl::encode(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const {
  const auto push = [&](std::int32_t id) { out.push_back(id); };
  std::vector<tok::Word> words;
  tok::split_added(
      *this, raw_matcher, text, parse_special,
      [&](std::string_view raw, std::size_t raw_offset) {
        const std::string norm = normalizer.empty() ? std::string(raw) : tok::normalize(normalizer, raw);
        tok::split_added(
            *this, normalized_matcher, norm, parse_special,
            [&](std::string_view piece, std::size_t offset) {
              words.clear();
              words.push_back({std::string(piece), raw_offset == 0 && offset == 0});
              tok::pre_tokenize(pre_steps, words);
              for (const tok::Word& w : words) model.encode_word(w.text, out);
            },
            push);
      },
      push);
}

}  // namespace moekit
