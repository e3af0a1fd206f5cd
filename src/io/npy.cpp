// NumPy .npy reading and writing. Format reference (pinned):
// https://github.com/numpy/numpy/blob/v1.26.4/numpy/lib/format.py
// The header is a Python dict literal; rather than evaluating Python we accept exactly the
// grammar numpy writes (and the small variations Python's literal syntax allows: either quote
// character, any key order, optional trailing commas, spaces/tabs/newlines between tokens) and
// reject everything else. Files are untrusted: every length is checked before it is used.
#include "moekit/npy.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.hpp"

namespace moekit {

static_assert(std::endian::native == std::endian::little,
              "moekit's .npy code assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr const char* kSupported = "<f4, <f2, <i4, |u1";

// Throws runtime_error "[moekit::<fn>] <name>: <what>".
struct Failer {
  const char* fn;
  const std::string& name;
  [[noreturn]] void operator()(const std::string& what) const {
    throw std::runtime_error(MOEKIT_MSG("[moekit::" << fn << "] " << name << ": " << what));
  }
};

// Printable rendering of untrusted header text for messages (bounded, non-ASCII escaped).
std::string printable(std::string_view s, std::size_t max_len = 80) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max_len; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// Recursive-descent parser for the header dict; no recursion deeper than one level.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const Failer& fail) : s_(text), fail_(fail) {}

  Header parse() {
    Header h;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (peek() != '}') {
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (seen_descr) bad("duplicate key 'descr'");
        seen_descr = true;
        if (peek() != '\'' && peek() != '"')
          bad("'descr' must be a dtype string (structured dtypes are not supported; supported: " +
              std::string(kSupported) + ")");
        h.descr = parse_string();
      } else if (key == "fortran_order") {
        if (seen_fortran) bad("duplicate key 'fortran_order'");
        seen_fortran = true;
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (seen_shape) bad("duplicate key 'shape'");
        seen_shape = true;
        h.shape = parse_shape();
      } else {
        bad("unexpected key '" + printable(key) +
            "' (a .npy header has exactly descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
      } else if (peek() != '}') {
        bad("expected ',' or '}'");
      }
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) bad("unexpected text after the closing '}'");
    if (!seen_descr) bad("missing key 'descr'");
    if (!seen_fortran) bad("missing key 'fortran_order'");
    if (!seen_shape) bad("missing key 'shape'");
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail_(MOEKIT_MSG("malformed header dict: " << what << " at offset " << pos_ << " in \""
                                               << printable(s_, 200) << "\""));
  }
  // '\0' past the end: never a valid token character, so callers just see "unexpected".
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) bad(MOEKIT_MSG("expected '" << c << "'"));
    ++pos_;
  }
  std::string parse_string() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    ++pos_;
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n')
        bad("escape sequences and newlines are not allowed in strings");
      ++pos_;
    }
    if (pos_ >= s_.size()) bad("unterminated string");
    std::string out(s_.substr(start, pos_ - start));
    ++pos_;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad("'fortran_order' must be True or False");
  }
  // A Python tuple of non-negative ints: "()", "(3,)", "(2, 3)", "(2, 3,)". "(3)" is an int in
  // Python, not a tuple, so numpy rejects it and so do we.
  Shape parse_shape() {
    Shape shape;
    expect('(');
    skip_ws();
    bool trailing_comma = false;
    while (peek() != ')') {
      shape.push_back(parse_dim());
      skip_ws();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        skip_ws();
      } else if (peek() != ')') {
        bad("'shape' must be a tuple of integers: expected ',' or ')'");
      }
    }
    ++pos_;  // ')'
    if (shape.size() == 1 && !trailing_comma) bad("'shape' must be a tuple: write (n,) not (n)");
    return shape;
  }
  std::int64_t parse_dim() {
    if (peek() == '-') bad("negative dimension in 'shape'");
    if (peek() < '0' || peek() > '9') bad("'shape' must be a tuple of integers");
    std::int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10)
        bad("dimension in 'shape' overflows int64");
      v = v * 10 + digit;
      ++pos_;
    }
    // Python 2 era writers appended 'L' to longs.
    if (peek() == 'L') ++pos_;
    return v;
  }

  std::string_view s_;
  const Failer& fail_;
  std::size_t pos_ = 0;
};

DType dtype_from_descr(const std::string& descr, const Failer& fail) {
  if (descr == "<f4") return DType::f32;
  if (descr == "<f2") return DType::f16;
  if (descr == "<i4") return DType::i32;
  // Byte order is meaningless for one-byte types: numpy writes '|u1', other writers '<u1'.
  if (descr == "|u1" || descr == "<u1") return DType::u8;
  if (descr == ">f4" || descr == ">f2" || descr == ">i4")
    fail("big-endian dtype '" + printable(descr) + "' is not supported (supported: " + kSupported +
         ")");
  fail("unsupported dtype '" + printable(descr) + "' (supported: " + kSupported + ")");
}

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "<f4";
    case DType::f16:
      return "<f2";
    case DType::i32:
      return "<i4";
    case DType::u8:
      return "|u1";
    case DType::bf16:
    case DType::u32:
    case DType::f8_e4m3:
    case DType::f8_e8m0:
      break;
  }
  return nullptr;
}

