// Tensor-name patterns of one decoder layer: "{L}" stands for the layer index (BlockNames in
// moekit/config.hpp). One expansion for the loader and the quantizer. Internal.
#pragma once

#include <cstdint>
#include <string>

namespace moekit::detail {

/// `pattern` with its "{L}" replaced by `layer` ("model.layers.{L}.mlp" -> "model.layers.3.mlp").
inline std::string replace_layer(std::string pattern, std::int64_t layer) {
  const auto pos = pattern.find("{L}");
  if (pos != std::string::npos) pattern.replace(pos, 3, std::to_string(layer));
  return pattern;
}

}  // namespace moekit::detail
