// The kernel conformance table (conformance.hpp) as tests: one per row, named
// Kernels/Conformance.MatchesReference/<format>_<layout>_<op>_<path>_<shapes>, each running its
// shape set's cases through the engine of its (mode, layout, op) and holding every result to the
// row's criterion; Conformance.EveryPathHasRows checks that the table reaches every path.
#include "kernels/conformance.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gather.hpp"
#include "kernels/plan.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "kernels/targets.hpp"
#include "moekit/threading.hpp"
#include "util/random.hpp"
#include "util/sanitizers.hpp"

namespace moekit::testing::conformance {
namespace {

using kernels::Bf16Path;
using kernels::Int8Path;
using kernels::Output;
using kernels::RowSource;
using kernels::WeightMatrix;

constexpr double kEps = 1.1920929e-7;

// A gathered, scaled view of `rows` rows out of `src` ([n_src, ld]): indices in a scrambled
// order with repeats, as the dispatch plan hands them to the kernels.
// Value of a (possibly gathered, scaled) RowSource element as the kernels see it.
double src_at(const RowSource& s, std::int64_t i, std::int64_t k) {
  const float v = s.row(i)[k];
  return s.scale ? static_cast<double>(v * s.scale[i]) : v;
}

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "M=" << c.M << " N=" << c.N << " K=" << c.K << " gather=" << c.gather
    << " scaled=" << c.scaled << " row_scale=" << c.row_scale << " acc=" << c.accumulate
    << " ld=" << c.ld << (c.threads == kernels::Threads::caller ? " caller" : " pool");
  return s.str();
}

// ---- The exact mode on f32, bf16, f16 weights: dot_bound, fma_chain ---------------------------

// The fast kernel against its reference on the format's decoded weights: every element within
// the dot-product bound, or bitwise (fma_chain on a fused target); columns past N untouched.
void check_exact(const Row& row, const Case& c, std::mt19937& rng) {
  const Op op = row.op;
  const std::int64_t M = c.M, N = c.N, K = c.K, pad = 3, ldc = N + 2;
  // A: nt/nn [M, K] rows (gathered from 2M+1 source rows); tn: K rows of M.
  const std::int64_t a_rows = op == Op::tn ? K : M, a_len = op == Op::tn ? M : K;
  const std::int64_t a_src = c.gather ? 2 * a_rows + 1 : a_rows;
  const Tensor a = randn({a_src, a_len + pad}, rng);
  const Gathered ga = make_gather(a_rows, a_src, rng);
  const RowSource A = ga.source(a, c.gather, c.scaled);
  // B: nt [N, K] weights; nn [K, N] weights; tn K f32 rows of N (gathered and scaled like A).
  const std::int64_t b_rows = op == Op::nt ? N : K, b_len = op == Op::nt ? K : N;
  const std::int64_t b_src = op == Op::tn && c.gather ? 2 * b_rows + 1 : b_rows;
  const Weights b = row.format->make(b_src, b_len, c.ld, rng);
  const Tensor bw = row.format->decode(b.w, b_src, b_len);  // what the reference multiplies by
  const WeightMatrix B_ref{bw.data(), DType::f32, b_len};
  const Gathered gb = make_gather(b_rows, b_src, rng);
  ASSERT_TRUE(op != Op::tn || b.w.dtype == DType::f32) << "gemm_tn's B is f32 rows";
  const RowSource Bt = gb.source(b.data, c.gather, c.scaled),
                  Bt_ref = gb.source(bw, c.gather, c.scaled);
  WeightMatrix B = b.w;
  Tensor packed;
  if (row.layout ==
      Layout::panels) {  // nn packs W [K, N] over its K rows, as the forward packs [out, in]
    packed = Tensor::uninitialized(
        {std::max<std::int64_t>(1, kernels::panel_elements(b_rows, b_len))}, b.w.dtype);
    kernels::pack_panels(b.w, b_rows, b_len, packed.data());
    B = {packed.data(), b.w.dtype, b_len, kernels::WeightLayout::panels};
  }
  std::vector<float> rs(static_cast<std::size_t>(M));
  for (auto& v : rs) v = std::uniform_real_distribution<float>(0.25f, 2.0f)(rng);

  Tensor out = randn({std::max<std::int64_t>(M, 1), ldc}, rng), out_ref = out.clone();
  const Output C{out.data_as<float>(), ldc, c.row_scale ? rs.data() : nullptr, c.accumulate};
  const Output C_ref{out_ref.data_as<float>(), ldc, c.row_scale ? rs.data() : nullptr,
                     c.accumulate};
  switch (op) {
    case Op::nt:
      kernels::gemm_nt(A, B, C, M, N, K, c.threads);
      if (row.layout == Layout::panels) {
        kernels::ref::gemm_nt_fma(A, B_ref, C_ref, M, N, K);
      } else {
        kernels::ref::gemm_nt(A, B_ref, C_ref, M, N, K);
      }
      break;
    case Op::nn:
      kernels::gemm_nn(A, B, C, M, N, K, c.threads);
      kernels::ref::gemm_nn(A, B_ref, C_ref, M, N, K);
      break;
    case Op::tn:
      kernels::gemm_tn(A, Bt, C, M, N, K, c.threads);
      kernels::ref::gemm_tn(A, Bt_ref, C_ref, M, N, K);
      break;
  }
  const bool bitwise = row.criterion == Criterion::fma_chain && fused(row.path.target);
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < ldc; ++n) {
      const float got = out.data_as<float>()[m * ldc + n],
                  want = out_ref.data_as<float>()[m * ldc + n];
      if (n >= N || bitwise) {
        ASSERT_EQ(got, want) << (n >= N ? "wrote outside [M, N)" : "not bitwise equal") << " at "
                             << m << "," << n;
        continue;
      }
      // Any summation order of a length-K dot product errs by at most K·eps·Σ|a_k b_k| (Higham);
      // both sides carry it, hence 2×; the epilogue's scale and add one rounding each.
      double mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double av = op == Op::tn ? src_at(A, k, m) : src_at(A, m, k);
        const double bv = op == Op::nt   ? bw.data_as<float>()[n * b_len + k]
                          : op == Op::nn ? bw.data_as<float>()[k * b_len + n]
                                         : src_at(Bt_ref, k, n);
        mag += std::fabs(av * bv);
      }
      if (c.row_scale) mag *= rs[static_cast<std::size_t>(m)];
      const double tol =
          2.0 * static_cast<double>(K + 2) * kEps * mag + 2 * kEps * std::fabs(want) + 1e-30;
      ASSERT_NEAR(got, want, tol) << "at " << m << "," << n;
    }
  }
}

