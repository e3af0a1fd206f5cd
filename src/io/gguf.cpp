// GGUF reading: mmap, complete validation up front (moekit/gguf.hpp; split models: gguf_split.cpp).
// The format as llama.cpp's ggml/src/gguf.cpp reads it, with these differences on purpose:
//  - tensors may lie in any order with gaps between them (ggml requires each to follow the
//    previous, padded to the alignment); overlapping tensors are refused;
//  - arrays of arrays are read (ggml refuses them), nested at most kMaxDepth deep;
//  - types ggml no longer reads (4, 5, 31-33, 36-38) are refused with their number.
// Files are untrusted: every count, length and offset is checked against the bytes left before
// it is used, and all arithmetic on them is overflow-checked.
#include "moekit/gguf.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/table.hpp"
#include "util/error.hpp"
#include "util/mapped_file.hpp"

namespace moekit {

namespace {

constexpr std::uint32_t kMagic = 0x46554747;   // "GGUF" read little-endian
constexpr int kMaxDims = 4;                    // GGML_MAX_DIMS
constexpr int kMaxDepth = 8;                   // arrays nested in arrays
constexpr std::size_t kDefaultAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::gguf] " << file << ": " << what));
}

// Bytes of one scalar of `t`; 0 for strings and arrays (variable).
std::size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
      return 8;
    case GgufType::string:
    case GgufType::array:
      break;
  }
  return 0;
}

bool known_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(GgufType::f64); }

template <typename T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A string for a message: printable ASCII kept, the rest escaped, at most 80 characters.
std::string printable(const std::uint8_t* p, std::uint64_t n) {
  std::string out;
  for (std::uint64_t i = 0; i < n && out.size() < 80; ++i) {
    const unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (n > 80) out += "...";
  return out;
}

// The file's bytes, read front to back; every read checked against the end.
class Cursor {
 public:
  Cursor(const std::uint8_t* base, std::size_t size, const std::string& file) : base_(base), size_(size), file_(file) {}
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }
  const std::uint8_t* here() const { return base_ + pos_; }

  const std::uint8_t* take(std::uint64_t n, const std::string& what) {
    if (n > left())
      fail(file_, MOEKIT_MSG("truncated: " << what << " needs " << n << " bytes at offset " << pos_ << ", the file has "
                                           << left() << " left"));
    const std::uint8_t* p = here();
    pos_ += static_cast<std::size_t>(n);
    return p;
  }
  template <typename T>
  T read(const std::string& what) {
    return load<T>(take(sizeof(T), what));
  }
  std::string string(const std::string& what) {
    const std::uint64_t n = read<std::uint64_t>(what + "'s length");
    const std::uint8_t* p = take(n, MOEKIT_MSG(what << " of " << n << " bytes"));
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
  }

 private:
  const std::uint8_t* base_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::string& file_;
};

// Skips one string, checking its length; `what` names it for messages.
void skip_string(Cursor& c, const std::string& what) {
  const std::uint64_t n = c.read<std::uint64_t>(what + "'s length");
  c.take(n, MOEKIT_MSG(what << ", a string of " << n << " bytes"));
}

