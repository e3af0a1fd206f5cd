// MLX affine-quantized weights beyond the conformance table (conformance.hpp holds gemm_nt and
// dequantize_rows, every bits x group size x scale dtype on every target, bit for bit to the
// dequantized matrix): the unpacking against an independent bit-stream packer, the value as one
// rounding, the scalar reference reading quantized weights, and thread-count independence.
#include "kernels/formats/affine.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "moekit/threading.hpp"
#include "util/affine.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

using kernels::WeightMatrix;
using testing::pack_codes;
using testing::randn;

// A random affine-quantized [N, K] matrix with padded rows and scale rows (strides > minimal).
struct QuantMatrix {
  std::vector<std::uint32_t> codes, words;
  Tensor scales, biases;
  WeightMatrix w;

  QuantMatrix(std::int64_t N, std::int64_t K, int bits, int group, DType sdt, std::mt19937& rng) {
    std::uniform_int_distribution<std::uint32_t> code(0, (1u << bits) - 1u);
    for (std::int64_t i = 0; i < N * K; ++i) codes.push_back(code(rng));
    const std::int64_t ld = kernels::formats::affine::words(K, bits) + 1, groups = K / group, sld = groups + 2;
    words = pack_codes(codes, N, K, bits, ld);
    scales = to_dtype(randn({N, sld}, rng, 0.02f), sdt);
    biases = to_dtype(randn({N, sld}, rng, 0.1f), sdt);
    w = {words.data(),  DType::u32,    ld, kernels::WeightLayout::rows, WeightFormat::mlx_affine(bits, group, sdt),
         scales.data(), biases.data(), sld};
  }
  // The materialised dequantized matrix, [N, K] f32, from the scalar reference.
  Tensor dense(std::int64_t N, std::int64_t K) const {
    Tensor d({N, K}, DType::f32);
    kernels::ref::dequantize(w, N, K, d.data_as<float>());
    return d;
  }
};

const std::vector<int> kBits = {2, 3, 4, 5, 6, 8};

TEST(Affine, CodesUnpackAsTheBitStreamSays) {
  std::mt19937 rng(5);
  for (int bits : kBits) {
    const std::int64_t N = 3, K = 128;
    QuantMatrix q(N, K, bits, 32, DType::f32, rng);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k)
        ASSERT_EQ(kernels::formats::affine::code(q.words.data() + n * q.w.ld, k, bits),
                  q.codes[static_cast<std::size_t>(n * K + k)])
            << bits << " bits, row " << n << ", code " << k;
  }
}

TEST(Affine, ValueIsOneRoundingOfScaleTimesCodePlusBias) {
  std::mt19937 rng(6);
  QuantMatrix q(2, 64, 4, 32, DType::bf16, rng);
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t k = 0; k < 64; ++k) {
      const std::int64_t g = n * q.w.scale_ld + k / 32;
      const double s = bf16_to_f32(q.scales.data_as<std::uint16_t>()[g]);
      const double b = bf16_to_f32(q.biases.data_as<std::uint16_t>()[g]);
      const double exact = s * q.codes[static_cast<std::size_t>(n * 64 + k)] + b;  // exact in double
      ASSERT_EQ(kernels::formats::affine::decode(q.w, n, k), static_cast<float>(exact));
    }
}

// The scalar reference's plain dot product agrees within the usual bound (a check of the
// reference itself: it reads quantized B through affine_value).
TEST(Affine, ReferenceGemmReadsQuantizedWeights) {
  std::mt19937 rng(9);
  const std::int64_t M = 3, N = 7, K = 128;
  QuantMatrix q(N, K, 4, 64, DType::bf16, rng);
  const Tensor dense = q.dense(N, K);
  Tensor a = randn({M, K}, rng);
  Tensor c({M, N}, DType::f32), c_ref({M, N}, DType::f32);
  kernels::ref::gemm_nt({a.data_as<const float>(), K}, q.w, {c.data_as<float>(), N}, M, N, K);
  kernels::ref::gemm_nt({a.data_as<const float>(), K}, {dense.data(), DType::f32, K}, {c_ref.data_as<float>(), N}, M,
                        N, K);
  EXPECT_EQ(std::memcmp(c.data(), c_ref.data(), c.nbytes()), 0);
}

TEST(Affine, ThreadCountDoesNotChangeABit) {
  std::mt19937 rng(10);
  const std::int64_t M = 37, N = 150, K = 256;
  QuantMatrix q(N, K, 4, 64, DType::bf16, rng);
  Tensor a = randn({M, K}, rng);
  const int saved = num_threads();
  Tensor first;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    for (std::int64_t m : {std::int64_t{1}, M}) {
      Tensor c({m, N}, DType::f32);
      kernels::gemm_nt({a.data_as<const float>(), K}, q.w, {c.data_as<float>(), N}, m, N, K);
      if (m == M && t == 1) {
        first = c;
      } else if (m == M) {
        EXPECT_EQ(std::memcmp(c.data(), first.data(), c.nbytes()), 0) << t << " threads";
      } else if (first.numel() > 0) {
        EXPECT_EQ(std::memcmp(c.data(), first.data(), c.nbytes()), 0) << "row 0 alone, " << t << " threads";
      }
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace moekit