// ---- The exact mode on quantized weights: dense_bitwise ---------------------------------------

void check_quantized_exact(const Row& row, const Case& c, std::mt19937& rng) {
  const std::int64_t M = c.M, N = c.N, K = c.K;
  const Weights q = row.format->make(N, K, c.ld, rng);
  const Tensor dense = row.format->decode(q.w, N, K);
  // The kernels' own decoding, from a row past the first where there is one.
  const std::int64_t n0 = N / 3;
  std::vector<float> decoded(static_cast<std::size_t>((N - n0) * K));
  kernels::dequantize_rows(q.w, n0, N - n0, K, decoded.data());
  ASSERT_EQ(std::memcmp(decoded.data(), dense.data_as<float>() + n0 * K, decoded.size() * 4), 0)
      << "dequantize_rows differs from the reference decode";
  const std::int64_t S = 2 * M + 1;
  const Tensor a = randn({S, K}, rng);
  std::vector<std::int32_t> index;
  std::vector<float> scale, rs;
  for (std::int64_t i = 0; i < M; ++i) {
    index.push_back(static_cast<std::int32_t>((i * 7 + 3) % S));
    scale.push_back(0.5f + 0.1f * static_cast<float>(i % 5));
    rs.push_back(1.5f - 0.05f * static_cast<float>(i % 7));
  }
  const RowSource A{a.data_as<const float>(), K, c.gather ? index.data() : nullptr,
                    c.scaled ? scale.data() : nullptr};
  Tensor out = randn({M, N + 1}, rng), out_ref = out.clone();
  const float* row_scale = c.row_scale ? rs.data() : nullptr;
  kernels::gemm_nt(A, q.w, {out.data_as<float>(), N + 1, row_scale, c.accumulate}, M, N, K,
                   c.threads);
  kernels::gemm_nt(A, {dense.data(), DType::f32, K},
                   {out_ref.data_as<float>(), N + 1, row_scale, c.accumulate}, M, N, K, c.threads);
  ASSERT_EQ(std::memcmp(out.data(), out_ref.data(), out.nbytes()), 0)
      << "gemm_nt on the codes differs from gemm_nt on the decoded matrix";
}

