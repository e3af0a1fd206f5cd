// The pre-tokenizers' regular expressions: PCRE2 in UTF + UCP mode (Unicode classes such as \p{L},
// \p{N}), JIT-compiled where PCRE2 has a JIT.
//
// The patterns are written for Oniguruma, the engine of the tokenizers library. Two differences
// are bridged when a pattern is compiled:
//  - Oniguruma's \s is Unicode White_Space, which includes U+0085 (NEXT LINE); PCRE2's \s in UCP
//    mode leaves it out. \s becomes [\s\x{85}] (inside a class, \s\x{85}) and \S its complement;
//  - Oniguruma's ^ and $ match at every line (Ruby syntax): the pattern is compiled MULTILINE.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moekit::tok {

class Regex {
 public:
  /// Compiles `pattern`; `what` names it in errors (std::runtime_error with PCRE2's message and
  /// the offset it points at).
  static std::shared_ptr<const Regex> compile(const std::string& pattern, const std::string& what);
  /// A pattern matching `literal` exactly.
  static std::shared_ptr<const Regex> literal(const std::string& literal, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Every non-overlapping non-empty match in `text` (valid UTF-8), left to right, as [begin, end)
  /// byte offsets, appended to `out`. An empty match moves the search on by one character. Throws
  /// std::runtime_error if PCRE2 gives up (its match limits), naming the pattern.
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const;

  const std::string& pattern() const noexcept { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;  // as given (messages)
  std::string what_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

/// `pattern` with Oniguruma's \s and \S spelled for PCRE2 (see above). Exposed for tests.
std::string onig_compatible(const std::string& pattern);

}  // namespace moekit::tok
