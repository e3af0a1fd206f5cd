// The int8 fast mode on ggml's block types (kernels/int8_rows.cpp, int8_panels.cpp)
// against ggml itself (tests/goldens/gguf/blocks.gguf: rows ggml's C quantizer wrote, rows of
// random bytes, each with ggml's dequantization):
//  - each type's integer form (ggml_common.hpp) gives ggml's weights to f32 rounding;
//  - the fast mode's outputs lie within the documented bound of the exact mode's (docs/numerics.md);
//  - every instruction-set path gives the same bits, on ggml's blocks and on random bytes (every
//    code pattern, NaN and Inf scales included), with K a multiple of 256 and, for the 32-blocks,
//    with a ragged last eight-block chunk;
//  - gemm_nt takes the fast mode's row kernel for few rows and, for more, the panel kernel
//    (ggml_panel-inl.h) where the CPU has AVX2 (from 5 rows with AVX512-VNNI, else from
//    kInt8MaxRows + 1), else the exact mode (from kInt8MaxRows + 1); a NaN input makes its row NaN;
//  - every type has the fast mode, q2_K (its min per 16 weights, Mins) included;
//  - the panel kernel lies within the same bound of the exact mode, and agrees with the row
//    kernel to f32 rounding on random bytes (non-finite where it is), with ragged panels (N not a
//    multiple of 16, K not of 64) and on the pool; its two widths (AVX2's 8-row panels and
//    AVX512-VNNI's 16) give the same bits, and neither reads past the matrix; rows too far apart
//    for the direct pack's gathers give the bits of the same rows side by side;
//  - A is quantized in ggml's activation blocks (q8_0's per 32, q8_K's per 256).
#include <gtest/gtest.h>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "kernels/ggml_blocks.hpp"
#include "kernels/plan.hpp"
#include "moekit/gguf.hpp"
#include "util/sanitizers.hpp"

