// Test utilities: write safetensors files (valid or deliberately broken) and scratch folders.
// Header-only so any test can include "io/safetensors_writer.hpp".
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit::testing {

/// One tensor to write: its name, the dtype as the file spells it ("F32", "BF16", "F8_E4M3"...),
/// its shape and its raw little-endian bytes (written as given, not checked against the shape).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  std::vector<std::uint8_t> bytes;
};

/// The bytes of an element vector (host order; tests run on little-endian hosts).
template <typename T>
std::vector<std::uint8_t> to_bytes(const std::vector<T>& values) {
  std::vector<std::uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// A file image from a header given as text: 8-byte little-endian length, the header padded with
/// spaces to a multiple of 8 bytes (as the reference writer does), then `data`.
inline std::vector<std::uint8_t> safetensors_image_raw(std::string header,
                                                       const std::vector<std::uint8_t>& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> out(8 + header.size() + data.size());
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

/// A valid file image: tensors laid out back to back in the given order, offsets computed.
inline std::vector<std::uint8_t> safetensors_image(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::uint8_t> data;
  for (const SafetensorsEntry& e : entries) {
    const std::size_t begin = data.size();
    data.insert(data.end(), e.bytes.begin(), e.bytes.end());
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {begin, data.size()}}};
  }
  return safetensors_image_raw(header.dump(), data);
}

inline void write_file(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("write_file: cannot write " + path.string());
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  write_file(path, std::vector<std::uint8_t>(text.begin(), text.end()));
}

/// Writes a valid safetensors file.
inline void write_safetensors(const std::filesystem::path& path,
                              const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata = {}) {
  write_file(path, safetensors_image(entries, metadata));
}

/// A fresh folder under the system temp directory, removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    static std::atomic<unsigned> counter{0};
    path_ = std::filesystem::temp_directory_path() / ("moekit_test_" + std::to_string(::getpid()) +
                                                      "_" + name + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace moekit::testing