// An array's element type and count, then its elements, checked; returns where element 0 lies.
const std::uint8_t* skip_array(Cursor& c, int depth, const std::string& what, GgufType& element, std::uint64_t& count,
                               const std::string& file) {
  if (depth > kMaxDepth) fail(file, MOEKIT_MSG(what << ": arrays nest deeper than " << kMaxDepth << " levels"));
  const std::uint32_t et = c.read<std::uint32_t>(what + "'s element type");
  if (!known_type(et)) fail(file, MOEKIT_MSG(what << ": unknown array element type " << et));
  element = static_cast<GgufType>(et);
  count = c.read<std::uint64_t>(what + "'s element count");
  const std::uint8_t* first = c.here();
  if (element == GgufType::string || element == GgufType::array) {
    // Each element takes at least 8 bytes (a length, or a type and a count): a count beyond what
    // the file can hold fails before the loop runs that long.
    if (count > c.left() / 8)
      fail(file, MOEKIT_MSG("truncated: " << what << " claims " << count << " elements, more than the " << c.left()
                                          << " bytes left can hold"));
    for (std::uint64_t i = 0; i < count; ++i) {
      // A string that fits is skipped without naming it (a vocabulary has 10^5 of them); the
      // message is built only for one that does not.
      if (element == GgufType::string && c.left() >= 8 && load<std::uint64_t>(c.here()) <= c.left() - 8) {
        c.take(8 + load<std::uint64_t>(c.here()), what);
        continue;
      }
      const std::string item = MOEKIT_MSG(what << "[" << i << "]");
      if (element == GgufType::string) {
        skip_string(c, item);
      } else {
        GgufType inner;
        std::uint64_t n;
        skip_array(c, depth + 1, item, inner, n, file);
      }
    }
  } else {
    const std::size_t es = scalar_size(element);
    if (count > c.left() / es)
      fail(file, MOEKIT_MSG("truncated: " << what << " claims " << count << " elements of " << es << " bytes, "
                                          << c.left() << " bytes left"));
    c.take(count * es, what);
  }
  return first;
}

// Bytes of the value of type `t` starting at `p` (already validated): where the next one starts.
std::size_t value_bytes(const std::uint8_t* p, GgufType t) {
  if (t == GgufType::string) return 8 + static_cast<std::size_t>(load<std::uint64_t>(p));
  if (t != GgufType::array) return scalar_size(t);
  const auto et = static_cast<GgufType>(load<std::uint32_t>(p));
  const std::uint64_t n = load<std::uint64_t>(p + 4);
  std::size_t bytes = 12;
  if (et == GgufType::string || et == GgufType::array) {
    for (std::uint64_t i = 0; i < n; ++i) bytes += value_bytes(p + bytes, et);
  } else {
    bytes += static_cast<std::size_t>(n) * scalar_size(et);
  }
  return bytes;
}

// ggml's types moekit reads tensors of (sizes, names) but computes on as plain dtypes or not at
// all. The block types it computes on are not here: their numbers, names and block sizes are
// on their formats (kernels/formats/ggml_*.hpp), and ggml_types() adds them.
constexpr GgmlTypeInfo kOtherTypes[] = {
    {0, "f32", 1, 4},         {1, "f16", 1, 2},        {9, "q8_1", 32, 36},      {15, "q8_K", 256, 292},
    {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74}, {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},
    {21, "iq3_s", 256, 110},  {22, "iq2_s", 256, 82},  {24, "i8", 1, 1},         {25, "i16", 1, 2},
    {26, "i32", 1, 4},        {27, "i64", 1, 8},       {28, "f64", 1, 8},        {29, "iq1_m", 256, 56},
    {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},  {35, "tq2_0", 256, 66},   {40, "nvfp4", 64, 36},
    {41, "q1_0", 128, 18},    {42, "q2_0", 64, 18},
};

// Every type ggml_type_info knows: the block types of the format list, then kOtherTypes (a type
// that gains a format is taken from its format, whether or not it is still listed there).
const std::vector<GgmlTypeInfo>& ggml_types() {
  static const std::vector<GgmlTypeInfo> all = [] {
    std::vector<GgmlTypeInfo> v;
#define MOEKIT_GGUF_TYPE(f)                                                                                            \
  {                                                                                                                    \
    const kernels::formats::FormatTraits& t = kernels::formats::traits(Element::f);                                    \
    v.push_back(                                                                                                       \
        {static_cast<std::uint32_t>(t.gguf.gguf_id), t.name, t.gguf.weights, static_cast<std::size_t>(t.gguf.bytes)}); \
  }
    MOEKIT_GGML_FORMATS(MOEKIT_GGUF_TYPE)
#undef MOEKIT_GGUF_TYPE
    for (const GgmlTypeInfo& t : kOtherTypes)
      if (std::none_of(v.begin(), v.end(), [&](const GgmlTypeInfo& f) { return f.id == t.id; })) v.push_back(t);
    return v;
  }();
  return all;
}

}  // namespace