// ---- The bf16 compute mode: twin_bitwise, rounded_rows_bitwise ---------------------------------

std::vector<float> activation_buffer(std::int64_t rows, std::int64_t K, Bf16Path path) {
  return std::vector<float>((kernels::bf16_activation_bytes(rows, K, path) + 3) / 4 + 1);
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t g, w;
    std::memcpy(&g, &got[i], 4);
    std::memcpy(&w, &want[i], 4);
    ASSERT_EQ(g, w) << what << ": element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// C [M, N] (rows ldc apart) against the exact (double) sum of a [M, K] · b [N, K]ᵀ:
// |err| <= K·ε·Σ|a·b|, whatever the order (Higham).
void expect_within_exact_sum(const std::vector<float>& got, std::int64_t ldc,
                             const std::vector<float>& a, const Tensor& b, std::int64_t M,
                             std::int64_t N, std::int64_t K) {
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double exact = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(a[static_cast<std::size_t>(m * K + k)]) *
                         b.data_as<float>()[n * K + k];
        exact += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(got[static_cast<std::size_t>(m * ldc + n)], exact,
                  static_cast<double>(K) * 1.2e-7 * mag + 1e-30)
          << "against the exact sum at " << m << "," << n;
    }
}

// A bf16 [M, K] (gathered from 2M+1 rows lda = K + 5 apart), B the format's bf16 [N, K] at
// ldb = K + 3, C at ldc = N + 2 (the padding columns must stay untouched); the bitwise criterion
// of the path, and, where the case has no epilogue, within K·2u·Σ|a·b| of the exact (double) sum.
void check_bf16(const Row& row, const Case& c, std::mt19937& rng) {
  const std::int64_t M = c.M, N = c.N, K = c.K, lda = K + 5, ldc = N + 2;
  const std::int64_t src_rows = c.gather ? 2 * M + 1 : M;
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> a(static_cast<std::size_t>(src_rows * lda));
  for (auto& v : a) v = f32_to_bf16(normal(rng));
  const Weights b = row.format->make(N, K, K + 3, rng);
  ASSERT_EQ(b.w.dtype, DType::bf16) << "the bf16 compute mode takes bf16 weights";
  const Tensor bw = row.format->decode(b.w, N, K);
  std::vector<std::int32_t> index;
  std::vector<float> rs, c0(static_cast<std::size_t>(std::max<std::int64_t>(M, 1) * ldc));
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(src_rows - 1));
  for (std::int64_t i = 0; i < M; ++i) index.push_back(pick(rng));
  for (std::int64_t i = 0; i < M; ++i)
    rs.push_back(std::uniform_real_distribution<float>(0.25f, 2.0f)(rng));
  for (auto& v : c0) v = normal(rng);
  const auto out = [&](std::vector<float>& y) {
    y = c0;
    return Output{y.data(), ldc, c.row_scale ? rs.data() : nullptr, c.accumulate};
  };
  const kernels::Bf16Rows A16{a.data(), lda, c.gather ? index.data() : nullptr};
  std::vector<float> a32(a.size());  // A's bf16 values as f32 rows: round_to_bf16 keeps them
  for (std::size_t i = 0; i < a.size(); ++i) a32[i] = bf16_to_f32(a[i]);
  std::vector<float> used(static_cast<std::size_t>(M * K));  // the activations the product takes
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t k = 0; k < K; ++k)
      used[static_cast<std::size_t>(m * K + k)] = bf16_to_f32(A16.row(m)[k]);
  const RowSource widened{a32.data(), lda, c.gather ? index.data() : nullptr};
  std::vector<float> got, want;
  switch (row.path.bf16) {
    case Bf16Path::avx512bf16: {
      kernels::detail::gemm_nt_bf16_avx512(A16, b.w, out(got), M, N, K);
      kernels::ref::gemm_nt_bf16_dpbf16(A16, b.w, out(want), M, N, K);
      ASSERT_NO_FATAL_FAILURE(expect_bitwise(got, want, "kernel"));
      // And through the driver, the rows rounded by round_to_bf16.
      std::vector<float> buf = activation_buffer(M, K, Bf16Path::avx512bf16);
      const kernels::Bf16Activations act =
          kernels::round_to_bf16(widened, M, K, Bf16Path::avx512bf16, buf.data());
      kernels::gemm_nt_bf16(act, b.w, out(got), M, N, K, c.threads);
      break;
    }
    case Bf16Path::amx: {
      std::vector<float> buf = activation_buffer(M, K, Bf16Path::amx);
      const kernels::Bf16Activations act =
          kernels::round_to_bf16(widened, M, K, Bf16Path::amx, buf.data());
      WeightMatrix B = b.w;
      std::vector<std::uint16_t> tiles;
      if (row.layout == Layout::amx_tiles) {
        tiles.resize(static_cast<std::size_t>(kernels::amx_tile_elements(N, K)));
        kernels::pack_amx_tiles(b.w, N, K, tiles.data());
        B = {tiles.data(), DType::bf16, 0, kernels::WeightLayout::amx_tiles};
      }
      kernels::gemm_nt_bf16(act, B, out(got), M, N, K, c.threads);
      kernels::ref::gemm_nt_bf16_tdpbf16(A16, b.w, out(want), M, N, K);
      break;
    }
    case Bf16Path::f32_fma: {
      // f32 rows (gathered, scaled): the rounding kernel is exercised too.
      const std::int64_t ld = K + 5;
      const Tensor x32 = randn({2 * M + 1, ld}, rng);
      const RowSource x{x32.data_as<const float>(), ld, c.gather ? index.data() : nullptr,
                        c.scaled ? rs.data() : nullptr};
      std::vector<float> buf = activation_buffer(M, K, Bf16Path::f32_fma);
      const kernels::Bf16Activations act =
          kernels::round_to_bf16(x, M, K, Bf16Path::f32_fma, buf.data());
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t k = 0; k < K; ++k) {
          const float v = x.scale ? x.row(m)[k] * x.scale[m] : x.row(m)[k];
          used[static_cast<std::size_t>(m * K + k)] = bf16_to_f32(f32_to_bf16(v));
        }
      for (std::int64_t m = 0; m < M; ++m)
        ASSERT_EQ(std::memcmp(buf.data() + m * act.ld, used.data() + m * K,
                              static_cast<std::size_t>(K) * 4),
                  0)
            << "round_to_bf16 differs from f32_to_bf16 in row " << m;
      kernels::gemm_nt_bf16(act, b.w, out(got), M, N, K, c.threads);
      kernels::detail::gemm_nt_kernel({used.data(), K}, b.w, out(want), M, N, K);
      break;
    }
  }
  ASSERT_NO_FATAL_FAILURE(expect_bitwise(got, want, row.path.name.c_str()));
  if (!c.row_scale && !c.accumulate) expect_within_exact_sum(got, ldc, used, bw, M, N, K);
}

