// The fast mode of gemm_nt on MLX affine weights (int8 activations, kernels/gemm_affine_int8.cpp)
// against the exact kernel: within the bound its arithmetic guarantees, per element
//   |y_fast − y_exact| ≤ Σ_g (d_g / 2) · Σ_{k∈g} |w_k|,  d_g = max_{k∈g} |x_k| / 127,
// (plus f32 rounding); the AVX2 and portable paths agree, AVX512-VNNI and AVX2 bit for bit (4-bit; to f32 rounding for 8-bit);
// AMX-INT8 (many rows) and the portable path bit for bit; any thread count gives the same bits;
// the epilogue (row scale, accumulate) and gathered, scaled rows behave as in the exact kernel.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm.hpp"
#include "moekit/threading.hpp"
#include "util/affine.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

using kernels::Output;
using kernels::RowSource;
using kernels::WeightMatrix;

struct Case {
  int bits, group;
  DType scale_dtype;
  std::int64_t M, N, K;
};

WeightMatrix weights_of(const testing::Quantized& q, const Case& c, bool fast) {
  WeightMatrix w{q.codes.data(), DType::u32, c.K * c.bits / 32};
  w.affine.bits = c.bits;
  w.affine.group_size = c.group;
  w.affine.scale_dtype = c.scale_dtype;
  w.affine.scales = q.scales.data();
  w.affine.biases = q.biases.data();
  w.affine.scale_ld = c.K / c.group;
  w.affine.int8_activations = fast;
  return w;
}

void check_case(const Case& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor w(Shape{c.N, c.K}, DType::f32);
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.05f * nd(rng);
  const testing::Quantized q = testing::quantize_affine(w, c.bits, c.group, c.scale_dtype);
  std::vector<float> x(static_cast<std::size_t>(c.M * c.K));
  for (float& v : x) v = nd(rng) * (rng() % 7 == 0 ? 8.0f : 1.0f);  // outliers widen some groups
  if (c.M > 2)
    for (std::int64_t k = 0; k < c.K; ++k) x[static_cast<std::size_t>(c.K + k)] = 0.0f;  // a zero row
  std::vector<float> exact(static_cast<std::size_t>(c.M * c.N)), fast(exact.size()), portable(exact.size());
  const RowSource A{x.data(), c.K};
  kernels::gemm_nt(A, weights_of(q, c, false), Output{exact.data(), c.N}, c.M, c.N, c.K);
  kernels::gemm_nt(A, weights_of(q, c, true), Output{fast.data(), c.N}, c.M, c.N, c.K);
  kernels::detail::gemm_nt_affine_int8_kernel(A, weights_of(q, c, true), Output{portable.data(), c.N}, c.M, c.N,
                                              c.K, kernels::detail::Int8Path::portable);
  // The x86 instruction sets give the same bits (exact integer sums, the same float code).
  using kernels::detail::Int8Path;
  if (kernels::detail::int8_path_supported(Int8Path::avx2)) {
    std::vector<float> avx2(exact.size());
    kernels::detail::gemm_nt_affine_int8_kernel(A, weights_of(q, c, true), Output{avx2.data(), c.N}, c.M, c.N, c.K,
                                                Int8Path::avx2);
    for (const Int8Path p : {Int8Path::avx512vnni}) {
      if (!kernels::detail::int8_path_supported(p)) continue;
      std::vector<float> other(exact.size());
      kernels::detail::gemm_nt_affine_int8_kernel(A, weights_of(q, c, true), Output{other.data(), c.N}, c.M, c.N,
                                                  c.K, p);
      if (c.bits == 4) {  // the same int32 lanes: bit for bit
        ASSERT_EQ(std::memcmp(other.data(), avx2.data(), avx2.size() * 4), 0)
            << kernels::detail::int8_path_name(p) << " vs avx2, M " << c.M << " N " << c.N;
      } else {  // 8-bit: other products per int32 lane, so other f32 roundings
        for (std::size_t i = 0; i < avx2.size(); ++i)
          ASSERT_NEAR(other[i], avx2[i], 1e-5 * (std::fabs(avx2[i]) + 1.0f)) << "8-bit, element " << i;
      }
    }
  }
  const float* wd = q.dequantized.data_as<const float>();
  for (std::int64_t m = 0; m < c.M; ++m)
    for (std::int64_t n = 0; n < c.N; ++n) {
      double bound = 0, mag = 0;
      for (std::int64_t g = 0; g < c.K / c.group; ++g) {
        double amax = 0, wsum = 0;
        for (std::int64_t k = g * c.group; k < (g + 1) * c.group; ++k) {
          amax = std::max(amax, std::fabs(double(x[static_cast<std::size_t>(m * c.K + k)])));
          wsum += std::fabs(double(wd[n * c.K + k]));
          mag += std::fabs(double(wd[n * c.K + k]) * x[static_cast<std::size_t>(m * c.K + k)]);
        }
        bound += amax / 127.0 / 2.0 * wsum;
      }
      const double tol = bound * 1.001 + 1e-5 * mag + 1e-30;
      const std::size_t i = static_cast<std::size_t>(m * c.N + n);
      ASSERT_LE(std::fabs(double(fast[i]) - exact[i]), tol)
          << "bits " << c.bits << " group " << c.group << " M " << c.M << " (" << m << ", " << n << ")";
      ASSERT_LE(std::fabs(double(portable[i]) - exact[i]), tol) << "portable (" << m << ", " << n << ")";
      ASSERT_LE(std::fabs(double(fast[i]) - portable[i]), 1e-5 * mag + 1e-30) << "(" << m << ", " << n << ")";
      if (c.M > 2 && m == 1) {
        ASSERT_EQ(fast[i], exact[i]) << "a zero row is exact";
      }
    }
}