const char* gguf_type_name(GgufType type) noexcept {
  static constexpr const char* kNames[] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
                                           "bool", "str", "arr", "u64", "i64", "f64"};
  const auto i = static_cast<std::uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const GgmlTypeInfo* ggml_type_info(std::uint32_t id) noexcept {
  for (const GgmlTypeInfo& t : ggml_types())
    if (t.id == id) return &t;
  return nullptr;
}

// --- GgufValue ----------------------------------------------------------------------------------

bool GgufValue::is_integer() const noexcept {
  switch (type_) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64:
      return true;
    default:
      return false;
  }
}

std::int64_t GgufValue::as_int() const {
  switch (type_) {
    case GgufType::u8:
      return load<std::uint8_t>(p_);
    case GgufType::i8:
      return load<std::int8_t>(p_);
    case GgufType::u16:
      return load<std::uint16_t>(p_);
    case GgufType::i16:
      return load<std::int16_t>(p_);
    case GgufType::u32:
      return load<std::uint32_t>(p_);
    case GgufType::i32:
      return load<std::int32_t>(p_);
    case GgufType::i64:
      return load<std::int64_t>(p_);
    case GgufType::u64: {
      const auto v = load<std::uint64_t>(p_);
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw std::invalid_argument(MOEKIT_MSG("u64 " << v << " is too large"));
      return static_cast<std::int64_t>(v);
    }
    default:
      throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not an integer"));
  }
}

double GgufValue::as_float() const {
  if (type_ == GgufType::f32) return load<float>(p_);
  if (type_ == GgufType::f64) return load<double>(p_);
  if (type_ == GgufType::u64) return static_cast<double>(load<std::uint64_t>(p_));
  if (is_integer()) return static_cast<double>(as_int());
  throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not a number"));
}

bool GgufValue::as_bool() const {
  if (type_ != GgufType::boolean) throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not a bool"));
  return *p_ != 0;
}

std::string GgufValue::as_string() const {
  if (type_ != GgufType::string) throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not a string"));
  return std::string(reinterpret_cast<const char*>(p_), static_cast<std::size_t>(count_));
}

GgufValue GgufValue::at(std::uint64_t i) const {
  if (type_ != GgufType::array) throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not an array"));
  if (i >= count_) throw std::out_of_range(MOEKIT_MSG("index " << i << " past the array's " << count_ << " elements"));
  GgufValue v;
  v.type_ = element_;
  const std::uint8_t* p = p_;
  const std::size_t fixed = scalar_size(element_);
  if (fixed != 0) {
    p += static_cast<std::size_t>(i) * fixed;
  } else {
    for (std::uint64_t j = 0; j < i; ++j) p += value_bytes(p, element_);
  }
  if (element_ == GgufType::string) {
    v.count_ = load<std::uint64_t>(p);
    v.p_ = p + 8;
  } else if (element_ == GgufType::array) {
    v.element_ = static_cast<GgufType>(load<std::uint32_t>(p));
    v.count_ = load<std::uint64_t>(p + 4);
    v.p_ = p + 12;
  } else {
    v.p_ = p;
  }
  return v;
}

std::vector<std::int64_t> GgufValue::as_ints() const {
  if (type_ != GgufType::array) throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not an array"));
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(count_));
  for (std::uint64_t i = 0; i < count_; ++i) out.push_back(at(i).as_int());
  return out;
}

std::vector<double> GgufValue::as_floats() const {
  if (type_ != GgufType::array) throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not an array"));
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(count_));
  for (std::uint64_t i = 0; i < count_; ++i) out.push_back(at(i).as_float());
  return out;
}

std::vector<std::string_view> GgufValue::as_strings() const {
  if (type_ != GgufType::array || element_ != GgufType::string)
    throw std::invalid_argument(MOEKIT_MSG("is " << describe() << ", not an array of strings"));
  std::vector<std::string_view> out;
  out.reserve(static_cast<std::size_t>(count_));
  const std::uint8_t* p = p_;
  for (std::uint64_t i = 0; i < count_; ++i) {  // lengths validated when the file was opened
    const auto n = static_cast<std::size_t>(load<std::uint64_t>(p));
    out.emplace_back(reinterpret_cast<const char*>(p + 8), n);
    p += 8 + n;
  }
  return out;
}