namespace moekit {
namespace {

using kernels::Int8Path;

const GgufFile& blocks() { return testing::ggml_blocks(); }
using testing::same_bits;

template <class T, Element kElement>
struct Type {
  using Block = T;
  static constexpr Element element = kElement;
};

using Types =
    std::tuple<Type<kernels::formats::q4_0::Type, Element::q4_0>, Type<kernels::formats::q4_1::Type, Element::q4_1>,
               Type<kernels::formats::q5_0::Type, Element::q5_0>, Type<kernels::formats::q5_1::Type, Element::q5_1>,
               Type<kernels::formats::q8_0::Type, Element::q8_0>, Type<kernels::formats::q3_k::Type, Element::q3_k>,
               Type<kernels::formats::q4_k::Type, Element::q4_k>, Type<kernels::formats::q5_k::Type, Element::q5_k>,
               Type<kernels::formats::q6_k::Type, Element::q6_k>, Type<kernels::formats::iq4_nl::Type, Element::iq4_nl>,
               Type<kernels::formats::iq4_xs::Type, Element::iq4_xs>,
               Type<kernels::formats::ggml_mxfp4::Type, Element::ggml_mxfp4>,
               Type<kernels::formats::q2_k::Type, Element::q2_k>>;

template <class Fn>
void for_each_type(const Fn& fn) {
  std::apply([&](auto... t) { (fn(t), ...); }, Types{});
}

// Whether gemm_nt runs more than kInt8MaxRows rows of ggml's types in the fast mode (the panel
// kernel: AVX2 or AVX512-VNNI).
bool panels() { return std::string(kernels::int8_path_name(Int8Path::best)) != "portable"; }

// The panel paths this CPU has.
std::vector<Int8Path> panel_paths() {
  std::vector<Int8Path> paths;
  for (const Int8Path path : {Int8Path::avx2, Int8Path::avx512vnni})
    if (kernels::int8_path_supported(path)) paths.push_back(path);
  return paths;
}

// gemm_nt on M rows in the int8 mode, on the pool.
std::vector<float> fast_gemm(const kernels::WeightMatrix& B, const std::vector<float>& x, std::int64_t M,
                             std::int64_t N, std::int64_t K) {
  std::vector<float> y(static_cast<std::size_t>(M * N), -7.0f);
  kernels::gemm_nt(kernels::RowSource{x.data(), K}, B, kernels::Output{y.data(), N}, M, N, K, kernels::Threads::pool,
                   ComputeMode::int8);
  return y;
}

// The rows of one call the int8 row kernel takes (the plan's int8_rows; more go to the panels).
std::int64_t row_kernel_max_rows(const kernels::WeightMatrix& B, std::int64_t K) {
  std::int64_t M = 1;
  while (kernels::plan_gemm_nt(B, ComputeMode::int8, M + 1, K).kernel == kernels::Kernel::int8_rows) ++M;
  return M;
}

// |y − exact| ≤ Σ_s (d_s / 2) Σ_k |w_k| with d_s = max |x| / 127 over A's activation block s of
// `span` inputs (32 for the 32-block types, 256 for the K-quants: ggml's q8_0 / q8_K), plus f32
// rounding of the sums; W the dequantized weights [N, K].
void expect_within_bound(const char* name, const float* W, const std::vector<float>& x, const std::vector<float>& y,
                         const std::vector<float>& exact, std::int64_t M, std::int64_t N, std::int64_t K,
                         std::int64_t span) {
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double bound = 0.0, mag = 0.0;
      for (std::int64_t g = 0; g < K / span; ++g) {
        double amax = 0.0, wsum = 0.0;
        for (std::int64_t k = span * g; k < span * g + span; ++k) {
          amax = std::max(amax, std::fabs(static_cast<double>(x[m * K + k])));
          wsum += std::fabs(static_cast<double>(W[n * K + k]));
          mag += std::fabs(static_cast<double>(W[n * K + k]) * x[m * K + k]);
        }
        bound += amax / 127.0 / 2.0 * wsum;
      }
      const std::size_t i = static_cast<std::size_t>(m * N + n);
      EXPECT_LE(std::fabs(y[i] - exact[i]), bound + 1e-5 * mag)
          << name << " M " << M << " (" << m << ", " << n << "): fast " << y[i] << ", exact " << exact[i];
      EXPECT_GT(std::fabs(y[i] - exact[i]), 0.0f) << "the fast mode should not be the exact one";
    }
}

kernels::WeightMatrix matrix(Element e, const void* data, std::int64_t ld) {
  kernels::WeightMatrix B;
  B.data = data;
  B.dtype = DType::u8;
  B.format = WeightFormat::ggml(e);
  B.ld = ld;
  return B;
}

std::vector<float> inputs(std::int64_t M, std::int64_t K, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(M * K));
  for (auto& v : x) v = g(rng);
  return x;
}

std::vector<float> fast(const kernels::WeightMatrix& B, const std::vector<float>& x, std::int64_t M, std::int64_t N,
                        std::int64_t K, Int8Path path) {
  std::vector<float> y(static_cast<std::size_t>(M * N), -7.0f);
  kernels::detail::gemm_nt_affine_int8_kernel(kernels::RowSource{x.data(), K}, B, kernels::Output{y.data(), N}, M, N, K,
                                              path);
  return y;
}

// The panel kernel of `path`'s width, on the pool.
std::vector<float> panel(const kernels::WeightMatrix& B, const std::vector<float>& x, std::int64_t M, std::int64_t N,
                         std::int64_t K, Int8Path path) {
  std::vector<float> y(static_cast<std::size_t>(M * N), -7.0f);
  kernels::detail::gemm_nt_int8_many(kernels::RowSource{x.data(), K}, B, kernels::Output{y.data(), N}, M, N, K,
                                     kernels::Threads::pool, path);
  return y;
}

