// MLX affine quantization for tests, written from the format's description (docs/formats.md),
// independently of moekit's kernels: a bit-stream packer and a simple min/max quantizer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit::testing {

/// Packs codes [N, K] of `bits` bits: code i of a row occupies bits [i·bits, (i+1)·bits) of the
/// row's little-endian byte stream; rows padded to `ld` words (filler 0xdeadbeef).
inline std::vector<std::uint32_t> pack_codes(const std::vector<std::uint32_t>& codes, std::int64_t N, std::int64_t K,
                                             int bits, std::int64_t ld) {
  std::vector<std::uint32_t> words(static_cast<std::size_t>(N * ld), 0xdeadbeefu);
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(K * bits / 8), 0);
    for (std::int64_t i = 0; i < K; ++i)
      for (int b = 0; b < bits; ++b)
        if ((codes[static_cast<std::size_t>(n * K + i)] >> b) & 1u) {
          const std::int64_t bit = i * bits + b;
          bytes[static_cast<std::size_t>(bit / 8)] |= static_cast<std::uint8_t>(1u << (bit % 8));
        }
    std::memcpy(words.data() + n * ld, bytes.data(), bytes.size());
  }
  return words;
}

/// A weight [..., N, K] quantized per group of `group` inputs: U32 codes [..., N, K·bits/32],
/// scales and biases [..., N, K/group] in `scale_dtype`, and the dequantized f32 weight
/// fma(scale, q, bias) with the stored (rounded) scale and bias.
struct Quantized {
  Tensor codes, scales, biases, dequantized;
};

inline Tensor u32_tensor(Shape shape, const std::vector<std::uint32_t>& words) {
  Tensor t(std::move(shape), DType::u32);
  std::memcpy(t.data(), words.data(), words.size() * 4);
  return t;
}

inline Quantized quantize_affine(const Tensor& w, int bits, int group, DType scale_dtype) {
  const std::int64_t K = w.dim(-1), rows = w.numel() / K, groups = K / group;
  const std::uint32_t top = (1u << bits) - 1u;
  Shape gshape = w.shape(), cshape = w.shape();
  gshape.back() = groups;
  cshape.back() = K * bits / 32;
  Tensor s32(gshape, DType::f32), b32(gshape, DType::f32);
  std::vector<std::uint32_t> codes(static_cast<std::size_t>(rows * K));
  const float* x = w.data_as<const float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* p = x + r * K + g * group;
      const float lo = *std::min_element(p, p + group), hi = *std::max_element(p, p + group);
      // Round scale and bias to the stored dtype first, then pick the codes for those values.
      float scale = std::max((hi - lo) / static_cast<float>(top), 1e-8f);
      Tensor sb = Tensor::from_f32({2}, {scale, lo});
      sb = to_dtype(to_dtype(sb, scale_dtype), DType::f32);
      scale = sb.data_as<float>()[0];
      const float bias = sb.data_as<float>()[1];
      s32.data_as<float>()[r * groups + g] = scale;
      b32.data_as<float>()[r * groups + g] = bias;
      for (std::int64_t i = 0; i < group; ++i) {
        const float q = std::nearbyint((p[i] - bias) / scale);
        codes[static_cast<std::size_t>(r * K + g * group + i)] =
            static_cast<std::uint32_t>(std::clamp(q, 0.0f, static_cast<float>(top)));
      }
    }
  Quantized out;
  out.codes = u32_tensor(cshape, pack_codes(codes, rows, K, bits, K * bits / 32));
  out.scales = to_dtype(s32, scale_dtype);
  out.biases = to_dtype(b32, scale_dtype);
  out.dequantized = Tensor(w.shape(), DType::f32);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t g = r * groups + k / group;
      out.dequantized.data_as<float>()[r * K + k] =
          std::fma(s32.data_as<float>()[g], static_cast<float>(codes[static_cast<std::size_t>(r * K + k)]),
                   b32.data_as<float>()[g]);
    }
  return out;
}

}  // namespace moekit::testing
