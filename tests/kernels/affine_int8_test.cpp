// The fast mode of gemm_nt on MLX affine weights (int8 activations, kernels/int8_rows.cpp, gemm_amx_int8.cpp)
// beyond the conformance table (conformance.hpp holds every path — portable, avx2, avx512vnni,
// amx and gemm_nt's dispatch — to the bound its arithmetic guarantees against the exact kernel
// and to its sibling path): its typical error, the epilogue and gathered rows as materialised
// ones, thread counts, non-finite activations, and where the mode applies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "kernels/plan.hpp"
#include "moekit/threading.hpp"
#include "util/affine.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

using kernels::WeightMatrix;

struct Case {
  int bits, group;
  DType scale_dtype;
  std::int64_t M, N, K;
};

WeightMatrix weights_of(const testing::Quantized& q, const Case& c) {
  WeightMatrix w{q.codes.data(), DType::u32, c.K * c.bits / 32};
  w.format = WeightFormat::mlx_affine(c.bits, c.group, c.scale_dtype);
  w.scales = q.scales.data();
  w.biases = q.biases.data();
  w.scale_ld = c.K / c.group;
  return w;
}

constexpr auto kPool = kernels::Threads::pool;
constexpr ComputeMode kInt8 = ComputeMode::int8;

TEST(AffineInt8, PathIsNamed) {
  using kernels::Int8Path;
  std::printf("[ int8 path ] the fast mode runs %s up to %lld rows (avx512vnni %s, avx2 %s); beyond: %s\n",
              kernels::int8_path_name(Int8Path::best), static_cast<long long>(kernels::kInt8MaxRows),
              kernels::int8_path_supported(Int8Path::avx512vnni) ? "tested against avx2" : "not supported: skipped",
              kernels::int8_path_supported(Int8Path::avx2) ? "supported" : "not supported: skipped",
              kernels::int8_path_supported(Int8Path::amx)
                  ? "amx (group sizes that are multiples of 64), tested against portable"
                  : "the exact kernel (no AMX-INT8: the amx path skipped)");
  EXPECT_TRUE(kernels::int8_path_supported(Int8Path::portable));
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
  kernels::gemm_nt({x.data(), c.K}, weights_of(q, c), {exact.data(), c.N}, 1, c.N, c.K);
  kernels::gemm_nt({x.data(), c.K}, weights_of(q, c), {fast.data(), c.N}, 1, c.N, c.K, kPool, kInt8);
  const double rel = testing::relative_rms(fast.data(), exact.data(), c.N);
  RecordProperty("relative_rms_error", std::to_string(rel));
  EXPECT_LT(rel, 7e-3);  // measured 0.54 %: uniform rounding error d/√12 per element
  EXPECT_GT(rel, 0.0) << "the fast path ran";
}

// MXFP4, NVFP4 and int4 (signed 4-bit codes): the fast mode runs on every path, the weights stay
// exact (e2m1 × 2 and q are small integers), so the error is the activations' rounding alone —
// the affine case's size — and VNNI gives AVX2's bits.
TEST(AffineInt8, SignedFormatsRunTheFastMode) {
  const std::int64_t N = 96, K = 2048;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(2 * K));
  for (float& v : x) v = nd(rng);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(N * K / 2));
  for (auto& b : codes) b = static_cast<std::uint8_t>(rng());
  for (const WeightFormat f : {WeightFormat::mxfp4(), WeightFormat::nvfp4(), WeightFormat::int4(32, DType::f32)}) {
    const std::int64_t groups = K / f.block_cols;
    std::vector<std::uint8_t> s8(static_cast<std::size_t>(N * groups));
    std::vector<float> s32(s8.size());
    for (std::size_t i = 0; i < s8.size(); ++i) {
      s8[i] = static_cast<std::uint8_t>(f.scale_dtype == DType::f8_e8m0 ? 118 + rng() % 4 : 0x20 + rng() % 8);
      s32[i] = 0.01f * (1.0f + static_cast<float>(rng() % 8) / 8.0f);
    }
    WeightMatrix w{codes.data(), DType::u8, K / 2};
    w.format = f;
    w.scales = f.scale_dtype == DType::f32 ? static_cast<const void*>(s32.data()) : s8.data();
    w.scale_ld = groups;
    std::vector<float> exact(static_cast<std::size_t>(2 * N)), fast(exact.size()), sibling(exact.size());
    kernels::gemm_nt({x.data(), K}, w, {exact.data(), N}, 2, N, K);
    using kernels::Int8Path;
    for (const Int8Path path : {Int8Path::portable, Int8Path::avx2, Int8Path::avx512vnni, Int8Path::best}) {
      if (!kernels::int8_path_supported(path)) continue;
      if (path == Int8Path::best) {
        kernels::gemm_nt({x.data(), K}, w, {fast.data(), N}, 2, N, K, kPool, kInt8);
      } else {
        kernels::detail::gemm_nt_affine_int8_kernel({x.data(), K}, w, {fast.data(), N}, 2, N, K, path);
      }
      const double rel = testing::relative_rms(fast.data(), exact.data(), 2 * N);
      EXPECT_LT(rel, 7e-3) << kernels::formats::describe(f, DType::u8) << " on " << kernels::int8_path_name(path);
      EXPECT_GT(rel, 0.0) << "the fast mode ran";
      if (path == Int8Path::avx2) sibling = fast;
      if (path == Int8Path::avx512vnni && kernels::int8_path_supported(Int8Path::avx2)) {
        EXPECT_EQ(std::memcmp(fast.data(), sibling.data(), fast.size() * 4), 0) << "VNNI gives AVX2's bits";
      }
    }
  }
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
  kernels::gemm_nt({xs.data(), c.K, index, scale}, weights_of(q, c), {a.data(), c.N, row_scale, true}, 4, c.N, c.K,
                   kPool, kInt8);
  kernels::gemm_nt({xm.data(), c.K}, weights_of(q, c), {b.data(), c.N}, 4, c.N, c.K, kPool, kInt8);
  for (int i = 0; i < 4; ++i)
    for (std::int64_t n = 0; n < c.N; ++n)
      EXPECT_EQ(a[static_cast<std::size_t>(i * c.N + n)], 1.0f + b[static_cast<std::size_t>(i * c.N + n)] * row_scale[i]);
  set_num_threads(1);
  kernels::gemm_nt({xm.data(), c.K}, weights_of(q, c), {t1.data(), c.N}, 4, c.N, c.K, kPool, kInt8);
  set_num_threads(2);
  kernels::gemm_nt({xm.data(), c.K}, weights_of(q, c), {t2.data(), c.N}, 4, c.N, c.K, kPool, kInt8);
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
    using kernels::Int8Path;
    for (const Int8Path path : {Int8Path::portable, Int8Path::avx2, Int8Path::avx512vnni, Int8Path::amx}) {
      if (!kernels::int8_path_supported(path)) continue;
      kernels::detail::gemm_nt_affine_int8_kernel({x.data(), c.K}, weights_of(q, c), {y.data(), c.N}, c.M, c.N, c.K,
                                                  path);
      for (std::int64_t n = 0; n < c.N; ++n) {
        EXPECT_TRUE(std::isfinite(y[static_cast<std::size_t>(n)])) << "row 0 is clean";
        EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(c.N + n)])) << "row 1 holds " << bad;
      }
    }
  }
}

}  // namespace
}  // namespace moekit