// ---- The int8 fast mode: int8_bound, portable_bitwise ------------------------------------------

// The fast mode on `path` (best: through gemm_nt's dispatch).
void run_int8(Int8Path path, const RowSource& A, const WeightMatrix& B, const Output& C,
              const Case& c) {
  if (path == Int8Path::best) return kernels::gemm_nt(A, B, C, c.M, c.N, c.K, c.threads, ComputeMode::int8);
  kernels::detail::gemm_nt_affine_int8_kernel(A, B, C, c.M, c.N, c.K, path);
}

// Against the exact kernel within the bound the arithmetic guarantees, per element
//   |y_fast − y_exact| ≤ Σ_g (d_g / 2) · Σ_{k∈g} |w_k|,  d_g = max_{k∈g} |x_k| / 127
// (plus f32 rounding), a zero row exact; and against the path's sibling.
void check_int8(const Row& row, const Case& c, std::mt19937& rng) {
  const std::int64_t M = c.M, N = c.N, K = c.K;
  const Weights q = row.format->make(N, K, c.ld, rng);
  const Tensor dense = row.format->decode(q.w, N, K);
  const WeightMatrix& exact_w = q.w;
  const WeightMatrix& fast_w = q.w;
  const int group = q.w.format.block_cols;
  const DType decode_dtype = q.w.format.decode_dtype;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(M * K));
  for (float& v : x) v = nd(rng) * (rng() % 7 == 0 ? 8.0f : 1.0f);  // outliers widen some groups
  if (M > 2)
    for (std::int64_t k = 0; k < K; ++k) x[static_cast<std::size_t>(K + k)] = 0.0f;  // a zero row
  const RowSource A{x.data(), K};
  std::vector<float> exact(static_cast<std::size_t>(M * N)), got(exact.size()),
      sibling(exact.size());
  kernels::gemm_nt(A, exact_w, Output{exact.data(), N}, M, N, K, c.threads);
  const Int8Path path = row.path.int8;
  run_int8(path, A, fast_w, Output{got.data(), N}, c);
  // avx512vnni against avx2 (the same exact group sums and float steps: bitwise); avx2 and the
  // dispatch against the portable path.
  const Int8Path sib = path == Int8Path::avx512vnni ? Int8Path::avx2 : Int8Path::portable;
  const bool has_sibling = path != Int8Path::portable;
  if (has_sibling)
    kernels::detail::gemm_nt_affine_int8_kernel(A, fast_w, Output{sibling.data(), N}, M, N, K, sib);
  if (path == Int8Path::avx512vnni) {
    ASSERT_EQ(std::memcmp(got.data(), sibling.data(), got.size() * 4), 0) << "avx512vnni vs avx2: not bitwise";
  }
  const float* wd = dense.data_as<const float>();
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double bound = 0, mag = 0;
      for (std::int64_t g = 0; g < K / group; ++g) {
        double amax = 0, wsum = 0;
        for (std::int64_t k = g * group; k < (g + 1) * group; ++k) {
          amax = std::max(amax, std::fabs(double(x[static_cast<std::size_t>(m * K + k)])));
          wsum += std::fabs(double(wd[n * K + k]));
          mag += std::fabs(double(wd[n * K + k]) * x[static_cast<std::size_t>(m * K + k)]);
        }
        bound += amax / 127.0 / 2.0 * wsum;
      }
      // int4 decoded in bf16 / f16: the fast mode multiplies the unrounded q · s, up to half an
      // ulp of the reference's weight away (relative 2^-9 / 2^-12).
      const double unrounded = decode_dtype == DType::bf16 ? 0x1p-9 : decode_dtype == DType::f16 ? 0x1p-12 : 0.0;
      const double tol = bound * 1.001 + (1e-5 + unrounded * 1.01) * mag + 1e-30;
      const std::size_t i = static_cast<std::size_t>(m * N + n);
      ASSERT_LE(std::fabs(double(got[i]) - exact[i]), tol)
          << "against the exact kernel at " << m << "," << n;
      if (M > 2 && m == 1) {
        ASSERT_EQ(got[i], exact[i]) << "a zero row is exact";
      }
      if (has_sibling && path != Int8Path::avx512vnni) {
        ASSERT_LE(std::fabs(double(got[i]) - sibling[i]), 1e-5 * mag + 1e-30)
            << "against portable at " << m << "," << n;
      }
    }
}

