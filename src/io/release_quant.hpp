// quantization_config of a Hugging Face release (quant_method "fp8", "compressed-tensors") ->
// ReleaseQuant: which element, block and scales its quantized modules are stored in. Internal.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "moekit/config.hpp"

namespace moekit::detail {

/// Reads `qc` (the quantization_config object, quant_method `method`). Throws
/// std::invalid_argument naming `model_type` and the field for a scheme moekit does not read.
ReleaseQuant parse_release_quant(const nlohmann::json& qc, const std::string& method, const std::string& model_type);

}  // namespace moekit::detail
