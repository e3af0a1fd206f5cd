// What the tests of ggml's block types share: tests/goldens/gguf/blocks.gguf (every type's rows
// as ggml's quantizer wrote them and as random bytes, each with ggml's dequantization;
// make_gguf_goldens.py) and a bitwise float comparison.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "moekit/gguf.hpp"

namespace moekit::testing {

inline const GgufFile& ggml_blocks() {
  static const auto f = GgufFile::open(std::string(MOEKIT_TEST_DATA_DIR) + "/gguf/blocks.gguf");
  return *f;
}

/// The same bits, any NaN matching any NaN.
inline bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace moekit::testing
