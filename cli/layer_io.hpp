// What `moekit forward` and `moekit backward` share: reading and checking an .npy activation
// for a layer, checking output paths before any work, loading a layer with --router overrides.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/tensor.hpp"

namespace moekit::cli {

/// "[3, 17]": the multi-index of flat element `flat` in `shape`.
std::string index_str(const Shape& shape, std::int64_t flat);

/// Reads `path` (an .npy, f32 or f16) as f32 [..., D]. Errors start with `prefix` and name the
/// file (`what`: "input", "grad-output"): another dtype, rank 0, a last dimension other than D
/// (naming layer and model), a non-finite value (the first one, by multi-index).
Tensor read_activation(const std::string& prefix, const std::string& what, const std::string& path, std::int64_t D,
                       const std::string& model, std::int64_t layer);

/// An output path must name a file in an existing directory (checked before any work).
void check_output_path(const std::string& prefix, const std::string& path, const char* option);

/// The config of `model` with each KEY=VALUE of `knobs` applied (set_router_knob), validated,
/// and its layer `layer`.
MoeLayer load_layer_with_knobs(const std::string& prefix, const std::string& model, std::int64_t layer,
                               const std::vector<std::string>& knobs);

}  // namespace moekit::cli
