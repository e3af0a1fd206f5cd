// GGUF files (llama.cpp's model format): one file or a split model, memory-mapped, strictly
// validated (docs/formats.md, "GGUF").
//
// Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata
// count; the metadata (key string, u32 value type, value), each string a u64 length and that many
// UTF-8 bytes; the tensor infos (name, u32 n_dims <= 4, n_dims u64 extents ne[0] first — ne[0] is
// the row length —, u32 ggml type, u64 offset); padding to `general.alignment` (default 32); the
// data section, every tensor's offset relative to its start and a multiple of the alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moekit {

/// A metadata value's type, with the file's numbering.
enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

/// "u32", "str", "arr", ... (as ggml's gguf_type_name spells them).
const char* gguf_type_name(GgufType type) noexcept;

/// One metadata value, read from the file's bytes where they lie (an array's elements are decoded
/// on demand; the file validated all of them when it was opened). Valid while its file lives.
class GgufValue {
 public:
  GgufType type() const noexcept { return type_; }
  /// Arrays: the elements' type.
  GgufType element_type() const noexcept { return element_; }
  /// Arrays: the element count.
  std::uint64_t size() const noexcept { return count_; }
  bool is_integer() const noexcept;  ///< u8 … i64 (not bool)
  bool is_float() const noexcept { return type_ == GgufType::f32 || type_ == GgufType::f64; }

  /// An integer value of any integer type. Throws std::invalid_argument for another type or a u64
  /// above INT64_MAX.
  std::int64_t as_int() const;
  /// f32, f64 or any integer type, widened to double. Throws std::invalid_argument otherwise.
  double as_float() const;
  /// A bool. Throws std::invalid_argument otherwise.
  bool as_bool() const;
  /// A string. Throws std::invalid_argument otherwise.
  std::string as_string() const;
  /// Element `i` of an array. Throws std::invalid_argument for a scalar, std::out_of_range past
  /// the end. Strings and nested arrays are found by walking the elements before them.
  GgufValue at(std::uint64_t i) const;
  /// The elements of an array of integers. Throws as at / as_int.
  std::vector<std::int64_t> as_ints() const;
  /// The elements of an array of numbers, widened to double.
  std::vector<double> as_floats() const;
  /// The elements of an array of strings, in one pass (at() walks from element 0 each time), as
  /// views of the file's bytes: valid while the file lives. Throws std::invalid_argument for a
  /// scalar or an array of another type.
  std::vector<std::string_view> as_strings() const;
  /// "u32 128", "str 'qwen3moe'", "arr[i32, 48]" (inspect, messages); long strings cut short.
  std::string describe() const;

 private:
  friend class GgufFile;
  GgufType type_ = GgufType::u8;
  GgufType element_ = GgufType::u8;
  const std::uint8_t* p_ = nullptr;  // the value's bytes (a string: its characters; an array: element 0)
  std::uint64_t count_ = 0;          // arrays: elements; strings: bytes
};

/// ggml's tensor types by their number in the file (ggml.h's enum ggml_type), with the block a
/// quantized type packs and the bytes of one block.
struct GgmlTypeInfo {
  std::uint32_t id = 0;
  const char* name = "";        ///< "q4_K", as ggml's type_name spells it
  std::int64_t block = 1;       ///< weights per block (1 for f32 / f16 / bf16)
  std::size_t block_bytes = 0;  ///< bytes per block
};
/// The type numbered `id`, or nullptr for a number ggml does not define (or no longer reads).
const GgmlTypeInfo* ggml_type_info(std::uint32_t id) noexcept;

/// One tensor of a GGUF file.
struct GgufTensorInfo {
  std::string name;
  std::uint32_t type = 0;  ///< ggml type id (ggml_type_info)
  /// Extents, innermost first: ne[0] is the row length (a [out, in] weight has ne = {in, out}, an
  /// experts' stack {in, out, E}).
  std::vector<std::int64_t> ne;
  std::uint64_t offset = 0;            ///< from the start of the data section
  std::size_t nbytes = 0;              ///< ne[0] / block × block_bytes × the other extents
  std::string file;                    ///< the file that holds it
  const std::uint8_t* data = nullptr;  ///< its bytes in the mapping
  std::int64_t numel() const noexcept;
};

/// A memory-mapped GGUF file, validated completely when opened: magic and version (2 or 3; 1 and
/// big-endian files refused by name), every count, string length and array extent within the
/// file, no duplicate keys or tensor names, `general.alignment` a u32 power of two, every tensor's
/// type known, its row a whole number of blocks, its bytes (overflow-checked) inside the data
/// section at an aligned offset, no two tensors overlapping. Every failure throws
/// std::runtime_error naming the file (and the key or tensor, where there is one).
class GgufFile {
 public:
  static std::shared_ptr<const GgufFile> open(const std::string& path);
  /// Validates an in-memory image (no mapping); for tests and fuzzing.
  static std::shared_ptr<const GgufFile> from_bytes(std::vector<std::uint8_t> bytes, const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::uint32_t version() const noexcept { return version_; }
  std::size_t alignment() const noexcept { return alignment_; }
  std::size_t file_size() const noexcept { return size_; }
  /// Metadata keys in file order.
  const std::vector<std::string>& keys() const noexcept { return keys_; }
  bool has(const std::string& key) const noexcept { return metadata_.count(key) != 0; }
  /// Throws std::out_of_range naming the key and the file if absent.
  const GgufValue& get(const std::string& key) const;
  /// Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const noexcept { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const GgufTensorInfo* find(const std::string& name) const noexcept;

 private:
  GgufFile() = default;
  void parse();
  std::string path_;
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
  std::vector<std::uint8_t> owned_;
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
};

/// A GGUF model: one file, or every part of a split model (`<prefix>-00001-of-00003.gguf`, as
/// llama.cpp's gguf-split writes them) opened from any one of its parts. Each part's `split.no`
/// must be its place and its `split.count` the same; the first part's `split.tensors.count` must
/// equal the tensors found; no tensor may be in two parts. The metadata is the first part's.
/// Throws std::runtime_error naming the part (a missing one, a part that disagrees) and everything
/// GgufFile::open throws.
class GgufModel {
 public:
  static std::shared_ptr<const GgufModel> open(const std::string& path);
  /// One already-opened file as a model (in-memory images, fuzzing); a split part is refused.
  static std::shared_ptr<const GgufModel> from_file(std::shared_ptr<const GgufFile> file);

  const std::string& path() const noexcept { return path_; }
  /// The parts, in order (one for an unsplit file).
  const std::vector<std::shared_ptr<const GgufFile>>& files() const noexcept { return files_; }
  const GgufFile& first() const noexcept { return *files_.front(); }
  bool has(const std::string& key) const noexcept { return first().has(key); }
  const GgufValue& get(const std::string& key) const { return first().get(key); }
  /// The tensor named `name` in whichever part holds it, or nullptr.
  const GgufTensorInfo* find(const std::string& name) const noexcept;
  /// Every tensor of every part, sorted by name.
  std::vector<const GgufTensorInfo*> tensors() const;

 private:
  std::string path_;
  std::vector<std::shared_ptr<const GgufFile>> files_;
  std::map<std::string, const GgufTensorInfo*> where_;
};

/// Whether `path` names a GGUF file (ends in ".gguf"); load_moe_layer and inspect_report read
/// those with the GGUF reader.
bool is_gguf_path(const std::string& path);

}  // namespace moekit