// AMX-INT8 against the portable kernel, bit for bit; and the driver (gemm_nt, which takes AMX
// for more than kInt8MaxRows rows) on 1-3 threads.
void check_int8_amx(const Row& row, const Case& c, std::mt19937& rng) {
  const std::int64_t M = c.M, N = c.N, K = c.K;
  const Weights q = row.format->make(N, K, c.ld, rng);
  const WeightMatrix& fast_w = q.w;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xs(static_cast<std::size_t>((2 * M + 1) * K));
  for (float& v : xs) v = nd(rng) * (rng() % 7 == 0 ? 8.0f : 1.0f);
  std::vector<std::int32_t> index;
  std::vector<float> scale, row_scale;
  for (std::int64_t i = 0; i < M; ++i) {
    index.push_back(static_cast<std::int32_t>(rng() % (2 * M + 1)));
    scale.push_back(0.25f + 0.5f * static_cast<float>(i % 5));
    row_scale.push_back(i % 3 == 0 ? -1.5f : 0.75f);
  }
  const RowSource A{xs.data(), K, c.gather ? index.data() : nullptr,
                    c.scaled ? scale.data() : nullptr};
  std::vector<float> c0(static_cast<std::size_t>(M * N));
  for (float& v : c0) v = nd(rng);
  const auto out = [&](std::vector<float>& y) {
    y = c0;
    return Output{y.data(), N, c.row_scale ? row_scale.data() : nullptr, c.accumulate};
  };
  std::vector<float> want, got;
  kernels::detail::gemm_nt_affine_int8_kernel(A, fast_w, out(want), M, N, K, Int8Path::portable);
  kernels::detail::gemm_nt_affine_int8_kernel(A, fast_w, out(got), M, N, K, Int8Path::amx);
  ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "amx vs portable";
  // gemm_nt takes AMX past kInt8MaxRows rows, unless MOEKIT_INT8_PATH names another path.
  if (kernels::plan_gemm_nt(fast_w, ComputeMode::int8, M, K).kernel != kernels::Kernel::int8_amx) return;
  const int before = num_threads();
  for (const int t : {1, 2, 3}) {
    set_num_threads(t);
    kernels::gemm_nt(A, fast_w, out(got), M, N, K, kernels::Threads::pool, ComputeMode::int8);
    const bool same = std::memcmp(got.data(), want.data(), want.size() * 4) == 0;
    set_num_threads(before);
    ASSERT_TRUE(same) << "gemm_nt on " << t << " threads vs portable";
  }
}