TEST(AffineInt8, PathIsNamed) {
  using kernels::detail::Int8Path;
  std::printf("[ int8 path ] the fast mode runs %s up to %lld rows (avx512vnni %s, avx2 %s); beyond: %s\n",
              kernels::detail::int8_path_name(Int8Path::best), static_cast<long long>(kernels::kInt8MaxRows),
              kernels::detail::int8_path_supported(Int8Path::avx512vnni) ? "tested against avx2" : "not supported: skipped",
              kernels::detail::int8_path_supported(Int8Path::avx2) ? "supported" : "not supported: skipped",
              kernels::detail::int8_path_supported(Int8Path::amx)
                  ? "amx (group sizes that are multiples of 64), tested against portable"
                  : "the exact kernel (no AMX-INT8: the amx path skipped)");
  EXPECT_TRUE(kernels::detail::int8_path_supported(Int8Path::portable));
}

TEST(AffineInt8, WithinItsBoundOfTheExactKernel) {
  std::uint32_t seed = 1;
  for (const int bits : {4, 8})
    for (const int group : {32, 64, 128})
      for (const DType sd : {DType::bf16, DType::f16, DType::f32})
        for (const std::int64_t M : {1, 2, 3, 5, 8}) check_case({bits, group, sd, M, 13, 256}, seed++);
  check_case({4, 64, DType::bf16, 1, 768, 2048}, 99);  // a Qwen3 expert's gate/up
  check_case({8, 64, DType::bf16, 4, 2048, 768}, 98);  // and its down projection
}

TEST(AffineInt8, ErrorIsSmallAgainstTheExactValue) {
  // The bound is loose; the actual error of a 2048-long product is far below 1 % of its scale.
  const Case c{4, 64, DType::bf16, 1, 256, 2048};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor w(Shape{c.N, c.K}, DType::f32);
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.05f * nd(rng);
  const testing::Quantized q = testing::quantize_affine(w, c.bits, c.group, c.scale_dtype);
  std::vector<float> x(static_cast<std::size_t>(c.K)), exact(static_cast<std::size_t>(c.N)), fast(exact.size());
  for (float& v : x) v = nd(rng);
  kernels::gemm_nt({x.data(), c.K}, weights_of(q, c, false), {exact.data(), c.N}, 1, c.N, c.K);
  kernels::gemm_nt({x.data(), c.K}, weights_of(q, c, true), {fast.data(), c.N}, 1, c.N, c.K);
  const double rel = testing::relative_rms(fast.data(), exact.data(), c.N);
  RecordProperty("relative_rms_error", std::to_string(rel));
  EXPECT_LT(rel, 7e-3);  // measured 0.54 %: uniform rounding error d/√12 per element
  EXPECT_GT(rel, 0.0) << "the fast path ran";
}

