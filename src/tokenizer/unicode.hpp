// UTF-8 and Unicode helpers of the tokenizers: validation, code points, GPT-2's byte-to-character
// alphabet, ICU's normalization forms and the character classes the added-token rules test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moekit::tok {

/// The offset of the first byte of `s` that does not start a well-formed UTF-8 sequence (RFC 3629:
/// no overlong forms, no surrogates, nothing above U+10FFFF), or npos when `s` is valid UTF-8.
std::size_t utf8_invalid_at(std::string_view s) noexcept;

/// The length of the sequence a valid UTF-8 text has at `pos` (1 to 4), from its lead byte.
std::size_t utf8_char_len(unsigned char lead) noexcept;

/// The code point at `pos` of valid UTF-8 text, and its length in `len`.
char32_t utf8_decode(std::string_view s, std::size_t pos, std::size_t& len) noexcept;

/// Appends `cp` (a valid code point) as UTF-8.
void utf8_append(std::string& out, char32_t cp);

/// How much of `bytes` a streaming decoder can emit now: the length of the longest prefix that does
/// not end inside a sequence that could still complete (a valid but truncated sequence at the end
/// is held back; invalid bytes are not).
std::size_t utf8_emittable(std::string_view bytes) noexcept;

/// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD (the Unicode standard's
/// "maximal subpart" practice, as Python's errors="replace" and Rust's from_utf8_lossy do).
std::string utf8_lossy(std::string_view bytes);

/// GPT-2's byte-level alphabet (the `bytes_to_unicode` table of byte-level BPE): the UTF-8 of the
/// character that stands for byte `b`. Printable Latin-1 bytes stand for themselves, the other 68
/// for U+0100 onwards in byte order.
const std::string& byte_level_char(std::uint8_t b) noexcept;
/// The byte a byte-level character stands for, or -1 for a character outside the alphabet.
int byte_level_byte(char32_t cp) noexcept;

/// Unicode normalization forms (ICU).
enum class NormalForm { nfc, nfd, nfkc, nfkd };
/// `s` (valid UTF-8) in normal form `form`. Throws std::runtime_error if ICU fails.
std::string normalize(std::string_view s, NormalForm form);

/// Unicode White_Space (what the tokenizers library's `\s` strips around lstrip / rstrip tokens).
bool is_white_space(char32_t cp) noexcept;
/// A word character as the regex crate's `\w` has it (Alphabetic, marks, decimal digits,
/// connector punctuation, Join_Control): the single_word test of added tokens.
bool is_word_char(char32_t cp) noexcept;

}  // namespace moekit::tok
