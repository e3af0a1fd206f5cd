// The GEMM kernel layer against its scalar reference twins, on every CPU target Highway compiled
// that this CPU supports: every layout (A·Bᵀ, A·B, Aᵀ·B), every weight dtype, tails around the
// tile sizes, strides, gathered and scaled rows, the row-scale epilogue, accumulate; and bitwise
// independence of how the work is split over tiles and threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <hwy/targets.h>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "kernels/targets.hpp"
#include "moekit/threading.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

using kernels::Output;
using kernels::RowSource;
using kernels::WeightMatrix;
using testing::for_each_target;
using testing::fused;
using testing::randn;

constexpr double kEps = 1.1920929e-7;

// A gathered, scaled view of `rows` rows out of `src` ([n_src, ld]): indices in a scrambled
// order with repeats, as the dispatch plan hands them to the kernels.
struct Gathered {
  std::vector<std::int32_t> index;
  std::vector<float> scale;
  RowSource source(const Tensor& src, bool gather, bool scaled) const {
    return {src.data_as<const float>(), src.dim(1), gather ? index.data() : nullptr, scaled ? scale.data() : nullptr};
  }
};

Gathered make_gather(std::int64_t rows, std::int64_t n_src, std::mt19937& rng) {
  Gathered g;
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(n_src - 1));
  std::uniform_real_distribution<float> w(0.1f, 1.5f);
  for (std::int64_t i = 0; i < rows; ++i) {
    g.index.push_back(pick(rng));
    g.scale.push_back(w(rng));
  }
  return g;
}

// Value of a (possibly gathered, scaled) RowSource element as the kernels see it.
double src_at(const RowSource& s, std::int64_t i, std::int64_t k) {
  const float v = s.row(i)[k];
  return s.scale ? static_cast<double>(v * s.scale[i]) : v;
}

enum class Layout { nt, nt_panels, nn, nn_panels, tn };

const char* layout_name(Layout l) {
  return l == Layout::nt ? "nt" : l == Layout::nt_panels ? "nt_panels" : l == Layout::nn ? "nn"
         : l == Layout::nn_panels ? "nn_panels" : "tn";
}
bool is_nt(Layout l) { return l == Layout::nt || l == Layout::nt_panels; }

