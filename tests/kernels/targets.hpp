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

// Every target Highway compiled the kernels for, whether or not this CPU supports it, best first
// (the order of SupportedAndGeneratedTargets): the conformance table has rows for each, and
// skips those this CPU lacks.
inline std::vector<std::int64_t> compiled_targets() {
  std::vector<std::int64_t> out;
  for (std::int64_t left = HWY_TARGETS; left != 0; left &= left - 1)
    out.push_back(left & ~(left - 1));
  return out;
}

inline bool target_supported(std::int64_t target) {
  return (hwy::SupportedTargets() & target) != 0;
}

// The kernels dispatch to `target` (which this CPU supports) while this lives, then to the CPU's
// best again, as for_each_target leaves it.
class ScopedTarget {
 public:
  explicit ScopedTarget(std::int64_t target) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  }
  ~ScopedTarget() {
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

}  // namespace moekit::testing