TEST(AffineInt8, EpilogueGatherAndThreads) {
  const Case c{4, 32, DType::bf16, 4, 200, 128};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor w(Shape{c.N, c.K}, DType::f32);
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.05f * nd(rng);
  const testing::Quantized q = testing::quantize_affine(w, c.bits, c.group, c.scale_dtype);
  std::vector<float> xs(static_cast<std::size_t>(9 * c.K));
  for (float& v : xs) v = nd(rng);
  const std::int32_t index[4] = {7, 2, 2, 5};
  const float scale[4] = {0.5f, 2.0f, -1.0f, 0.25f}, row_scale[4] = {1.5f, 0.5f, 3.0f, -2.0f};
  // Gathered, scaled rows equal the same rows materialised.
  std::vector<float> xm(static_cast<std::size_t>(4 * c.K));
  for (int i = 0; i < 4; ++i)
    for (std::int64_t k = 0; k < c.K; ++k)
      xm[static_cast<std::size_t>(i * c.K + k)] = xs[static_cast<std::size_t>(index[i] * c.K + k)] * scale[i];
  std::vector<float> a(static_cast<std::size_t>(4 * c.N), 1.0f), b(a), t1(a), t2(a);
  kernels::gemm_nt({xs.data(), c.K, index, scale}, weights_of(q, c, true), {a.data(), c.N, row_scale, true}, 4, c.N,
                   c.K);
  kernels::gemm_nt({xm.data(), c.K}, weights_of(q, c, true), {b.data(), c.N}, 4, c.N, c.K);
  for (int i = 0; i < 4; ++i)
    for (std::int64_t n = 0; n < c.N; ++n)
      EXPECT_EQ(a[static_cast<std::size_t>(i * c.N + n)], 1.0f + b[static_cast<std::size_t>(i * c.N + n)] * row_scale[i]);
  set_num_threads(1);
  kernels::gemm_nt({xm.data(), c.K}, weights_of(q, c, true), {t1.data(), c.N}, 4, c.N, c.K);
  set_num_threads(2);
  kernels::gemm_nt({xm.data(), c.K}, weights_of(q, c, true), {t2.data(), c.N}, 4, c.N, c.K);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(t1, b);
}

TEST(AffineInt8, NonFiniteActivationsGiveNaNNotGarbage) {
  const Case c{4, 64, DType::bf16, 2, 12, 128};
  Tensor w(Shape{c.N, c.K}, DType::f32);
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  const testing::Quantized q = testing::quantize_affine(w, c.bits, c.group, c.scale_dtype);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(static_cast<std::size_t>(c.M * c.K), 0.5f), y(static_cast<std::size_t>(c.M * c.N));
    x[static_cast<std::size_t>(c.K + 70)] = bad;  // row 1, second group
    using kernels::detail::Int8Path;
    for (const Int8Path path : {Int8Path::portable, Int8Path::avx2, Int8Path::avx512vnni, Int8Path::amx}) {
      if (!kernels::detail::int8_path_supported(path)) continue;
      kernels::detail::gemm_nt_affine_int8_kernel({x.data(), c.K}, weights_of(q, c, true), {y.data(), c.N}, c.M, c.N,
                                                  c.K, path);
      for (std::int64_t n = 0; n < c.N; ++n) {
        EXPECT_TRUE(std::isfinite(y[static_cast<std::size_t>(n)])) << "row 0 is clean";
        EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(c.N + n)])) << "row 1 holds " << bad;
      }
    }
  }
}