// One random case of `layout`: fast kernel vs reference, every element within the bound (or
// bitwise, for the outer-product kernels on fused targets); columns past N untouched.
// b_ld: B's row length in elements (0: b's length plus a few, a stride that aliases nothing);
// threads: the fast kernel's (caller: one kernel call over all of M and N).
void check_case(Layout layout, DType dt, std::int64_t M, std::int64_t N, std::int64_t K,
                bool gather, bool scaled, bool row_scale, bool accumulate, std::int64_t target,
                std::mt19937& rng, std::int64_t b_ld = 0,
                kernels::Threads threads = kernels::Threads::pool) {
  const std::int64_t pad = 3, ldc = N + 2;
  // A: nt/nn [M, K] rows (gathered from 2M+1 source rows); tn: K rows of M.
  const std::int64_t a_rows = layout == Layout::tn ? K : M, a_len = layout == Layout::tn ? M : K;
  const std::int64_t a_src = gather ? 2 * a_rows + 1 : a_rows;
  Tensor a = randn({a_src, a_len + pad}, rng);
  const Gathered ga = make_gather(a_rows, a_src, rng);
  const RowSource A = ga.source(a, gather, scaled);
  // B: nt [N, K] weights; nn [K, N] weights; tn K f32 rows of N (gathered and scaled like A).
  const std::int64_t b_rows = is_nt(layout) ? N : K, b_len = is_nt(layout) ? K : N;
  const std::int64_t b_src = layout == Layout::tn && gather ? 2 * b_rows + 1 : b_rows;
  Tensor b32 = randn({b_src, b_ld > 0 ? b_ld : b_len + pad + 2}, rng);
  Tensor b = layout == Layout::tn ? b32 : to_dtype(b32, dt);
  Tensor bw = to_dtype(b, DType::f32);
  const Gathered gb = make_gather(b_rows, b_src, rng);
  const WeightMatrix Bw{b.data(), b.dtype(), b.dim(1)};
  Tensor panels = Tensor::uninitialized({std::max<std::int64_t>(1, kernels::panel_elements(N, K))}, b.dtype());
  if (layout == Layout::nt_panels) kernels::pack_panels(Bw, N, K, panels.data());
  const WeightMatrix Bp{panels.data(), b.dtype(), K, kernels::WeightLayout::panels};
  // nn on packed weights: W [K, N] packed over its K rows, as the forward packs [out, in].
  Tensor panels_nn = Tensor::uninitialized({std::max<std::int64_t>(1, kernels::panel_elements(K, N))}, b.dtype());
  if (layout == Layout::nn_panels) kernels::pack_panels(Bw, K, N, panels_nn.data());
  const WeightMatrix Bpn{panels_nn.data(), b.dtype(), N, kernels::WeightLayout::panels};
  const RowSource Bt = gb.source(b, gather, scaled), Bt_wide = gb.source(bw, gather, scaled);
  std::vector<float> rs(static_cast<std::size_t>(M));
  for (auto& v : rs) v = std::uniform_real_distribution<float>(0.25f, 2.0f)(rng);

  Tensor c = randn({std::max<std::int64_t>(M, 1), ldc}, rng), c_ref = c.clone();
  const Output C{c.data_as<float>(), ldc, row_scale ? rs.data() : nullptr, accumulate};
  const Output C_ref{c_ref.data_as<float>(), ldc, row_scale ? rs.data() : nullptr, accumulate};
  switch (layout) {
    case Layout::nt:
      kernels::gemm_nt(A, Bw, C, M, N, K, threads);
      kernels::ref::gemm_nt(A, Bw, C_ref, M, N, K);
      break;
    case Layout::nt_panels:
      kernels::gemm_nt(A, Bp, C, M, N, K, threads);
      kernels::ref::gemm_nt_fma(A, Bw, C_ref, M, N, K);
      break;
    case Layout::nn:
      kernels::gemm_nn(A, Bw, C, M, N, K, threads);
      kernels::ref::gemm_nn(A, Bw, C_ref, M, N, K);
      break;
    case Layout::nn_panels:
      kernels::gemm_nn(A, Bpn, C, M, N, K, threads);
      kernels::ref::gemm_nn(A, Bw, C_ref, M, N, K);
      break;
    case Layout::tn:
      kernels::gemm_tn(A, Bt, C, M, N, K, threads);
      kernels::ref::gemm_tn(A, Bt, C_ref, M, N, K);
      break;
  }
  const bool bitwise = layout != Layout::nt && layout != Layout::nn_panels && fused(target);  // nt_panels, nn, tn: one FMA chain
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < ldc; ++n) {
      const float got = c.data_as<float>()[m * ldc + n], want = c_ref.data_as<float>()[m * ldc + n];
      if (n >= N || bitwise) {
        ASSERT_EQ(got, want) << (n >= N ? "wrote outside [M, N)" : "not bitwise equal") << " "
                             << layout_name(layout) << " " << dtype_name(dt) << " M=" << M << " N=" << N
                             << " K=" << K << " at " << m << "," << n;
        continue;
      }
      // Any summation order of a length-K dot product errs by at most K·eps·Σ|a_k b_k| (Higham);
      // both sides carry it, hence 2×; the epilogue's scale and add one rounding each.
      double mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double av = layout == Layout::tn ? src_at(A, k, m) : src_at(A, m, k);
        const double bv = is_nt(layout)         ? bw.data_as<float>()[n * bw.dim(1) + k]
                          : layout != Layout::tn ? bw.data_as<float>()[k * bw.dim(1) + n]
                                                 : src_at(Bt_wide, k, n);
        mag += std::fabs(av * bv);
      }
      if (row_scale) mag *= rs[static_cast<std::size_t>(m)];
      const double tol = 2.0 * static_cast<double>(K + 2) * kEps * mag + 2 * kEps * std::fabs(want) + 1e-30;
      ASSERT_NEAR(got, want, tol) << layout_name(layout) << " " << dtype_name(dt) << " M=" << M << " N=" << N
                                  << " K=" << K << " gather=" << gather << " scaled=" << scaled
                                  << " row_scale=" << row_scale << " acc=" << accumulate << " at " << m << "," << n;
    }
  }
}

void check_against_reference(Layout layout, std::int64_t target) {
  std::mt19937 rng(1);
  // Sizes around every target's tiles: rows 1..7, 13 (3/4/6-row tiles); columns around 4-wide
  // dot tiles and 1-, 3- and 4-vector outer tiles of 4, 8 and 16 lanes; K around lane counts.
  const std::vector<std::int64_t> Ms = {1, 2, 3, 4, 5, 6, 7, 13, 25};
  const std::vector<std::int64_t> Ns = layout == Layout::nt ? std::vector<std::int64_t>{1, 3, 4, 5, 9}
                                                            : std::vector<std::int64_t>{1, 7, 8, 9, 17, 24, 25, 33, 65};
  const std::vector<std::int64_t> Ks = {0, 1, 7, 8, 9, 16, 17, 33};
  const std::vector<DType> dts = layout == Layout::tn ? std::vector<DType>{DType::f32}
                                                      : std::vector<DType>{DType::f32, DType::bf16, DType::f16};
  for (DType dt : dts)
    for (std::int64_t M : Ms)
      for (std::int64_t N : Ns)
        for (std::int64_t K : Ks)
          for (int variant = 0; variant < 4; ++variant) {
            // gather/scale, row scale and accumulate in four combinations that cover each alone.
            const bool gather = variant == 1 || variant == 3, scaled = variant == 1 || variant == 2;
            const bool row_scale = variant >= 2, acc = variant == 0 || variant == 3;
            check_case(layout, dt, M, N, K, gather, scaled, row_scale, acc, target, rng);
            if (::testing::Test::HasFatalFailure()) return;
          }
}

