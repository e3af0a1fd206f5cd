// Test utilities: GGUF file images (valid or deliberately broken), built field by field.
// Header-only so any test (and the fuzzer's seeds) can include "io/gguf_writer.hpp".
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace moekit::testing {

/// Appends GGUF fields little-endian; `image()` lays out header, metadata, tensor infos, padding
/// and data as llama.cpp's writer does (tensors back to back, each padded to the alignment).
class GgufImage {
 public:
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> ne;
    std::uint32_t type = 0;
    std::vector<std::uint8_t> bytes;
    std::int64_t offset = -1;  // -1: placed after the previous one
  };

  std::uint32_t version = 3;
  std::size_t alignment = 32;
  std::vector<std::uint8_t> kv;  // the metadata section as written so far
  std::uint64_t kv_count = 0;
  std::vector<Tensor> tensors;

  template <typename T>
  static void put(std::vector<std::uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  static void put_string(std::vector<std::uint8_t>& out, const std::string& s) {
    put<std::uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }

  // One scalar value of GGUF type `type` (u8 = 0 ... f64 = 12) holding `v`.
  template <typename T>
  GgufImage& scalar(const std::string& key, std::uint32_t type, T v) {
    put_string(kv, key);
    put<std::uint32_t>(kv, type);
    put<T>(kv, v);
    ++kv_count;
    return *this;
  }
  GgufImage& u32(const std::string& key, std::uint32_t v) { return scalar(key, 4, v); }
  GgufImage& i32(const std::string& key, std::int32_t v) { return scalar(key, 5, v); }
  GgufImage& f32(const std::string& key, float v) { return scalar(key, 6, v); }
  GgufImage& boolean(const std::string& key, bool v) { return scalar<std::uint8_t>(key, 7, v ? 1 : 0); }
  GgufImage& u16(const std::string& key, std::uint16_t v) { return scalar(key, 2, v); }
  GgufImage& str(const std::string& key, const std::string& v) {
    put_string(kv, key);
    put<std::uint32_t>(kv, 8);
    put_string(kv, v);
    ++kv_count;
    return *this;
  }
  GgufImage& i32s(const std::string& key, const std::vector<std::int32_t>& v) {
    put_string(kv, key);
    put<std::uint32_t>(kv, 9);
    put<std::uint32_t>(kv, 5);
    put<std::uint64_t>(kv, v.size());
    for (const std::int32_t x : v) put(kv, x);
    ++kv_count;
    return *this;
  }
  GgufImage& f32s(const std::string& key, const std::vector<float>& v) {
    put_string(kv, key);
    put<std::uint32_t>(kv, 9);
    put<std::uint32_t>(kv, 6);
    put<std::uint64_t>(kv, v.size());
    for (const float x : v) put(kv, x);
    ++kv_count;
    return *this;
  }
  GgufImage& strs(const std::string& key, const std::vector<std::string>& v) {
    put_string(kv, key);
    put<std::uint32_t>(kv, 9);
    put<std::uint32_t>(kv, 8);
    put<std::uint64_t>(kv, v.size());
    for (const std::string& x : v) put_string(kv, x);
    ++kv_count;
    return *this;
  }
  GgufImage& tensor(const std::string& name, std::vector<std::int64_t> ne, std::uint32_t type,
                    std::vector<std::uint8_t> bytes) {
    tensors.push_back({name, std::move(ne), type, std::move(bytes)});
    return *this;
  }
  /// An F32 tensor of `values`, extents `ne` (ne[0] innermost).
  GgufImage& f32_tensor(const std::string& name, std::vector<std::int64_t> ne, const std::vector<float>& values) {
    std::vector<std::uint8_t> b(values.size() * 4);
    if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
    return tensor(name, std::move(ne), 0, std::move(b));
  }

  std::vector<std::uint8_t> image() const {
    std::vector<std::uint8_t> out;
    put<std::uint32_t>(out, 0x46554747);
    put<std::uint32_t>(out, version);
    put<std::uint64_t>(out, tensors.size());
    put<std::uint64_t>(out, kv_count);
    out.insert(out.end(), kv.begin(), kv.end());
    std::vector<std::uint64_t> offsets;
    std::uint64_t at = 0;
    for (const Tensor& t : tensors) {
      const std::uint64_t off = t.offset >= 0 ? static_cast<std::uint64_t>(t.offset) : at;
      offsets.push_back(off);
      at = (off + t.bytes.size() + alignment - 1) / alignment * alignment;
      put_string(out, t.name);
      put<std::uint32_t>(out, static_cast<std::uint32_t>(t.ne.size()));
      for (const std::int64_t n : t.ne) put<std::int64_t>(out, n);
      put<std::uint32_t>(out, t.type);
      put<std::uint64_t>(out, off);
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    const std::size_t data = out.size();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::size_t end = data + offsets[i] + tensors[i].bytes.size();
      if (out.size() < end) out.resize(end, 0);
      if (!tensors[i].bytes.empty())
        std::memcpy(out.data() + data + offsets[i], tensors[i].bytes.data(), tensors[i].bytes.size());
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    return out;
  }
};

}  // namespace moekit::testing
