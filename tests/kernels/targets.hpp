// Running a kernel test on every CPU target Highway compiled that this CPU supports.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <hwy/targets.h>
#include <vector>

namespace moekit::testing {

// Targets whose MulAdd is one fused multiply-add: there the outer-product kernels (gemm_nn,
// gemm_tn) must equal their std::fma reference bit for bit. Elsewhere (SSE4, SSSE3, scalar)
// a product and a sum round separately, so they are held to the error bound instead.
inline bool fused(std::int64_t target) {
  return target == HWY_AVX2 || target == HWY_AVX3 || target == HWY_AVX3_DL || target == HWY_NEON;
}

// Every CPU target Highway compiled and this CPU supports (e.g. AVX3, AVX2, SSE4), one after
// another, so each target's tile shapes are checked; the log names the targets that ran.
template <typename Fn>
void for_each_target(Fn fn) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (const std::int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    fn(target);
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace moekit::testing