// The rows the kernels are compared on: ggml's blocks (q), 13 rows of random bytes with K 1024
// (every code pattern, NaN and Inf scales; one ragged panel), and for the 32-blocks ggml's
// blocks with K = 11 blocks (a ragged last eight-block chunk, K not a multiple of 64).
struct Case {
  std::string what;
  std::vector<std::uint8_t> bytes;
  std::int64_t N, K, ld;
};

template <class T>
std::vector<Case> cases_of(const GgufTensorInfo& q, std::mt19937& rng) {
  const auto* qb = static_cast<const std::uint8_t*>(q.data);
  const std::int64_t qK = q.ne[0], qld = qK / T::kBlock * T::kBytes;
  std::vector<Case> cases{{"ggml's blocks", std::vector<std::uint8_t>(qb, qb + q.nbytes), q.ne[1], qK, qld}};
  const std::int64_t N = 13, K = 1024, ld = K / T::kBlock * T::kBytes;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(N * ld));
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  cases.push_back({"random bytes", std::move(bytes), N, K, ld});
  if (T::kBlock == 32) cases.push_back({"K of 11 blocks", cases[0].bytes, q.ne[1], 11 * 32, qld});
  return cases;
}

TEST(GgmlInt8, IntegerFormGivesGgmlsWeights) {
  for_each_type([](auto type) {
    using T = typename decltype(type)::Block;
    for (const char* which : {".q", ".rand"}) {
      const std::string name = std::string(T::kName) + which;
      const GgufTensorInfo* q = blocks().find(name);
      const GgufTensorInfo* ref = blocks().find(name + ".ref");
      ASSERT_TRUE(q && ref) << name;
      const auto* bytes = static_cast<const std::uint8_t*>(q->data);
      const auto* want = reinterpret_cast<const float*>(ref->data);
      const std::int64_t count = q->ne[0] * q->ne[1] / T::kBlock;
      int bad = 0, checked = 0;
      for (std::int64_t b = 0; b < count; ++b) {
        std::int8_t codes[T::kBlock];
        std::int16_t qs16[T::kBlock / 16];
        float ws[T::kBlock / 32], wb[T::kBlock / 32];
        T::Int8(bytes + b * T::kBytes, codes, qs16, ws, wb);
        std::int16_t qm16[T::kBlock / 16] = {};
        float wm[T::kBlock / 32] = {};
        if constexpr (requires { T::kMin16; }) T::Mins(bytes + b * T::kBytes, qm16, wm);  // q2_K
        for (int k = 0; k < T::kBlock; ++k) {
          const double scaled = static_cast<double>(ws[k / 32]) * qs16[k / 16] * codes[k];
          const double w = scaled + wb[k / 32] + static_cast<double>(wm[k / 32]) * qm16[k / 16];
          const float g = want[b * T::kBlock + k];
          if (!std::isfinite(g) || !std::isfinite(w)) continue;  // NaN / Inf scales: the values, not a form
          ++checked;
          // ggml rounds at most three times in f32 (a scale product, the code's product, the min).
          const double tol =
              4.0 * 0x1p-24 * (std::fabs(scaled) + std::fabs(wb[k / 32]) + std::fabs(wm[k / 32] * qm16[k / 16])) +
              1e-40;
          if (std::fabs(w - g) > tol && bad++ < 5)
            ADD_FAILURE() << name << " block " << b << " weight " << k << ": ggml " << g << ", integer form " << w;
        }
      }
      EXPECT_EQ(bad, 0) << name;
      if (which[1] == 'q') {
        EXPECT_EQ(checked, count * T::kBlock) << name;
      }
    }
  });
}

