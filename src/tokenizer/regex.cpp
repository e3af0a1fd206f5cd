// PCRE2 behind the pre-tokenizers' splits (regex.hpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.hpp"

#include <pcre2.h>

#include <memory>
#include <stdexcept>

#include "tokenizer/unicode.hpp"
#include "util/error.hpp"

namespace moekit::tok {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n > 0 ? std::string(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n))
               : MOEKIT_MSG("PCRE2 error " << code);
}

// A pattern for messages: at most 80 bytes.
std::string shown(const std::string& pattern) { return pattern.size() <= 80 ? pattern : pattern.substr(0, 77) + "..."; }

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const noexcept { pcre2_match_data_free(md); }
};

}  // namespace

std::string onig_compatible(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    const char next = i + 1 < pattern.size() ? pattern[i + 1] : '\0';
    if (c == '\\' && i + 1 < pattern.size()) {
      ++i;
      if (next == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (next == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if (next == 'Q') {  // \Q...\E: copied as it stands
        const std::size_t end = pattern.find("\\E", i + 1);
        const std::size_t stop = end == std::string::npos ? pattern.size() : end + 2;
        out += pattern.substr(i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out += c;
        out += next;
      }
    } else if (!in_class && c == '[') {
      // A class opens; a ']' right after '[' or '[^' is a literal member.
      out += c;
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && next == ':') {  // [:alpha:] inside a class
      const std::size_t end = pattern.find(":]", i + 2);
      const std::size_t stop = end == std::string::npos ? i + 1 : end + 2;
      out += pattern.substr(i, stop - i);
      i = stop - 1;
    } else {
      if (in_class && c == ']') in_class = false;
      out += c;
    }
  }
  return out;
}

std::shared_ptr<const Regex> Regex::compile(const std::string& pattern, const std::string& what) {
  std::shared_ptr<Regex> r(new Regex());
  r->pattern_ = pattern;
  r->what_ = what;
  const std::string onig = onig_compatible(pattern);
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(onig.data()), onig.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &at, nullptr);
  if (!code)
    throw std::runtime_error(MOEKIT_MSG("[moekit::Tokenizer] " << what << ": regex '" << shown(pattern)
                                                               << "' does not compile: " << pcre2_message(err)
                                                               << " at offset " << at));
  r->code_ = code;
  // JIT where this PCRE2 has one; the interpreter otherwise (same matches).
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

std::shared_ptr<const Regex> Regex::literal(const std::string& literal, const std::string& what) {
  std::string escaped;
  for (const char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) escaped += '\\';
    escaped += c;
  }
  return compile(escaped, what);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  const std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code, nullptr));
  if (!md) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  std::size_t pos = 0;
  std::uint32_t options = 0;  // the first call checks the UTF-8 of the whole subject, the others need not
  bool jit = jit_;
  while (pos <= n) {
    int rc = pcre2_match(code, subject, n, pos, options | (jit ? 0 : PCRE2_NO_JIT), md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // the JIT's stack is small: the interpreter has the heap
      jit = false;
      rc = pcre2_match(code, subject, n, pos, options | PCRE2_NO_JIT, md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw std::runtime_error(MOEKIT_MSG("[moekit::Tokenizer] " << what_ << ": regex '" << shown(pattern_)
                                                                 << "' failed on a text of " << n
                                                                 << " bytes: " << pcre2_message(rc)));
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      if (b >= n) break;
      pos = b + utf8_char_len(static_cast<unsigned char>(text[b]));
    }
  }
}

}  // namespace moekit::tok
