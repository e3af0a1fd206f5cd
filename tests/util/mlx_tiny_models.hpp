// The whole tiny models of tools/gen_quantize_goldens.py, rebuilt from its manifest: every
// value is drawn from the tensor's name (the generator's values()), so the float checkpoints
// mlx-lm quantized need not be checked in.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/safetensors_writer.hpp"
#include "moekit/tensor.hpp"

namespace moekit::testing {

using nlohmann::json;
inline const std::string kQuantizeDir = std::string(MOEKIT_TEST_DATA_DIR) + "/quantize";

inline json manifest() {
  std::ifstream in(kQuantizeDir + "/manifest.json");
  return json::parse(in);
}

inline std::uint64_t fnv1a64(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// The generator's values(): splitmix64 of (fnv1a64(name) + i·golden), top 24 bits as u in [0, 1),
// offset + 2^amp_log2 · (2u − 1); every step exact in f32.
inline std::vector<float> draw(const std::string& name, std::int64_t n, int amp_log2, float offset) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(name.data());
  const std::uint64_t base = fnv1a64(bytes, name.size());
  std::vector<float> out(static_cast<std::size_t>(n));
  const float amp = std::ldexp(1.0f, amp_log2);
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint64_t z = base + static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / 16777216.0f;
    out[static_cast<std::size_t>(i)] = offset + amp * (2.0f * u - 1.0f);
  }
  return out;
}

// Rebuilds the case's float checkpoint (Hugging Face layout) in `dir`.
inline void write_source(const json& c, const std::filesystem::path& dir) {
  std::vector<SafetensorsEntry> entries;
  for (const json& t : c.at("inputs")) {
    const Shape shape = t.at("shape").get<Shape>();
    const std::string dt = t.at("dtype").get<std::string>();
    const std::vector<float> v = draw(t.at("name").get<std::string>(), shape_numel(shape), t.at("amp_log2").get<int>(),
                                      t.at("offset").get<float>());
    std::vector<std::uint8_t> bytes;
    if (dt == "BF16") {
      std::vector<std::uint16_t> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      bytes = to_bytes(h);
    } else {
      bytes = to_bytes(v);
    }
    entries.push_back({t.at("name").get<std::string>(), dt, shape, std::move(bytes)});
  }
  write_safetensors(dir / "model.safetensors", entries);
  write_text(dir / "config.json", c.at("config").dump(2));
}

inline json case_named(const std::string& name) {
  const json m = manifest();
  for (const json& c : m.at("cases"))
    if (c.at("name") == name) return c;
  throw std::runtime_error("no case " + name);
}


}  // namespace moekit::testing