// The decode kernel (up to kInt8MaxRows rows) and the panel kernel (more, where the CPU has it),
// each within the bound of the exact mode.
TEST(GgmlInt8, WithinTheBoundOfTheExactMode) {
  for_each_type([](auto type) {
    using T = typename decltype(type)::Block;
    const std::string name = std::string(T::kName) + ".q";
    const GgufTensorInfo* q = blocks().find(name);
    const GgufTensorInfo* ref = blocks().find(name + ".ref");
    ASSERT_TRUE(q && ref);
    const std::int64_t K = q->ne[0], N = q->ne[1];
    const auto* W = reinterpret_cast<const float*>(ref->data);
    const kernels::WeightMatrix B = matrix(type.element, q->data, K / T::kBlock * T::kBytes);
    for (const std::int64_t M :
         {std::int64_t{1}, std::int64_t{3}, std::int64_t{8}, std::int64_t{9}, std::int64_t{13}, std::int64_t{31}}) {
      const bool many = M > kernels::kInt8MaxRows;
      if (many ? !panels() : !T::kInt8) continue;
      const auto x = inputs(M, K, 11 + static_cast<std::uint32_t>(M));
      std::vector<float> exact(static_cast<std::size_t>(M * N));
      kernels::gemm_nt(kernels::RowSource{x.data(), K}, B, kernels::Output{exact.data(), N}, M, N, K);
      const auto y = many ? fast_gemm(B, x, M, N, K) : fast(B, x, M, N, K, Int8Path::best);
      expect_within_bound(T::kName, W, x, y, exact, M, N, K, T::kBlock);
    }
  });
}

// The fast mode is the product of the dequantized weights with A quantized as ggml quantizes it
// for the type (q8_0's scale per 32 inputs for the 32-block types, q8_K's per 256 for the
// K-quants): d = max |x| / 127 over the block, codes rint(x · 127 / max |x|) — to f32 rounding,
// for the row kernel and the panel kernel. The inputs' 32-groups differ in size by up to 2^6, so
// a scale per 32 inputs where ggml has one per 256 (or the reverse) is far outside it.
TEST(GgmlInt8, ActivationsAreQuantizedAsGgmlsBlocks) {
  for_each_type([](auto type) {
    using T = typename decltype(type)::Block;
    const GgufTensorInfo* q = blocks().find(std::string(T::kName) + ".q");
    const GgufTensorInfo* ref = blocks().find(std::string(T::kName) + ".q.ref");
    ASSERT_TRUE(q && ref);
    const std::int64_t K = q->ne[0], N = q->ne[1], span = T::kBlock;
    const auto* W = reinterpret_cast<const float*>(ref->data);
    const kernels::WeightMatrix B = matrix(type.element, q->data, K / T::kBlock * T::kBytes);
    for (const std::int64_t M : {std::int64_t{1}, std::int64_t{3}, std::int64_t{9}, std::int64_t{13}}) {
      const bool many = M > kernels::kInt8MaxRows;
      if (many ? !panels() : !T::kInt8) continue;
      auto x = inputs(M, K, 23 + static_cast<std::uint32_t>(M));
      for (std::int64_t k = 0; k < M * K; ++k) x[static_cast<std::size_t>(k)] *= std::ldexp(1.0f, (k / 32) % 7 - 3);
      // x as the kernels see it: quantize_row's float steps.
      std::vector<double> xq(x.size());
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t s0 = 0; s0 < K; s0 += span) {
          float amax = 0.0f;
          for (std::int64_t k = s0; k < s0 + span; ++k) amax = std::max(amax, std::fabs(x[m * K + k]));
          const float d = amax / 127.0f, inv = 127.0f / amax;
          for (std::int64_t k = s0; k < s0 + span; ++k) {
            const float r = std::min(127.0f, std::max(-127.0f, std::rint(x[m * K + k] * inv)));
            xq[static_cast<std::size_t>(m * K + k)] = static_cast<double>(d) * r;
          }
        }
      const auto y = many ? fast_gemm(B, x, M, N, K) : fast(B, x, M, N, K, Int8Path::best);
      int bad = 0;
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          double want = 0.0, mag = 0.0;
          for (std::int64_t k = 0; k < K; ++k) {
            want += static_cast<double>(W[n * K + k]) * xq[static_cast<std::size_t>(m * K + k)];
            mag += std::fabs(static_cast<double>(W[n * K + k]) * xq[static_cast<std::size_t>(m * K + k)]);
          }
          const float got = y[static_cast<std::size_t>(m * N + n)];
          if (!(std::fabs(got - want) <= 1e-5 * mag) && bad++ < 3)
            ADD_FAILURE() << T::kName << " M " << M << " (" << m << ", " << n << "): fast " << got
                          << ", W times A's quantized rows " << want;
        }
    }
  });
}

