// How a weight matrix is stored: one descriptor for the public API (ExpertMatrix) and the
// kernels (kernels::WeightMatrix) alike (docs/formats.md, "The weight-format layer").
//
// A matrix W [rows, cols] = [out, in] is an array of stored elements (the container, of dtype
// `container_dtype()`), read row by row, plus — for a quantized format — scales, one per block of
// block_rows × block_cols weights, and, where the format has one, a bias beside each scale. Each
// format's rules (which shapes it takes, its bytes, its description, how one weight is decoded)
// live in one file under src/kernels/formats/.
#pragma once

#include <cstdint>
#include <utility>

#include "moekit/tensor.hpp"

namespace moekit {

/// How the stored elements encode a weight.
enum class Element : std::uint8_t {
  /// Not quantized: the elements are the matrix's float dtype (f32, bf16 or f16), no scales.
  plain,
  /// MLX affine: unsigned codes of `bits` bits (2, 3, 4, 5, 6 or 8) packed little-endian into
  /// uint32 words, one continuous bit stream per row (element 0 in the lowest bits); each group of
  /// block_cols consecutive inputs of a row has a scale s and a bias b; w = fma(s, q, b) in fp32.
  affine,
  /// e2m1 (FP4): nibbles, two per byte, element 2j in the low nibble of byte j; each group of
  /// block_cols inputs shares a scale (MXFP4: group 32, f8_e8m0 2^(s − 127); NVFP4: group 16,
  /// f8_e4m3); w = value × scale.
  e2m1,
  /// e4m3 (FP8, OCP E4M3FN): one byte per weight; each block of block_rows × block_cols weights
  /// shares a scale (DeepSeek-V3's release: 128 × 128, f32; compressed-tensors per channel:
  /// 1 × cols; MXFP8: 1 × 32, f8_e8m0); w = value × scale. Edge blocks may be ragged.
  e4m3,
  /// Signed 4-bit integers as compressed-tensors packs them (`pack-quantized`): nibbles, element
  /// 2j in the low nibble of byte j (I32 words, element k at bits 4·(k mod 8) of word k / 8, little
  /// endian: the same bytes), each stored as q + 8; each group of block_cols inputs shares a scale;
  /// w = (nibble − 8) × scale, rounded to decode_dtype (compressed-tensors computes in the scale's
  /// dtype).
  int4,
  /// llama.cpp's ggml block types (GGUF files; docs/formats.md, "GGUF"): every block of
  /// block_cols weights of a row is self-contained — its scale(s), and min or sub-block scales
  /// where the type has them, lie inside the block beside its codes — so a row is whole blocks of
  /// bytes and the matrix has no separate scale array (ExpertMatrix::scales stays empty). Each
  /// decodes exactly as ggml's dequantize_row_* does (kernels/formats/ggml_*.hpp).
  q4_0,        ///< 32 weights: f16 d, nibbles; w = (q − 8)·d
  q4_1,        ///< 32 weights: f16 d, f16 m, nibbles; w = q·d + m
  q5_0,        ///< 32 weights: f16 d, 32 high bits, nibbles; w = (q − 16)·d
  q5_1,        ///< 32 weights: f16 d, f16 m, 32 high bits, nibbles; w = q·d + m
  q8_0,        ///< 32 weights: f16 d, 32 int8; w = q·d
  q2_k,        ///< 256 weights: 16 sub-blocks of 16 with 4-bit scale and min
  q3_k,        ///< 256 weights: 16 sub-blocks of 16 with 6-bit scales, 3-bit codes
  q4_k,        ///< 256 weights: 8 sub-blocks of 32 with 6-bit scale and min
  q5_k,        ///< 256 weights: as q4_k with a fifth bit
  q6_k,        ///< 256 weights: 16 sub-blocks of 16 with int8 scales, 6-bit codes
  iq4_nl,      ///< 32 weights: f16 d, nibbles into a 16-value non-linear table
  iq4_xs,      ///< 256 weights: 8 sub-blocks of 32 with 6-bit scales, iq4_nl's table
  ggml_mxfp4,  ///< 32 weights: e8m0 exponent, e2m1 nibbles (element j low, j + 16 high)
};

/// A weight format. Plain float matrices use the default (Element::plain).
struct WeightFormat {
  Element element = Element::plain;
  int bits = 0;                    ///< bits per stored element (quantized formats)
  int block_rows = 1;              ///< outputs (rows) one scale covers
  int block_cols = 0;              ///< inputs (columns) one scale covers: the group size; 0 without scales
  DType scale_dtype = DType::f32;  ///< how a scale (and a bias) is stored
  bool has_bias = false;           ///< a bias beside every scale (MLX affine; int4: its zero point)
  /// The dtype the reference rounds each decoded weight to: f32 (the product as fp32), or bf16 /
  /// f16 where the format's own code dequantizes in its scales' dtype (compressed-tensors).
  DType decode_dtype = DType::f32;

  bool quantized() const noexcept { return element != Element::plain; }
  bool operator==(const WeightFormat&) const = default;

  /// MLX affine codes of `bits` bits, groups of `group_size` inputs, scales and biases in
  /// `scale_dtype` (the format mlx-lm writes; docs/formats.md).
  static WeightFormat mlx_affine(int bits, int group_size, DType scale_dtype) {
    return {Element::affine, bits, 1, group_size, scale_dtype, true};
  }
  /// MXFP4: e2m1 nibbles, groups of 32 inputs, e8m0 scales (GPT-OSS's release, mlx's mxfp4 mode).
  static WeightFormat mxfp4() { return {Element::e2m1, 4, 1, 32, DType::f8_e8m0, false}; }
  /// NVFP4: e2m1 nibbles, groups of 16 inputs, e4m3 scales (mlx's nvfp4 mode).
  static WeightFormat nvfp4() { return {Element::e2m1, 4, 1, 16, DType::f8_e4m3, false}; }
  /// MXFP8: e4m3 bytes, groups of 32 inputs, e8m0 scales (mlx's mxfp8 mode).
  static WeightFormat mxfp8() { return {Element::e4m3, 8, 1, 32, DType::f8_e8m0, false}; }
  /// compressed-tensors' int4, groups of `group_size` inputs (a row's length for a scale per row),
  /// decoded in `scale_dtype` as compressed-tensors does; `zero_point`: the asymmetric scheme, a
  /// zero point per group beside each scale (`biases`, in the scales' dtype).
  static WeightFormat int4(int group_size, DType scale_dtype, bool zero_point = false) {
    WeightFormat f{Element::int4, 4, 1, group_size, scale_dtype, zero_point};
    f.decode_dtype = scale_dtype;
    return f;
  }
  /// A ggml block type (Element::q4_0 … ggml_mxfp4): block_cols is the type's block (32 or 256),
  /// bits its code width; the scales live inside the blocks.
  static WeightFormat ggml(Element element);
  /// FP8 e4m3 with one scale per block of `rows` × `cols` weights (DeepSeek-V3's 128 × 128, f32
  /// scales; a scale per output row: 1 × the row's length).
  static WeightFormat fp8(int rows, int cols, DType scale_dtype) {
    return {Element::e4m3, 8, rows, cols, scale_dtype, false};
  }
};

}  // namespace moekit
