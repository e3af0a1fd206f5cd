// The arithmetic a layer's expert projections run in: a value the layer holds and passes down to
// every product (docs/numerics.md says what each mode computes and its error bound; docs/kernels.md
// which kernel runs each).
#pragma once

#include <optional>
#include <string_view>

namespace moekit {

enum class ComputeMode {
  /// fp32 activations times the weights' exact decode, fp32 sums (the default).
  exact,
  /// The int8 fast mode: on quantized weights (4- and 8-bit MLX affine, MXFP4, NVFP4, int4,
  /// ggml's block types) the activations are quantized to int8 per weight group and multiplied
  /// with the codes as integers where a kernel for it applies; the exact kernels elsewhere.
  int8,
  /// The bf16 compute mode: the rows entering each projection rounded to bf16, multiplied with
  /// bf16 (or FP8-decoded-to-bf16) weights as exact bf16 products summed in fp32.
  bf16,
};

/// "exact", "int8", "bf16".
constexpr const char* compute_mode_name(ComputeMode mode) noexcept {
  switch (mode) {
    case ComputeMode::int8:
      return "int8";
    case ComputeMode::bf16:
      return "bf16";
    case ComputeMode::exact:
      break;
  }
  return "exact";
}

/// The mode named `name` (compute_mode_name's spelling), or nullopt.
constexpr std::optional<ComputeMode> compute_mode_from_name(std::string_view name) noexcept {
  for (const ComputeMode m : {ComputeMode::exact, ComputeMode::int8, ComputeMode::bf16})
    if (name == compute_mode_name(m)) return m;
  return std::nullopt;
}

}  // namespace moekit