// The panel kernel against the decode kernel's portable steps (the same real arithmetic in
// another order): to f32 rounding of the terms, non-finite where it is, on ggml's blocks,
// random bytes (N = 13: one ragged panel) and 11 32-blocks (K not a multiple of 64).
TEST(GgmlInt8, PanelKernelAgreesWithTheDecodeKernel) {
  if (!panels()) GTEST_SKIP() << "no AVX2: more than kInt8MaxRows rows run exactly";
  std::mt19937 rng(9);
  for_each_type([&](auto type) {
    using T = typename decltype(type)::Block;
    const GgufTensorInfo* q = blocks().find(std::string(T::kName) + ".q");
    ASSERT_NE(q, nullptr);
    for (const Case& c : cases_of<T>(*q, rng)) {
      const kernels::WeightMatrix B = matrix(type.element, c.bytes.data(), c.ld);
      std::vector<float> W(static_cast<std::size_t>(c.N * c.K));
      kernels::dequantize_rows(B, 0, c.N, c.K, W.data());
      // AVX512-VNNI's tiles of 12, 8 and 4 rows (M 5: an 8; 14: a 12 and a 4), AVX2's of 4.
      for (const std::int64_t M : {std::int64_t{5}, std::int64_t{9}, std::int64_t{14}, std::int64_t{22}}) {
        const auto x = inputs(M, c.K, 17 + static_cast<std::uint32_t>(M));
        const auto want = fast(B, x, M, c.N, c.K, Int8Path::portable);
        std::vector<std::vector<float>> widths;  // each panel path's
        for (const Int8Path path : panel_paths()) widths.push_back(panel(B, x, M, c.N, c.K, path));
        // gemm_nt's too where it takes the panel kernel for M rows (with AVX2 alone, 5 take the row kernel).
        if (M > row_kernel_max_rows(B, c.K)) widths.push_back(fast_gemm(B, x, M, c.N, c.K));
        for (std::size_t w = 1; w < widths.size(); ++w) {
          int bad = 0;
          for (std::size_t i = 0; i < want.size(); ++i)
            if (!same_bits(widths[w][i], widths[0][i]) && bad++ < 3)
              ADD_FAILURE() << T::kName << " " << c.what << " M " << M << " [" << i << "]: " << widths[w][i]
                            << " against the AVX2 panel's " << widths[0][i];
        }
        const auto& got = widths[0];
        int bad = 0;
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < c.N; ++n) {
            const std::size_t i = static_cast<std::size_t>(m * c.N + n);
            double mag = 0.0;
            for (std::int64_t k = 0; k < c.K; ++k)
              mag += std::fabs(static_cast<double>(W[n * c.K + k]) * x[m * c.K + k]);
            // Past f32's range (MXFP4's scales reach 2^127) the order of the sums decides between
            // ±Inf, NaN and a value near the limit: both must be there.
            const auto huge = [](float v) { return !std::isfinite(v) || std::fabs(v) > 1e30f; };
            const bool ok = std::isfinite(want[i]) && std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) <= 1e-5 * mag
                                                                            : huge(got[i]) && huge(want[i]);
            if (!ok && bad++ < 3)
              ADD_FAILURE() << T::kName << " " << c.what << " M " << M << " (" << m << ", " << n << "): panel "
                            << got[i] << ", decode kernel " << want[i];
          }
      }
    }
  });
}