std::uint32_t read_le(const unsigned char* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Tensor parse_impl(const void* data, std::size_t size, const std::string& name, const char* fn) {
  const Failer fail{fn, name};
  const auto* p = static_cast<const unsigned char*>(data);
  if (p == nullptr && size != 0) fail("null data");
  if (size < kMagicLen + 2 || std::memcmp(p, kMagic, kMagicLen) != 0)
    fail("not a .npy file (bad magic; expected \\x93NUMPY)");
  const unsigned major = p[6], minor = p[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(MOEKIT_MSG("unsupported .npy format version " << major << "." << minor
                                                       << " (supported: 1.0, 2.0, 3.0)"));
  // Version 1.0: u16 header length; 2.0 and 3.0 (UTF-8 header): u32.
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix = kMagicLen + 2 + len_bytes;
  if (size < prefix)
    fail(MOEKIT_MSG("file is " << size << " bytes, too short for a version " << major
                               << ".0 header"));
  const std::size_t header_len = read_le(p + kMagicLen + 2, static_cast<int>(len_bytes));
  if (header_len > size - prefix)
    fail(MOEKIT_MSG("header length " << header_len << " runs past the end of the file (" << size
                                     << " bytes)"));
  const std::string_view text(reinterpret_cast<const char*>(p + prefix), header_len);
  const Header h = HeaderParser(text, fail).parse();

  const DType dtype = dtype_from_descr(h.descr, fail);
  if (h.fortran_order)
    fail("fortran_order True is not supported (write a C-order array: np.ascontiguousarray)");
  std::int64_t numel = 0;
  try {
    numel = shape_numel(h.shape);
  } catch (const std::invalid_argument&) {
    fail("element count of shape " + shape_str(h.shape) + " overflows");
  }
  const std::size_t avail = size - prefix - header_len;
  const std::size_t esize = dtype_size(dtype);
  if (static_cast<std::uint64_t>(numel) > avail / esize)
    fail(MOEKIT_MSG("truncated data: shape "
                    << shape_str(h.shape) << " of " << h.descr << " needs "
                    << (static_cast<std::uint64_t>(numel) <= UINT64_MAX / esize
                            ? std::to_string(static_cast<std::uint64_t>(numel) * esize)
                            : std::string("more than 2^64"))
                    << " bytes, file has " << avail));
  // Bytes after the array are ignored, as numpy.load does (np.save may append arrays to one file).
  Tensor t(h.shape, dtype);
  if (t.nbytes() != 0) std::memcpy(t.data(), p + prefix + header_len, t.nbytes());
  return t;
}

}  // namespace

Tensor parse_npy(const void* data, std::size_t size, const std::string& name) {
  return parse_impl(data, size, name, "parse_npy");
}

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error(MOEKIT_MSG("[moekit::read_npy] " << path << ": cannot open ("
                                                              << std::strerror(errno) << ")"));
  std::vector<char> bytes;
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0)
    throw std::runtime_error(
        MOEKIT_MSG("[moekit::read_npy] " << path << ": cannot read (not a regular file?)"));
  in.seekg(0, std::ios::beg);
  bytes.resize(static_cast<std::size_t>(end));
  if (!bytes.empty() && !in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    throw std::runtime_error(MOEKIT_MSG("[moekit::read_npy] " << path << ": read error"));
  return parse_impl(bytes.data(), bytes.size(), path, "read_npy");
}

void write_npy(const std::string& path, const TensorView& t) {
  if (!t.defined())
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::write_npy] " << path << ": tensor is undefined"));
  const char* descr = descr_of(t.dtype());
  if (descr == nullptr)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::write_npy] "
                                           << path << ": dtype " << dtype_name(t.dtype())
                                           << " has no .npy equivalent (supported: f32, f16, "
                                              "i32, u8; convert bf16 to f32 first)"));
  if (t.data() == nullptr && t.nbytes() != 0)
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::write_npy] " << path << ": tensor has no data"));

  // Exactly numpy's header: Python's repr of the dict, padded with spaces and a final '\n' so
  // that the data starts at a multiple of 64 bytes (numpy's ARRAY_ALIGN).
  std::string header = MOEKIT_MSG("{'descr': '" << descr << "', 'fortran_order': False, 'shape': "
                                                << shape_str(t.shape()) << ", }");
  std::size_t len_bytes = 2;
  unsigned char version = 1;
  {
    const std::size_t hlen = header.size() + 1;
    std::size_t pad = 64 - (kMagicLen + 2 + len_bytes + hlen) % 64;
    if (hlen + pad > 0xffff) {  // only for absurd ranks; numpy switches to 2.0 the same way
      version = 2;
      len_bytes = 4;
      pad = 64 - (kMagicLen + 2 + len_bytes + hlen) % 64;
    }
    header.append(pad, ' ');
    header += '\n';
  }
  std::string prefix(kMagic, kMagicLen);
  prefix += static_cast<char>(version);
  prefix += '\0';
  for (std::size_t i = 0; i < len_bytes; ++i)
    prefix += static_cast<char>((header.size() >> (8 * i)) & 0xff);

  namespace fs = std::filesystem;
  static std::atomic<unsigned> counter{0};
  const fs::path target(path);
  fs::path tmp = target;
  tmp += MOEKIT_MSG(".tmp." << ::getpid() << "." << counter.fetch_add(1));
  const auto io_fail = [&](const std::string& what) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw std::runtime_error(MOEKIT_MSG("[moekit::write_npy] " << path << ": " << what));
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      io_fail(MOEKIT_MSG("cannot create " << tmp.string() << " (" << std::strerror(errno) << ")"));
    out.write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    if (t.nbytes() != 0)
      out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
    out.close();
    if (!out) io_fail(MOEKIT_MSG("write to " << tmp.string() << " failed"));
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec)
    io_fail(MOEKIT_MSG("cannot rename " << tmp.string() << " into place (" << ec.message() << ")"));
}

}  // namespace moekit
