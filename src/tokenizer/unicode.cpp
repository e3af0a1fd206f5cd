// UTF-8 and Unicode helpers of the tokenizers (unicode.hpp). Normalization and character
// properties come from ICU; the UTF-8 rules are RFC 3629's, written out here so that validation,
// streaming and replacement agree byte for byte.
#include "tokenizer/unicode.hpp"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <array>
#include <stdexcept>
#include <vector>

#include "util/error.hpp"

namespace moekit::tok {

namespace {

// The sequence starting at p[0] (n >= 1 bytes available): 1 and its length when it is a complete
// well-formed sequence; 0 when the n bytes are a well-formed but incomplete start of one; -1 when
// it is ill-formed, with `len` the maximal subpart (the lead and the continuation bytes that were
// still acceptable, at least 1).
int check_sequence(const unsigned char* p, std::size_t n, std::size_t& len) noexcept {
  const unsigned char c = p[0];
  if (c < 0x80) {
    len = 1;
    return 1;
  }
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    len = 1;  // a continuation byte, C0, C1 or F5..FF: never a lead
    return -1;
  }
  for (std::size_t i = 1; i < need; ++i) {
    if (i >= n) {
      len = i;
      return 0;
    }
    const unsigned char b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      len = i;
      return -1;
    }
  }
  len = need;
  return 1;
}

// GPT-2's bytes_to_unicode: bytes '!'..'~', '¡'..'¬', '®'..'ÿ' keep their code point, the other 68
// take U+0100 + n in byte order.
struct ByteLevelTable {
  std::array<std::string, 256> chars;
  std::array<std::int16_t, 324> bytes{};  // code point (below 324) -> byte, or -1
  ByteLevelTable() {
    bytes.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keeps = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = keeps ? b : next++;
      utf8_append(chars[static_cast<std::size_t>(b)], static_cast<char32_t>(cp));
      bytes[static_cast<std::size_t>(cp)] = static_cast<std::int16_t>(b);
    }
  }
};

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

[[noreturn]] void icu_fail(const char* what, UErrorCode err) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::Tokenizer] ICU " << what << " failed: " << u_errorName(err)));
}

}  // namespace

std::size_t utf8_invalid_at(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t len = 0;
    if (check_sequence(p + i, s.size() - i, len) != 1) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::size_t utf8_char_len(unsigned char lead) noexcept {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

char32_t utf8_decode(std::string_view s, std::size_t pos, std::size_t& len) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  len = utf8_char_len(p[0]);
  if (len == 1) return p[0];
  char32_t cp = p[0] & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (std::size_t i = 1; i < len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::size_t utf8_emittable(std::string_view bytes) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t len = 0;
    if (check_sequence(p + i, bytes.size() - i, len) == 0) return i;  // may still complete
    i += len;
  }
  return i;
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t len = 0;
    if (check_sequence(p + i, bytes.size() - i, len) == 1)
      out.append(bytes.substr(i, len));
    else
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart (a truncated end counts as one)
    i += len;
  }
  return out;
}

const std::string& byte_level_char(std::uint8_t b) noexcept { return byte_level_table().chars[b]; }

int byte_level_byte(char32_t cp) noexcept {
  return cp < 324 ? byte_level_table().bytes[static_cast<std::size_t>(cp)] : -1;
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);  // ASCII is in every normal form
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = form == NormalForm::nfc    ? unorm2_getNFCInstance(&err)
                          : form == NormalForm::nfd  ? unorm2_getNFDInstance(&err)
                          : form == NormalForm::nfkc ? unorm2_getNFKCInstance(&err)
                                                     : unorm2_getNFKDInstance(&err);
  if (U_FAILURE(err)) icu_fail("normalizer", err);
  if (s.size() > static_cast<std::size_t>(INT32_MAX) / 4)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Tokenizer] text of " << s.size() << " bytes is too long"));
  // UTF-8 -> UTF-16 (at most one UTF-16 unit per byte).
  std::vector<UChar> in(s.size() + 1);
  std::int32_t in_len = 0;
  u_strFromUTF8(in.data(), static_cast<std::int32_t>(in.size()), &in_len, s.data(), static_cast<std::int32_t>(s.size()),
                &err);
  if (U_FAILURE(err)) icu_fail("UTF-8 conversion", err);
  if (unorm2_quickCheck(n, in.data(), in_len, &err) == UNORM_YES && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  // Decompositions grow a string by a bounded factor (at most 18 for NFKD, 3 for NFC); preflight.
  const std::int32_t cap = unorm2_normalize(n, in.data(), in_len, nullptr, 0, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) icu_fail("normalization", err);
  err = U_ZERO_ERROR;
  std::vector<UChar> norm(static_cast<std::size_t>(cap) + 1);
  const std::int32_t norm_len = unorm2_normalize(n, in.data(), in_len, norm.data(), cap + 1, &err);
  if (U_FAILURE(err)) icu_fail("normalization", err);
  std::string out(static_cast<std::size_t>(norm_len) * 3 + 1, '\0');
  std::int32_t out_len = 0;
  u_strToUTF8(out.data(), static_cast<std::int32_t>(out.size()), &out_len, norm.data(), norm_len, &err);
  if (U_FAILURE(err)) icu_fail("UTF-8 conversion", err);
  out.resize(static_cast<std::size_t>(out_len));
  return out;
}

bool is_white_space(char32_t cp) noexcept {
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE) != 0;
}

bool is_word_char(char32_t cp) noexcept {
  const auto c = static_cast<UChar32>(cp);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

}  // namespace moekit::tok