// The panel kernel's output rows as store() writes an element: times the row's scale, added to
// what C holds when it accumulates, only the N columns of each row (C's rows are wider), the same
// bits as the plain result scaled and added after; N = 37: two full panels and a ragged one.
TEST(GgmlInt8, PanelKernelScalesAndAccumulatesItsRows) {
  if (panel_paths().empty()) GTEST_SKIP() << "no panel kernel on this CPU";
  std::mt19937 rng(53);
  const std::int64_t M = 11, N = 37, K = 512, ldc = N + 5;
  std::vector<float> scale(static_cast<std::size_t>(M)), before(static_cast<std::size_t>(M * ldc));
  for (auto& v : scale) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  for (auto& v : before) v = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
  for_each_type([&](auto type) {
    using T = typename decltype(type)::Block;
    const std::int64_t ld = K / T::kBlock * T::kBytes;
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(N * ld));
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng() & 0x3F);  // finite scales
    const kernels::WeightMatrix B = matrix(type.element, bytes.data(), ld);
    const auto x = inputs(M, K, 59);
    for (const Int8Path path : panel_paths()) {
      const auto plain = panel(B, x, M, N, K, path);
      std::vector<float> y = before;
      kernels::detail::gemm_nt_int8_many(kernels::RowSource{x.data(), K}, B,
                                         kernels::Output{y.data(), ldc, scale.data(), true}, M, N, K,
                                         kernels::Threads::pool, path);
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < ldc; ++n) {
          const std::size_t i = static_cast<std::size_t>(m * ldc + n);
          const float want = n < N ? before[i] + plain[static_cast<std::size_t>(m * N + n)] * scale[m] : before[i];
          ASSERT_TRUE(same_bits(y[i], want)) << T::kName << " " << kernels::int8_path_name(path) << " (" << m << ", "
                                             << n << "): " << y[i] << " against " << want;
        }
    }
  });
}

// Every path, the same bits: ggml's blocks, random bytes, and (32-blocks) K = 11 blocks, whose
// last chunk of eight holds three.
TEST(GgmlInt8, EveryPathGivesTheSameBits) {
  std::mt19937 rng(5);
  for_each_type([&](auto type) {
    using T = typename decltype(type)::Block;
    const GgufTensorInfo* q = blocks().find(std::string(T::kName) + ".q");
    ASSERT_NE(q, nullptr);
    for (const Case& c : cases_of<T>(*q, rng)) {
      const kernels::WeightMatrix B = matrix(type.element, c.bytes.data(), c.ld);
      for (const std::int64_t M : {std::int64_t{1}, std::int64_t{2}, std::int64_t{5}}) {
        const auto x = inputs(M, c.K, 3 + static_cast<std::uint32_t>(M));
        const auto want = fast(B, x, M, c.N, c.K, Int8Path::portable);
        for (const Int8Path path : {Int8Path::avx2, Int8Path::avx512vnni, Int8Path::best}) {
          if (!kernels::int8_path_supported(path)) continue;
          const auto got = fast(B, x, M, c.N, c.K, path);
          int bad = 0;
          for (std::size_t i = 0; i < got.size(); ++i)
            if (!same_bits(got[i], want[i]) && bad++ < 3)
              ADD_FAILURE() << T::kName << " " << c.what << " M " << M << " path " << kernels::int8_path_name(path)
                            << " [" << i << "]: " << got[i] << ", portable " << want[i];
        }
      }
    }
  });
}