std::string GgufValue::describe() const {
  switch (type_) {
    case GgufType::string:
      return "str '" + printable(p_, count_) + "'";
    case GgufType::array:
      return MOEKIT_MSG("arr[" << gguf_type_name(element_) << ", " << count_ << "]");
    case GgufType::boolean:
      return std::string("bool ") + (*p_ ? "true" : "false");
    case GgufType::f32:
    case GgufType::f64:
      return MOEKIT_MSG(gguf_type_name(type_) << " " << as_float());
    case GgufType::u64:
      return MOEKIT_MSG("u64 " << load<std::uint64_t>(p_));
    default:
      return MOEKIT_MSG(gguf_type_name(type_) << " " << as_int());
  }
}

std::int64_t GgufTensorInfo::numel() const noexcept {
  std::int64_t n = 1;
  for (const std::int64_t d : ne) n *= d;
  return n;
}

// --- GgufFile -----------------------------------------------------------------------------------

GgufFile::~GgufFile() {
  if (mapped_ && base_ != nullptr) ::munmap(const_cast<std::uint8_t*>(base_), size_);
}

std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path) {
  detail::MappedFile m;
  if (const std::string why = detail::map_file(path, false, m); !why.empty()) fail(path, why);
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->base_ = m.data;
  f->size_ = m.size;
  f->mapped_ = m.data != nullptr;
  f->parse();
  return f;
}

std::shared_ptr<const GgufFile> GgufFile::from_bytes(std::vector<std::uint8_t> bytes, const std::string& name) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