TEST(Gemm, NtMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) { check_against_reference(Layout::nt, t); });
}
TEST(Gemm, NtOnPanelsMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) { check_against_reference(Layout::nt_panels, t); });
}
// The panels kernel packs A's rows in blocks of at most 4 MB (gemm_panel.cpp's kPackFloats):
// K = 2100 puts 492 rows in a block on the 12- and 6-row targets, 495 on the 3-row ones, so 500
// rows on the calling thread take two; gathered and scaled rows, row scale and accumulate, a
// column tail, every weight dtype.
TEST(Gemm, NtOnPanelsOverRowBlocksMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) {
    std::mt19937 rng(9);
    for (const DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const int variant : {1, 3}) {
        const bool gather = variant == 1 || variant == 3, scaled = variant == 1 || variant == 2;
        const bool row_scale = variant >= 2, acc = variant == 0 || variant == 3;
        check_case(Layout::nt_panels, dt, 500, 20, 2100, gather, scaled, row_scale, acc, t, rng, 0,
                   kernels::Threads::caller);
        if (::testing::Test::HasFatalFailure()) return;
      }
  });
}
TEST(Gemm, NnOnPanelsMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) { check_against_reference(Layout::nn_panels, t); });
}
TEST(Gemm, NnMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) { check_against_reference(Layout::nn, t); });
}
// gemm_nn streams B in chunks of 64 rows, carrying each tile's partial sums from chunk to chunk,
// over blocks of C's rows sized by the partial sums' budget (gemm_outer.cpp's NnStream): K across
// several chunks and chunk tails, weight rows 8 KB, 4 KB and 3 KB apart (the strides of the
// reference shapes' weights), every weight dtype, rows over several strips and column tails; and
// rows past one block (N = 2100 on the calling thread: 40 rows a block on AVX-512, 44 on the
// others).
TEST(Gemm, NnOverChunksAndRowBlocksMatchesReferenceOnEveryTarget) {
  struct Case {
    std::int64_t stride_bytes, K, M, N;
  };
  for_each_target([](std::int64_t t) {
    std::mt19937 rng(5);
    for (const DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const Case c :
           {Case{8192, 140, 13, 17}, Case{8192, 140, 30, 100}, Case{4096, 300, 30, 17},
            Case{3072, 1100, 30, 100}, Case{8192, 33, 13, 100}, Case{0, 129, 50, 2100}})
        for (const int variant : {1, 3}) {  // together: gather, scale, row scale, accumulate
          if ((c.K > 1000 || c.N > 1000) && dt == DType::f16)
            continue;  // the slow reference, less often
          const bool gather = variant == 1 || variant == 3, scaled = variant == 1 || variant == 2;
          const bool row_scale = variant >= 2, acc = variant == 0 || variant == 3;
          check_case(Layout::nn, dt, c.M, c.N, c.K, gather, scaled, row_scale, acc, t, rng,
                     c.stride_bytes / static_cast<std::int64_t>(dtype_size(dt)),
                     kernels::Threads::caller);
          if (::testing::Test::HasFatalFailure()) return;
        }
  });
}
TEST(Gemm, TnMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) { check_against_reference(Layout::tn, t); });
}

// A result of 1 MB or more goes out with non-temporal stores (the aligned whole vectors; the
// rest, at ldc = N + 2, with ordinary ones): the same bits, nothing written past N, and an
// accumulated one read back as before. One call (the calling thread) and split over the pool.
TEST(Gemm, TnWithALargeResultMatchesReferenceOnEveryTarget) {
  for_each_target([](std::int64_t t) {
    std::mt19937 rng(31);
    for (const bool acc : {false, true})
      for (const auto threads : {kernels::Threads::caller, kernels::Threads::pool}) {
        check_case(Layout::tn, DType::f32, 300, 1000, 5, true, true, false, acc, t, rng, 0, threads);
        if (::testing::Test::HasFatalFailure()) return;
      }
  });
}

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