#if defined(__linux__)
// Every kernel reads only the matrix's bytes: a matrix ending where an inaccessible page starts
// (as a tensor at the end of a mapped file would) runs without a fault, in the row kernel and in
// the panel kernel (whose 16-row panels and gathers pass the last row), each type.
TEST(GgmlInt8, ReadsNoBytePastTheMatrix) {
  const long page = sysconf(_SC_PAGESIZE);
  for_each_type([&](auto type) {
    using T = typename decltype(type)::Block;
    const std::int64_t N = 19, K = 512, ld = K / T::kBlock * T::kBytes, bytes = N * ld;
    const std::size_t span = static_cast<std::size_t>((bytes + page - 1) / page * page + page);
    void* map = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    auto* guard = static_cast<std::uint8_t*>(map) + span - page;
    ASSERT_EQ(mprotect(guard, static_cast<std::size_t>(page), PROT_NONE), 0);
    std::uint8_t* data = guard - bytes;
    std::mt19937 rng(23);
    for (std::int64_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(rng() & 0x3F);  // finite scales
    const kernels::WeightMatrix B = matrix(type.element, data, ld);
    for (const std::int64_t M : {std::int64_t{1}, std::int64_t{9}}) {
      if (M == 1 && !T::kInt8) continue;
      const auto x = inputs(M, K, 31);
      const auto y = fast_gemm(B, x, M, N, K);
      for (const float v : y) EXPECT_TRUE(std::isfinite(v)) << T::kName << " M " << M;
      if (M == 1) continue;
      for (const Int8Path path : panel_paths())
        for (const float v : panel(B, x, M, N, K, path)) EXPECT_TRUE(std::isfinite(v)) << T::kName;
    }
    munmap(map, span);
  });
}

// Inside a ReuseQuantizedRows scope the panel kernel quantizes the same rows once for several
// matrices (an expert's up and gate) with the same bits as without; rows whose values changed
// between scopes, or another M, are quantized again.
TEST(GgmlInt8, ReusedRowsGiveTheSameBits) {
  if (!panels()) GTEST_SKIP() << "no AVX2: more than kInt8MaxRows rows run exactly";
  std::mt19937 rng(47);
  for_each_type([&](auto type) {
    using T = typename decltype(type)::Block;
    const std::int64_t N = 21, K = 512, ld = K / T::kBlock * T::kBytes;
    std::vector<std::uint8_t> b1(static_cast<std::size_t>(N * ld)), b2(b1.size());
    for (auto& v : b1) v = static_cast<std::uint8_t>(rng() & 0x3F);  // finite scales
    for (auto& v : b2) v = static_cast<std::uint8_t>(rng() & 0x3F);
    const kernels::WeightMatrix B1 = matrix(type.element, b1.data(), ld), B2 = matrix(type.element, b2.data(), ld);
    auto x = inputs(13, K, 53);
    std::vector<float> x_new(x);
    for (auto& v : x_new) v = -2.0f * v;
    const auto want1 = fast_gemm(B1, x, 13, N, K), want2 = fast_gemm(B2, x, 13, N, K);
    const auto want9 = fast_gemm(B2, x, 9, N, K), want_new = fast_gemm(B2, x_new, 13, N, K);
    const auto same = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      int bad = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        if (!same_bits(got[i], want[i]) && bad++ < 3)
          ADD_FAILURE() << T::kName << " " << what << " [" << i << "]: " << got[i] << ", want " << want[i];
    };
    {
      const kernels::ReuseQuantizedRows once;
      same(fast_gemm(B1, x, 13, N, K), want1, "first matrix");
      same(fast_gemm(B2, x, 13, N, K), want2, "second matrix, the rows taken again");
      same(fast_gemm(B2, x, 9, N, K), want9, "fewer rows");
      same(fast_gemm(B2, x, 13, N, K), want2, "the rows again");
    }
    x = x_new;  // new values at the same address, the last call's rows
    const kernels::ReuseQuantizedRows again;
    same(fast_gemm(B2, x, 13, N, K), want_new, "a new scope after the values changed");
  });
}

