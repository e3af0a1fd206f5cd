// The GEMM kernel layer's properties beyond matching its reference (the conformance table,
// conformance.hpp, holds every layout, weight dtype and tail to its scalar twin on every target):
// bitwise independence of how the work is split over tiles and threads, gathered scaled rows as
// the materialised rows, and that the kernel tests reach every compiled target this CPU supports.
#include "kernels/gemm.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/gather.hpp"
#include "kernels/targets.hpp"
#include "moekit/threading.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

using kernels::Output;
using kernels::RowSource;
using kernels::WeightMatrix;
using testing::for_each_target;
using testing::Gathered;
using testing::make_gather;
using testing::randn;

// A gathered, scaled view of `rows` rows out of `src` ([n_src, ld]): indices in a scrambled
// order with repeats, as the dispatch plan hands them to the kernels.
enum class Layout { nt, nt_panels, nn, nn_panels, tn };

const char* layout_name(Layout l) {
  return l == Layout::nt ? "nt" : l == Layout::nt_panels ? "nt_panels" : l == Layout::nn ? "nn"
         : l == Layout::nn_panels ? "nn_panels" : "tn";
}
bool is_nt(Layout l) { return l == Layout::nt || l == Layout::nt_panels; }

// The whole product, element by element and over 1, 2, 3 threads: the same bits.
void check_split_invariance(Layout layout) {
  std::mt19937 rng(2);
  const std::int64_t M = 37, N = 157, K = 301;
  const std::int64_t a_rows = layout == Layout::tn ? K : M, a_len = layout == Layout::tn ? M : K;
  Tensor a = randn({a_rows, a_len}, rng);
  Tensor b = is_nt(layout) ? to_dtype(randn({N, K}, rng), DType::bf16)
             : layout != Layout::tn ? to_dtype(randn({K, N}, rng), DType::bf16)
                                    : randn({K, N}, rng);
  const RowSource A{a.data_as<const float>(), a_len};
  const RowSource Bt{b.data_as<const float>(), N};
  Tensor packed = Tensor::uninitialized({kernels::panel_elements(N, K)}, DType::bf16);
  if (layout == Layout::nt_panels) kernels::pack_panels({b.data(), DType::bf16, K}, N, K, packed.data());
  Tensor packed_nn = Tensor::uninitialized({kernels::panel_elements(K, N)}, DType::bf16);
  if (layout == Layout::nn_panels) kernels::pack_panels({b.data(), DType::bf16, N}, K, N, packed_nn.data());
  const auto run = [&](const Output& C, std::int64_t m0, std::int64_t m, std::int64_t n0, std::int64_t n,
                       kernels::Threads th) {
    const Output c{C.data + m0 * C.ld + n0, C.ld};
    switch (layout) {
      case Layout::nt: {
        const WeightMatrix bb{static_cast<const std::uint16_t*>(b.data()) + n0 * K, DType::bf16, K};
        return kernels::gemm_nt(A.from(m0), bb, c, m, n, K, th);
      }
      case Layout::nt_panels: {
        // Splits of a packed matrix fall on whole panels.
        if (n0 % kernels::kPanelRows != 0) return;
        const WeightMatrix bb{static_cast<const std::uint16_t*>(packed.data()) + n0 * K, DType::bf16, K,
                              kernels::WeightLayout::panels};
        return kernels::gemm_nt(A.from(m0), bb, c, m, n, K, th);
      }
      case Layout::nn_panels: {
        const WeightMatrix bb{static_cast<const std::uint16_t*>(packed_nn.data()) + n0 * kernels::kPanelRows,
                              DType::bf16, N, kernels::WeightLayout::panels};
        return kernels::gemm_nn(A.from(m0), bb, c, m, n, K, th);
      }
      case Layout::nn: {
        const WeightMatrix bb{static_cast<const std::uint16_t*>(b.data()) + n0, DType::bf16, N};
        return kernels::gemm_nn(A.from(m0), bb, c, m, n, K, th);
      }
      case Layout::tn:
        return kernels::gemm_tn({A.data + m0, a_len}, {Bt.data + n0, N}, c, m, n, K, th);
    }
  };
  Tensor whole({M, N}, DType::f32), pieces({M, N}, DType::f32);
  run({whole.data_as<float>(), N}, 0, M, 0, N, kernels::Threads::caller);
  // Element by element (whole panels at a time for a packed matrix).
  const std::int64_t step = layout == Layout::nt_panels ? kernels::kPanelRows : 1;
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; n += step)
      run({pieces.data_as<float>(), N}, m, 1, n, std::min(step, N - n), kernels::Threads::caller);
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), whole.nbytes()), 0) << layout_name(layout) << " by element";
  const int saved = num_threads();
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    Tensor c({M, N}, DType::f32);
    run({c.data_as<float>(), N}, 0, M, 0, N, kernels::Threads::pool);
    EXPECT_EQ(std::memcmp(whole.data(), c.data(), whole.nbytes()), 0) << layout_name(layout) << " " << t << " threads";
  }
  set_num_threads(saved);
}

TEST(Gemm, SplitAndThreadCountDoNotChangeABitOnEveryTarget) {
  for_each_target([](std::int64_t) {
    for (Layout l : {Layout::nt, Layout::nt_panels, Layout::nn, Layout::nn_panels, Layout::tn})
      check_split_invariance(l);
  });
}

// A scaled RowSource is the scaled matrix materialised: the same bits as copying the rows.
TEST(Gemm, GatheredScaledRowsEqualMaterialisedRows) {
  std::mt19937 rng(3);
  const std::int64_t M = 11, N = 19, K = 70, S = 30;
  Tensor src = randn({S, K}, rng), b = randn({N, K}, rng);
  const Gathered g = make_gather(M, S, rng);
  Tensor copy({M, K}, DType::f32);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k)
      copy.data_as<float>()[i * K + k] = src.data_as<float>()[g.index[i] * K + k] * g.scale[i];
  Tensor c1({M, N}, DType::f32), c2({M, N}, DType::f32);
  kernels::gemm_nt(g.source(src, true, true), {b.data(), DType::f32, K}, {c1.data_as<float>(), N}, M, N, K);
  kernels::gemm_nt({copy.data_as<float>(), K}, {b.data(), DType::f32, K}, {c2.data_as<float>(), N}, M, N, K);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.nbytes()), 0);
}

// The kernel tests claim to run on every SIMD target that was compiled and that this CPU
// supports: for_each_target must visit exactly those, each switching the kernels' dispatch to it,
// and leave the default (the best of them) in place afterwards.
TEST(Gemm, TargetsCovered) {
  const std::vector<std::int64_t> expected = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(expected.empty());
  const std::string default_name = kernels::simd_target_name();
  EXPECT_EQ(default_name, hwy::TargetName(expected.front())) << "the kernels do not dispatch to the best target";
  std::vector<std::int64_t> visited;
  std::string names;
  testing::for_each_target([&](std::int64_t target) {
    visited.push_back(target);
    names += std::string(hwy::TargetName(target)) + " ";
    EXPECT_NE(hwy::SupportedTargets() & target, 0) << hwy::TargetName(target) << " is not supported here";
    EXPECT_EQ(std::string(kernels::simd_target_name()), hwy::TargetName(target)) << "dispatch did not follow";
  });
  EXPECT_EQ(visited, expected);
  EXPECT_EQ(std::string(kernels::simd_target_name()), default_name) << "the default target was not restored";
  RecordProperty("targets", names);
  std::printf("[ TARGETS  ] ran: %s(dispatched by default: %s)\n", names.c_str(), default_name.c_str());
}

}  // namespace
}  // namespace moekit
