// safetensors checkpoints: one file or a sharded folder, memory-mapped, strictly validated.
// Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}},
// then the data buffer; offsets are relative to the buffer start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit {

/// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string name;
  std::string dtype_name;         ///< as in the file: "F32", "BF16", "F8_E4M3", ...
  std::optional<DType>
      dtype;  ///< set for the dtypes moekit computes on or carries (F32, BF16, F16, I32, U8, U32, F8_E4M3, F8_E8M0)
  std::size_t element_size = 0;   ///< bytes per element of dtype_name; 0 for sub-byte types (F4, F6_*)
  Shape shape;
  std::size_t begin = 0, end = 0;  ///< byte range inside the data buffer
  std::string file;                ///< the file that holds it
};

/// Every dtype name the format defines: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16,
/// BF16, I32, U32, F32, F64, I64, U64, F4, F6_E2M3, F6_E3M2, C64. F4 (4 bits) and F6_* (6 bits)
/// are packed with no padding, as the reference implementation does: a tensor of them must hold
/// a whole number of bytes (F4: an even element count, F6: a multiple of 4), and its byte size is
/// element count x bits / 8. All others are whole bytes.
const std::vector<std::string>& safetensors_dtype_names();

/// The name the format gives a moekit dtype ("F32", "BF16", "F16", "I32", "U8", "U32", "F8_E4M3", "F8_E8M0").
const char* safetensors_dtype_name(DType dtype) noexcept;

/// A memory-mapped safetensors file. The header is validated completely when opened: header
/// length within the file and below 100 MB, valid JSON object, every entry with a known dtype,
/// non-negative shape, 2 offsets with begin <= end <= buffer size, end - begin == element count x
/// dtype size, entries not overlapping (gaps are allowed); __metadata__ a map of strings; no
/// duplicate keys anywhere in the JSON (rejected, where JSON libraries usually keep the last).
/// Every failure throws std::runtime_error naming the file (and the tensor, where there is one).
class SafetensorsFile {
 public:
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);
  /// Validates an in-memory image (no mapping); for tests and fuzzing.
  static std::shared_ptr<const SafetensorsFile> from_bytes(std::vector<std::uint8_t> bytes, const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// Tensor names in header order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const noexcept;
  /// Throws std::out_of_range naming the tensor and file if absent.
  const TensorInfo& info(const std::string& name) const;
  /// A view of the mapped bytes (no copy). Throws std::out_of_range if absent, and
  /// std::runtime_error naming the tensor and its dtype if moekit cannot compute on that dtype.
  /// The view is valid as long as this object lives; its data may be unaligned for its dtype
  /// (check before using it as typed memory).
  TensorView view(const std::string& name) const;
  /// The raw bytes of a tensor (any dtype).
  const std::uint8_t* bytes(const std::string& name) const;
  /// Copies a tensor's bytes (info(name).end - begin of them) into `dst` by reading the file, not
  /// the mapping: small tensors interleaved with large ones (an FP8 weight's scales) then do not
  /// make their neighbours' pages resident, as touching the mapping would (the kernel maps up to
  /// 64 KB of cached pages around each fault). Throws std::runtime_error if the read fails.
  void read(const std::string& name, void* dst) const;
  /// Bytes of the whole file.
  std::size_t file_size() const noexcept { return size_; }

 private:
  SafetensorsFile() = default;
  void parse(const std::string& name);
  std::string path_;
  const std::uint8_t* base_ = nullptr;  // whole file
  std::size_t size_ = 0;
  std::size_t data_start_ = 0;  // 8 + header length
  bool mapped_ = false;
  int fd_ = -1;                      // the mapped file, for read(); -1 for from_bytes
  std::vector<std::uint8_t> owned_;  // from_bytes
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
};

/// A checkpoint folder: `model.safetensors.index.json` (its "weight_map" names the shard of each
/// tensor) or, without an index, every `*.safetensors` file in the folder; or a single file.
/// All shards are opened and validated up front.
/// Throws std::runtime_error naming the file for a missing folder, bad index JSON, a shard
/// listed in the index that does not exist, a tensor the index places in a shard that lacks it,
/// or the same tensor name in two shards.
class Checkpoint {
 public:
  static std::shared_ptr<const Checkpoint> open(const std::string& path);
  /// One already-opened file (e.g. SafetensorsFile::from_bytes) as a checkpoint; for fuzzing.
  static std::shared_ptr<const Checkpoint> from_file(std::shared_ptr<const SafetensorsFile> file);

  const std::string& path() const noexcept { return path_; }
  bool contains(const std::string& name) const noexcept;
  const TensorInfo& info(const std::string& name) const;  ///< std::out_of_range if absent
  TensorView view(const std::string& name) const;         ///< as SafetensorsFile::view
  const std::uint8_t* bytes(const std::string& name) const;  ///< as SafetensorsFile::bytes
  void read(const std::string& name, void* dst) const;       ///< as SafetensorsFile::read
  std::vector<std::string> names() const;                 ///< sorted
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const noexcept { return files_; }

 private:
  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor -> index into files_
  const SafetensorsFile& file_of(const std::string& name) const;  // std::out_of_range if absent
};

/// Writes one safetensors file tensor by tensor, so a shard never has to fit in memory. The
/// header is fixed up front from the entries (tensors laid out back to back in entry order, the
/// header padded with spaces to a multiple of 8 bytes); write() must then be called once per
/// entry, in order, with exactly that entry's bytes; commit() flushes the data and renames the
/// temporary file `<path>.partial` onto `path`. A writer destroyed without commit() (an error on
/// the way) removes its temporary file, so a half-written file never carries the final name.
/// Every failure throws std::runtime_error naming the file (and the tensor, where there is one).
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    std::string dtype;  ///< as the file spells it ("BF16", "U32", ...)
    Shape shape;
    std::size_t nbytes = 0;
  };
  SafetensorsWriter(std::string path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  /// The next entry's bytes.
  void write(const void* data, std::size_t nbytes);
  void commit();
  /// Bytes of the whole file (header included).
  std::size_t file_size() const noexcept { return file_size_; }

 private:
  std::string path_, tmp_;
  std::vector<Entry> entries_;
  std::size_t next_ = 0, file_size_ = 0;
  std::FILE* out_ = nullptr;
};

}  // namespace moekit
