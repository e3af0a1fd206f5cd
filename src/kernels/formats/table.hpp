// The weight-format table: what the code outside the kernels asks of a format (validation,
// bytes, a description, the scalar reference decode), one entry per quantized Element. Each
// format's rules live in its own file here (affine.hpp, ...); MOEKIT_QUANTIZED_FORMATS lists
// them, and both this table and the SIMD dispatch (gemm_quant.cpp) are generated from that list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/gemm.hpp"
#include "moekit/weight_format.hpp"

// X(element): one line per quantized format; `element` names both the Element enumerator and the
// format's namespace (kernels::formats::element, and kernels::HWY_NAMESPACE::element for SIMD).
// The ggml block types' list, MOEKIT_GGML_FORMATS, is in ggml_types.hpp beside their includes:
// a file that expands either list includes it.
#define MOEKIT_QUANTIZED_FORMATS(X) X(affine) X(e2m1) X(e4m3) X(int4) MOEKIT_GGML_FORMATS(X)

namespace moekit::kernels::formats {

/// One quantized format's rules.
struct FormatTraits {
  const char* name;  ///< "affine"
  DType container;   ///< dtype of the stored elements (what ExpertMatrix::experts point at)
  /// Container elements per row of `cols` weights.
  std::int64_t (*row_elements)(const WeightFormat& f, std::int64_t cols);
  /// Why `f` cannot store a [rows, cols] matrix (bits, block shape, scale dtype), or "" if it can.
  std::string (*check)(const WeightFormat& f, std::int64_t rows, std::int64_t cols);
  /// "4-bit affine, group 64, bf16 scales" (inspect, messages).
  std::string (*describe)(const WeightFormat& f);
  /// Weight (n, k) of B, decoded exactly as the format's reference code decodes it, in fp32.
  float (*decode)(const WeightMatrix& B, std::int64_t n, std::int64_t k);
  /// The scales lie inside the container's blocks (ggml's types): no scale or bias arrays.
  bool inline_scales = false;
  /// ggml's block types: the type's number in GGUF files, its code bits, weights and bytes per
  /// block, and the bytes where a block's scales lie (f16 d and dmin, or MXFP4's e8m0; -1: none)
  /// — the one statement of them: the GGUF reader and loader, WeightFormat::ggml and the
  /// benchmarks read them here. gguf_id -1 for the other formats.
  struct GgufBlock {
    int gguf_id = -1;
    int bits = 0, weights = 0, bytes = 0;
    int scale_at[2] = {-1, -1};
  } gguf{};
};

/// Whether `element` is one of the quantized formats of the list.
bool known(Element element) noexcept;

/// The rules of a quantized format. Throws std::invalid_argument for Element::plain or a value
/// outside the enumeration (a corrupt descriptor), naming it.
const FormatTraits& traits(Element element);

/// Whether a quantized format keeps its scales inside its blocks (no scale array): ggml's types.
bool inline_scales(const WeightFormat& f);

/// Whether `element` is a ggml block type with an integer form (Type::kInt8): the int8 mode's
/// kernels take it.
bool ggml_int8(Element element) noexcept;

/// The ggml block type numbered `gguf_id` in GGUF files (FormatTraits::gguf), or Element::plain
/// for a number that is not one of the formats of the list.
Element gguf_element(std::uint32_t gguf_id) noexcept;

/// Rows and columns of a quantized matrix's scale (and bias) array; 0 for a format whose scales
/// lie inside its blocks.
inline std::int64_t scale_rows(const WeightFormat& f, std::int64_t rows) {
  return inline_scales(f) ? 0 : (rows + f.block_rows - 1) / f.block_rows;
}
inline std::int64_t scale_cols(const WeightFormat& f, std::int64_t cols) {
  return inline_scales(f) ? 0 : (cols + f.block_cols - 1) / f.block_cols;
}

/// `v` rounded to `dtype` (WeightFormat::decode_dtype): bf16 or f16 to nearest even, f32 as is.
inline float round_to(float v, DType dtype) {
  if (dtype == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

/// The dtype `experts` / WeightMatrix::data hold in format `f` (`plain`: the float dtype itself).
DType container_dtype(const WeightFormat& f, DType plain);

/// Bytes of one [rows, cols] matrix in format `f` stored densely (container rows, scales, biases).
std::size_t matrix_bytes(const WeightFormat& f, DType dtype, std::int64_t rows, std::int64_t cols);

/// "bf16" for a plain matrix, else the format's description.
std::string describe(const WeightFormat& f, DType dtype);

/// Weight (n, k) of B in fp32, any format (plain: its element widened); B in rows layout.
float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k);

}  // namespace moekit::kernels::formats