void run_case(const Row& row, const Case& c, std::mt19937& rng) {
  switch (row.criterion) {
    case Criterion::dot_bound:
    case Criterion::fma_chain:
      return check_exact(row, c, rng);
    case Criterion::dense_bitwise:
      return check_quantized_exact(row, c, rng);
    case Criterion::twin_bitwise:
    case Criterion::rounded_rows_bitwise:
      return check_bf16(row, c, rng);
    case Criterion::int8_bound:
      return check_int8(row, c, rng);
    case Criterion::portable_bitwise:
      return check_int8_amx(row, c, rng);
  }
  FAIL() << "no engine for criterion " << name_of(row.criterion);
}

// A seed per row from its name (FNV-1a): each row draws its own operands, the same every run.
std::uint32_t seed_of(const std::string& name) {
  std::uint32_t h = 2166136261u;
  for (const char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 16777619u;
  return h;
}

class Conformance : public ::testing::TestWithParam<Row> {};

TEST_P(Conformance, MatchesReference) {
  const Row& row = GetParam();
  const std::string why = row.path.unsupported();
  if (!why.empty()) GTEST_SKIP() << why;
  // A path changes the arithmetic inside a task, not how the driver splits the product over the
  // pool. ThreadSanitizer checks the split, so under it the scalar target's rows (twins of the
  // SIMD target's), the portable int8 kernel and the int8 dispatch (one of the named paths) stay
  // with the other builds.
  if (testing::kThreadSanitizer && ((row.path.target & (HWY_EMU128 | HWY_SCALAR)) != 0 ||
                                    row.path.int8 == kernels::Int8Path::portable || row.path.name == "int8dispatch"))
    GTEST_SKIP() << "ThreadSanitizer: the driver's split is checked on the SIMD target's and named kernels' rows";
  std::optional<ScopedTarget> target;
  if (row.path.target != 0) target.emplace(row.path.target);
  ASSERT_TRUE(row.path.target == 0 ||
              kernels::simd_target_name() == std::string(hwy::TargetName(row.path.target)))
      << "dispatch did not follow to " << row.path.name;
  std::mt19937 rng(seed_of(row.name()));
  std::size_t checked = 0;
  for (const Case& c : row.shapes->cases) {
    // ThreadSanitizer checks threads against each other, and a case on the calling thread has
    // none: under TSan those (the large shapes among them, minutes of instrumented reference
    // loops) run only in the other builds.
    if (testing::kThreadSanitizer && c.threads == kernels::Threads::caller) continue;
    SCOPED_TRACE(describe(c));
    run_case(row, c, rng);
    if (HasFailure()) break;
    ++checked;
  }
  if (checked == 0 && testing::kThreadSanitizer && !HasFailure())
    GTEST_SKIP() << "ThreadSanitizer: every case of this row runs on the calling thread";
  RecordProperty("criterion", name_of(row.criterion));
  RecordProperty("cases", static_cast<int>(checked));
  EXPECT_GT(checked, 0u) << "the row checked nothing";
}

INSTANTIATE_TEST_SUITE_P(Kernels, Conformance, ::testing::ValuesIn(table()),
                         [](const ::testing::TestParamInfo<Row>& p) { return p.param.name(); });

// The table reaches every path: each Highway target this CPU supports (those for_each_target
// visits) in the exact mode for every plain format, layout and op and in the bf16 mode's f32_fma
// path; every bf16 and int8 path (skipped where unsupported); names are unique and well-formed.
TEST(Conformance, EveryPathHasRows) {
  const std::vector<Row> rows = table();
  std::set<std::string> names, formats, layouts, paths, shapes, ops;
  std::size_t runnable = 0, cases = 0;
  for (const Row& row : rows) {
    const std::string name = row.name();
    EXPECT_TRUE(names.insert(name).second) << "two rows named " << name;
    EXPECT_TRUE(std::all_of(name.begin(), name.end(), [](char ch) {
      return std::isalnum(ch) || ch == '_';
    })) << name;
    EXPECT_FALSE(row.shapes->cases.empty()) << name;
    formats.insert(row.format->name);
    layouts.insert(name_of(row.layout));
    paths.insert(row.path.name);
    ops.insert(name_of(row.op));
    shapes.insert(row.shapes->name);
    if (row.path.unsupported().empty()) {
      ++runnable;
      cases += row.shapes->cases.size();
    }
  }
  const auto has = [&](auto pred) { return std::any_of(rows.begin(), rows.end(), pred); };
  for (const std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    for (const char* format : {"f32", "bf16", "f16"})
      for (const Layout layout : {Layout::rows, Layout::panels})
        for (const Op op : {Op::nt, Op::nn})
          EXPECT_TRUE(has([&](const Row& r) {
            return r.mode == Mode::f32 && r.path.target == t && r.format->name == format &&
                   r.layout == layout && r.op == op;
          })) << "no "
              << format << " " << name_of(layout) << " " << name_of(op) << " rows on "
              << hwy::TargetName(t);
    EXPECT_TRUE(has([&](const Row& r) {
      return r.mode == Mode::f32 && r.path.target == t && r.op == Op::tn;
    })) << "no tn rows on "
        << hwy::TargetName(t);
    EXPECT_TRUE(has([&](const Row& r) {
      return r.mode == Mode::f32 && r.path.target == t && r.layout == Layout::quant;
    })) << "no quantized rows on "
        << hwy::TargetName(t);
    EXPECT_TRUE(has([&](const Row& r) {
      return r.mode == Mode::bf16 && r.path.target == t && r.path.bf16 == Bf16Path::f32_fma;
    })) << "no bf16 f32_fma rows on "
        << hwy::TargetName(t);
  }
  for (const Bf16Path p : kernels::kBf16Paths)
    EXPECT_TRUE(has([&](const Row& r) { return r.mode == Mode::bf16 && r.path.bf16 == p; }))
        << "no rows for the bf16 path " << kernels::bf16_path_name(p);
  EXPECT_TRUE(
      has([&](const Row& r) { return r.mode == Mode::bf16 && r.layout == Layout::amx_tiles; }));
  for (const Int8Path p :
       {Int8Path::portable, Int8Path::avx2, Int8Path::avx512vnni, Int8Path::amx, Int8Path::best})
    EXPECT_TRUE(has([&](const Row& r) { return r.mode == Mode::int8 && r.path.int8 == p; }))
        << "no rows for the int8 path " << int8_path(p).name;
  std::printf(
      "[ TABLE    ] %zu rows over %zu formats, %zu layouts, %zu paths, %zu shape sets, %zu ops; "
      "%zu run here "
      "(%zu cases), %zu skipped\n",
      rows.size(), formats.size(), layouts.size(), paths.size(), shapes.size(), ops.size(),
      runnable, cases, rows.size() - runnable);
  RecordProperty("rows", static_cast<int>(rows.size()));
  RecordProperty("runnable_rows", static_cast<int>(runnable));
}

}  // namespace
}  // namespace moekit::testing::conformance