// AMX-INT8 against the portable kernel, bit for bit: partial panels and tile pairs, 4- and 8-bit
// codes, groups of 64 and 128, every scale dtype, gathered and scaled rows, the epilogue, and the
// driver (gemm_nt, which takes AMX for more than kInt8MaxRows rows) for 1-3 threads.
TEST(AffineInt8, AmxEqualsThePortablePathBitwise) {
  using kernels::detail::Int8Path;
  if (!kernels::detail::int8_path_supported(Int8Path::amx))
    GTEST_SKIP() << "this CPU (or OS) has no AMX-INT8: the tdpbusd path was not run";
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int before = num_threads();
  int done = 0;
  for (const int bits : {4, 8})
    for (const int group : {64, 128, 256})  // 256: no MLX recipe uses it, but a file may
      for (const DType sd : {DType::bf16, DType::f32, DType::f16})
        for (const std::int64_t M : {1, 9, 16, 17, 33, 50})
          for (const std::int64_t N : {13, 32, 70}) {
            const std::int64_t K = group == 64 ? 192 : 2 * group;
            const Case c{bits, group, sd, M, N, K};
            Tensor w(Shape{N, K}, DType::f32);
            for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.05f * nd(rng);
            const testing::Quantized q = testing::quantize_affine(w, bits, group, sd);
            const bool gather = (M + N) % 2 == 1, scaled = N % 2 == 0, epilogue = M % 2 == 1;
            std::vector<float> xs(static_cast<std::size_t>((2 * M + 1) * K));
            for (float& v : xs) v = nd(rng) * (rng() % 7 == 0 ? 8.0f : 1.0f);
            std::vector<std::int32_t> index;
            std::vector<float> scale, row_scale;
            for (std::int64_t i = 0; i < M; ++i) {
              index.push_back(static_cast<std::int32_t>(rng() % (2 * M + 1)));
              scale.push_back(0.25f + 0.5f * static_cast<float>(i % 5));
              row_scale.push_back(i % 3 == 0 ? -1.5f : 0.75f);
            }
            const RowSource A{xs.data(), K, gather ? index.data() : nullptr, scaled ? scale.data() : nullptr};
            std::vector<float> c0(static_cast<std::size_t>(M * N));
            for (float& v : c0) v = nd(rng);
            const auto out = [&](std::vector<float>& y) {
              y = c0;
              return Output{y.data(), N, epilogue ? row_scale.data() : nullptr, epilogue};
            };
            std::vector<float> want, got;
            kernels::detail::gemm_nt_affine_int8_kernel(A, weights_of(q, c, true), out(want), M, N, K, Int8Path::portable);
            kernels::detail::gemm_nt_affine_int8_kernel(A, weights_of(q, c, true), out(got), M, N, K, Int8Path::amx);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
                << "bits " << bits << " group " << group << " M " << M << " N " << N;
            if (M > kernels::kInt8MaxRows)
              for (const int t : {1, 2, 3}) {
                set_num_threads(t);
                kernels::gemm_nt(A, weights_of(q, c, true), out(got), M, N, K);
                ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
                    << "gemm_nt, " << t << " threads, bits " << bits << " M " << M << " N " << N;
              }
            ++done;
          }
  set_num_threads(before);
  std::printf("[ int8 path ] amx: %d cases bit for bit against the portable path\n", done);
}

TEST(AffineInt8, AppliesOnlyWhereItPays) {
  WeightMatrix w{nullptr, DType::u32, 0};
  w.affine.bits = 4;
  w.affine.group_size = 64;
  EXPECT_FALSE(kernels::detail::int8_activations_apply(w, 1)) << "off by default";
  w.affine.int8_activations = true;
  EXPECT_TRUE(kernels::detail::int8_activations_apply(w, 1));
  EXPECT_TRUE(kernels::detail::int8_activations_apply(w, kernels::kInt8MaxRows));
  // More rows: only where AMX-INT8 takes the codes (group a multiple of 64).
  EXPECT_EQ(kernels::detail::int8_activations_apply(w, kernels::kInt8MaxRows + 1), kernels::detail::amx_int8_takes(w));
  EXPECT_EQ(kernels::detail::amx_int8_takes(w), kernels::detail::int8_path_supported(kernels::detail::Int8Path::amx));
  w.affine.group_size = 32;
  EXPECT_FALSE(kernels::detail::int8_activations_apply(w, kernels::kInt8MaxRows + 1));
  w.affine.group_size = 64;
  w.affine.bits = 3;
  EXPECT_FALSE(kernels::detail::int8_activations_apply(w, 1)) << "3-bit codes stay exact";
}

}  // namespace
}  // namespace moekit