void GgufFile::parse() {
  const std::string& file = path_;
  Cursor c(base_, size_, file);
  if (size_ < 4 || load<std::uint32_t>(base_) != kMagic)
    fail(file, "not a GGUF file (the first 4 bytes are not 'GGUF')");
  c.take(4, "magic");
  version_ = c.read<std::uint32_t>("version");
  if (version_ != 0 && (version_ & 0xFFFF) == 0)
    fail(file, MOEKIT_MSG("version " << version_ << " reads as a big-endian file; moekit reads little-endian GGUF"));
  if (version_ == 1) fail(file, "GGUF version 1 is not read (llama.cpp dropped it too); convert it to version 3");
  if (version_ != 2 && version_ != 3) fail(file, MOEKIT_MSG("GGUF version " << version_ << " is not 2 or 3"));
  const std::uint64_t n_tensors = c.read<std::uint64_t>("tensor count");
  const std::uint64_t n_kv = c.read<std::uint64_t>("metadata count");
  // A key-value pair takes at least 12 bytes, a tensor info at least 24: larger counts cannot fit.
  if (n_kv > c.left() / 12)
    fail(file, MOEKIT_MSG("truncated: metadata count " << n_kv << " cannot fit in the " << c.left() << " bytes left"));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.string(MOEKIT_MSG("metadata key " << i));
    const std::string what =
        "metadata '" + printable(reinterpret_cast<const std::uint8_t*>(key.data()), key.size()) + "'";
    const std::uint32_t t = c.read<std::uint32_t>(what + "'s type");
    if (!known_type(t)) fail(file, MOEKIT_MSG(what << " has unknown value type " << t));
    GgufValue v;
    v.type_ = static_cast<GgufType>(t);
    if (v.type_ == GgufType::string) {
      v.count_ = c.read<std::uint64_t>(what + "'s length");
      v.p_ = c.take(v.count_, MOEKIT_MSG(what << ", a string of " << v.count_ << " bytes"));
    } else if (v.type_ == GgufType::array) {
      v.p_ = skip_array(c, 1, what, v.element_, v.count_, file);
    } else {
      v.p_ = c.take(scalar_size(v.type_), what);
    }
    if (!metadata_.emplace(key, v).second) fail(file, "duplicate " + what);
    keys_.push_back(key);
  }
  if (has("general.alignment")) {
    const GgufValue& a = metadata_.at("general.alignment");
    if (a.type() != GgufType::u32)
      fail(file, MOEKIT_MSG("metadata 'general.alignment' is " << a.describe() << ", expected u32"));
    const std::int64_t al = a.as_int();
    if (al == 0 || (al & (al - 1)) != 0)
      fail(file, MOEKIT_MSG("metadata 'general.alignment' is " << al << ", not a power of two"));
    alignment_ = static_cast<std::size_t>(al);
  } else {
    alignment_ = kDefaultAlignment;
  }
  if (n_tensors > c.left() / 24)
    fail(file,
         MOEKIT_MSG("truncated: tensor count " << n_tensors << " cannot fit in the " << c.left() << " bytes left"));
  tensors_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.file = file;
    t.name = c.string(MOEKIT_MSG("tensor " << i << "'s name"));
    const std::string what =
        "tensor '" + printable(reinterpret_cast<const std::uint8_t*>(t.name.data()), t.name.size()) + "'";
    const std::uint32_t n_dims = c.read<std::uint32_t>(what + "'s dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(file, MOEKIT_MSG(what << " has " << n_dims << " dimensions (1 to " << kMaxDims << " allowed)"));
    std::int64_t numel = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto n = c.read<std::int64_t>(MOEKIT_MSG(what << "'s extent " << d));
      if (n < 0) fail(file, MOEKIT_MSG(what << " has a negative extent ne[" << d << "] = " << n));
      if (n != 0 && numel > std::numeric_limits<std::int64_t>::max() / n)
        fail(file, MOEKIT_MSG(what << " has more elements than fit in 64 bits"));
      numel *= n;
      t.ne.push_back(n);
    }
    t.type = c.read<std::uint32_t>(what + "'s type");
    t.offset = c.read<std::uint64_t>(what + "'s offset");
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (ti == nullptr) fail(file, MOEKIT_MSG(what << " has unknown ggml type " << t.type));
    if (t.ne[0] % ti->block != 0)
      fail(file, MOEKIT_MSG(what << " has rows of " << t.ne[0] << " elements, not a multiple of " << ti->name
                                 << "'s block of " << ti->block));
    const std::uint64_t blocks = static_cast<std::uint64_t>(numel / ti->block);
    if (blocks > std::numeric_limits<std::uint64_t>::max() / ti->block_bytes)
      fail(file, MOEKIT_MSG(what << "'s byte size overflows 64 bits"));
    const std::uint64_t nbytes = blocks * ti->block_bytes;
    if (nbytes > std::numeric_limits<std::size_t>::max()) fail(file, MOEKIT_MSG(what << " is too large"));
    t.nbytes = static_cast<std::size_t>(nbytes);
    if (t.offset % alignment_ != 0)
      fail(file, MOEKIT_MSG(what << " has offset " << t.offset << ", not a multiple of the alignment " << alignment_));
    if (!index_.emplace(t.name, tensors_.size()).second) fail(file, "duplicate " + what);
    tensors_.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment (from the file's start).
  const std::size_t header = c.pos();
  const std::size_t data = header % alignment_ == 0 ? header : header + (alignment_ - header % alignment_);
  if (n_tensors > 0 && data > size_)
    fail(file,
         MOEKIT_MSG("truncated: the data section starts at " << data << ", past the end (" << size_ << " bytes)"));
  const std::size_t data_size = data <= size_ ? size_ - data : 0;
  // In range, then not overlapping (sorted by offset, each must end before the next begins).
  std::vector<const GgufTensorInfo*> by_offset;
  for (GgufTensorInfo& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(file, MOEKIT_MSG("truncated: tensor '" << t.name << "' (" << ggml_type_info(t.type)->name << ", " << t.nbytes
                                                  << " bytes at offset " << t.offset
                                                  << ") ends past the data section's " << data_size << " bytes"));
    t.data = t.nbytes > 0 ? base_ + data + t.offset : base_;  // an empty tensor points nowhere past the file
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->nbytes > by_offset[i]->offset)
      fail(file, MOEKIT_MSG("tensors '" << by_offset[i - 1]->name << "' and '" << by_offset[i]->name << "' overlap"));
}

const GgufValue& GgufFile::get(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end())
    throw std::out_of_range(MOEKIT_MSG("[moekit::gguf] " << path_ << ": no metadata '" << key << "'"));
  return it->second;
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const noexcept {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace moekit