// Rows of B so far apart that 15 row strides overflow the int32 offsets of the direct pack's
// gathers (q4_K's and q6_K's scales for 16 rows at once): the pack takes its terms through the
// stage instead, with the same bits as the same rows side by side. The rows sit 144 MB apart in a
// reserved, mostly untouched mapping.
TEST(GgmlInt8, PanelKernelTakesRowsFarApart) {
  if (panel_paths().empty()) GTEST_SKIP() << "no panel kernel on this CPU";
  // Its claim is the width of the row offsets; the panels' threads are the other tests' (under
  // ThreadSanitizer, copying into 13 rows 144 MiB apart took 35 s of shadow memory).
  if (testing::kThreadSanitizer) GTEST_SKIP() << "ThreadSanitizer: a claim about offsets, not threads";
  const std::int64_t stride = std::int64_t{144} << 20, N = 13, K = 1024;  // a ragged panel
  const std::size_t span = static_cast<std::size_t>(stride * N);
  void* map = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  std::mt19937 rng(43);
  for_each_type([&](auto type) {
    using T = typename decltype(type)::Block;
    const std::int64_t ld = K / T::kBlock * T::kBytes;
    std::vector<std::uint8_t> rows(static_cast<std::size_t>(N * ld));
    for (auto& b : rows) b = static_cast<std::uint8_t>(rng() & 0x3F);  // finite scales
    auto* far = static_cast<std::uint8_t*>(map);
    for (std::int64_t n = 0; n < N; ++n)
      std::memcpy(far + n * stride, rows.data() + n * ld, static_cast<std::size_t>(ld));
    const kernels::WeightMatrix near = matrix(type.element, rows.data(), ld), apart = matrix(type.element, far, stride);
    const auto x = inputs(9, K, 41);
    for (const Int8Path path : panel_paths()) {
      const auto got = panel(apart, x, 9, N, K, path);  // first: no panel of these rows is left over
      const auto want = panel(near, x, 9, N, K, path);
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_TRUE(same_bits(got[i], want[i])) << T::kName << " " << kernels::int8_path_name(path) << " [" << i
                                                << "]: " << got[i] << " against " << want[i];
    }
  });
  munmap(map, span);
}
#endif

TEST(GgmlInt8, GemmNtTakesTheFastModeForFewRowsAndNaNStaysInItsRow) {
  const GgufTensorInfo* q = blocks().find("q4_K.q");
  ASSERT_NE(q, nullptr);
  const std::int64_t K = q->ne[0], N = q->ne[1];
  const kernels::WeightMatrix B = matrix(Element::q4_k, q->data, K / 256 * 144);
  for (const std::int64_t M : {std::int64_t{2}, std::int64_t{5}, kernels::kInt8MaxRows + 1}) {
    auto x = inputs(M, K, 21);
    x[static_cast<std::size_t>(K + 5)] = std::nanf("");  // row 1
    std::vector<float> y(static_cast<std::size_t>(M * N)), exact(y.size());
    kernels::gemm_nt(kernels::RowSource{x.data(), K}, B, kernels::Output{y.data(), N}, M, N, K, kernels::Threads::pool,
                     ComputeMode::int8);
    kernels::gemm_nt(kernels::RowSource{x.data(), K}, B, kernels::Output{exact.data(), N}, M, N, K);
    const auto kernel = fast(B, x, M, N, K, Int8Path::best);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        const std::size_t i = static_cast<std::size_t>(m * N + n);
        EXPECT_EQ(std::isnan(y[i]), m == 1) << m << ", " << n;
        if (M <= row_kernel_max_rows(B, K)) {
          EXPECT_TRUE(same_bits(y[i], kernel[i])) << M << ": " << m << ", " << n;
        } else if (!panels()) {
          EXPECT_TRUE(same_bits(y[i], exact[i])) << M << ": " << m << ", " << n;
        } else if (m != 1) {
          EXPECT_NE(y[i], exact[i]) << "the panel kernel, not the exact mode: " << m << ", " << n;
        }
      }
  }
}

}  // namespace
}  // namespace moekit
