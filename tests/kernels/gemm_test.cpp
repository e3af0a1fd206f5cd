// gemm_nt against its scalar reference twin: every dtype, tails around the tile sizes
// (3 rows x 4 columns x lanes of K), strides, accumulate; bitwise independence of the split.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <hwy/targets.h>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "util/random.hpp"
#include "moekit/threading.hpp"

namespace moekit {
namespace {

using testing::randn;

// Error bound for an fp32 dot product of length K with any summation order:
// |err| <= K * eps * Σ|a_k b_k| (Higham); both sides carry it, so 2x.
double bound(const float* a, const float* b, std::int64_t K) {
  double mag = 0;
  for (std::int64_t k = 0; k < K; ++k) mag += std::fabs(static_cast<double>(a[k]) * b[k]);
  return 2.0 * static_cast<double>(K) * 1.1920929e-7 * mag + 1e-30;
}

void check_against_reference() {
  std::mt19937 rng(1);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (std::int64_t M : {1, 2, 3, 4, 5, 6, 7, 13}) {
      for (std::int64_t N : {1, 3, 4, 5, 9}) {
        for (std::int64_t K : {1, 7, 8, 9, 15, 16, 17, 33}) {
          const std::int64_t lda = K + 3, ldb = K + 5, ldc = N + 2;
          Tensor a = randn({M, lda}, rng), b32 = randn({N, ldb}, rng);
          Tensor b = to_dtype(b32, dt), bw = to_dtype(b, DType::f32);
          for (bool acc : {false, true}) {
            Tensor c = randn({M, ldc}, rng), c_ref = c.clone();
            kernels::gemm_nt(a.data_as<float>(), lda, b.data(), dt, ldb, c.data_as<float>(), ldc, M, N, K, acc);
            kernels::ref::gemm_nt(a.data_as<float>(), lda, b.data(), dt, ldb, c_ref.data_as<float>(), ldc, M, N, K,
                                  acc);
            for (std::int64_t m = 0; m < M; ++m) {
              for (std::int64_t n = 0; n < ldc; ++n) {
                const float got = c.data_as<float>()[m * ldc + n], want = c_ref.data_as<float>()[m * ldc + n];
                if (n >= N) {
                  ASSERT_EQ(got, want) << "wrote outside [M, N)";
                  continue;
                }
                const double tol = bound(a.data_as<float>() + m * lda, bw.data_as<float>() + n * ldb, K) +
                                   (acc ? 1.2e-7 * std::fabs(want) : 0.0);
                ASSERT_NEAR(got, want, tol) << dtype_name(dt) << " M=" << M << " N=" << N << " K=" << K
                                            << " acc=" << acc << " at " << m << "," << n;
              }
            }
          }
        }
      }
    }
  }
}

void check_split_invariance() {
  std::mt19937 rng(2);
  const std::int64_t M = 37, N = 29, K = 301;
  Tensor a = randn({M, K}, rng), b = to_dtype(randn({N, K}, rng), DType::bf16);
  Tensor whole({M, N}, DType::f32);
  kernels::gemm_nt_serial(a.data_as<float>(), K, b.data(), DType::bf16, K, whole.data_as<float>(), N, M, N, K, false);
  // Row by row and column by column give the same bits as the whole.
  Tensor pieces({M, N}, DType::f32);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n)
      kernels::gemm_nt_serial(a.data_as<float>() + m * K, K,
                              static_cast<const std::uint16_t*>(b.data()) + n * K, DType::bf16, K,
                              pieces.data_as<float>() + m * N + n, N, 1, 1, K, false);
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), whole.nbytes()), 0);
  const int saved = num_threads();
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    Tensor c({M, N}, DType::f32);
    kernels::gemm_nt(a.data_as<float>(), K, b.data(), DType::bf16, K, c.data_as<float>(), N, M, N, K, false);
    EXPECT_EQ(std::memcmp(whole.data(), c.data(), whole.nbytes()), 0) << t << " threads";
  }
  set_num_threads(saved);
}

// Every CPU target Highway compiled and this CPU supports (e.g. AVX3, AVX2, SSE4), one after
// another: the 6-row AVX-512 tiles and the 3-row AVX2/SSE4 tiles are both checked here.
template <typename Fn>
void for_each_target(Fn fn) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (const std::int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

TEST(Gemm, MatchesReferenceOverTailsDtypesStridesOnEveryTarget) { for_each_target(check_against_reference); }

TEST(Gemm, SplitAndThreadCountDoNotChangeABitOnEveryTarget) { for_each_target(check_split_invariance); }

TEST(Gemm, TargetsCovered) {
  std::string names;
  for (const std::int64_t t : hwy::SupportedAndGeneratedTargets()) names += std::string(hwy::TargetName(t)) + " ";
  RecordProperty("targets", names);
  std::printf("[ TARGETS  ] %s\n", names.c_str());
}

}  // namespace
}  // namespace moekit
