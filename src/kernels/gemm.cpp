// GEMM drivers: split C over the thread pool and call the single-threaded micro-kernels.
//
// Work is split over rows or columns of C only, never over the reduction dimension, and every
// kernel computes an element the same way wherever its tile starts, so the split (and so the
// thread count) never changes a bit.
#include "kernels/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/amx.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/plan.hpp"
#include "moekit/threading.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit::kernels {

namespace {

// Columns are handed out in blocks of 64 so a thread's share is whole register tiles on every
// target (AVX-512's widest tile is 4 × 16 lanes) and whole weight panels.
constexpr std::int64_t kColumnBlock = 64;

// Splits C[M, N] over the pool along its larger side; `run(m0, m1, n0, n1)` computes a block.
// `one_share`: columns go in one contiguous share per thread instead of a few — for a kernel that
// prepares all of A's rows on every call (the panels kernel packs them), so each thread does it once.
template <typename Run>
void split_c(std::int64_t M, std::int64_t N, std::int64_t row_grain, Threads threads, const Run& run,
             bool one_share = false) {
  if (M <= 0 || N <= 0) return;
  if (threads == Threads::caller) return run(0, M, 0, N);
  if (M >= N) {
    moekit::detail::parallel_for(M, row_grain, [&](std::int64_t m0, std::int64_t m1) { run(m0, m1, 0, N); });
    return;
  }
  const std::int64_t blocks = (N + kColumnBlock - 1) / kColumnBlock;
  const auto columns = [&](std::int64_t b0, std::int64_t b1) {
    run(0, M, b0 * kColumnBlock, std::min(N, b1 * kColumnBlock));
  };
  if (one_share) {
    const std::int64_t shares = std::min<std::int64_t>(blocks, moekit::num_threads());
    moekit::detail::parallel_tasks(shares, [&](std::int64_t s) { columns(s * blocks / shares, (s + 1) * blocks / shares); });
  } else {
    moekit::detail::parallel_for(blocks, 1, columns);
  }
}

Output block_of(const Output& C, std::int64_t m0, std::int64_t n0) {
  Output c = C;
  c.data += m0 * C.ld + n0;
  if (c.row_scale) c.row_scale += m0;
  return c;
}

// Rows [first, ...) of an [N, K] weight matrix; in panels `first` is a multiple of kPanelRows.
WeightMatrix rows_of(const WeightMatrix& B, std::int64_t first, std::int64_t K) {
  WeightMatrix b = B;
  // k = 0: the row's start in any layout; a quantized format's rows hold `ld` container elements.
  b.data = static_cast<const char*>(B.data) +
           weight_offset(B.layout, first, 0, K, B.ld) * static_cast<std::int64_t>(dtype_size(B.dtype));
  if (B.quantized() && B.scales != nullptr) {  // (ggml's blocks carry their scales)
    // The scale row holding row `first`, and where `first` lies in its block.
    const std::int64_t at = B.row_phase + first;
    b.row_phase = at % B.format.block_rows;
    const std::int64_t step =
        at / B.format.block_rows * B.scale_ld * static_cast<std::int64_t>(dtype_size(B.format.scale_dtype));
    b.scales = static_cast<const char*>(B.scales) + step;
    if (B.biases) b.biases = static_cast<const char*>(B.biases) + step;
  }
  return b;
}

WeightMatrix columns_of(const WeightMatrix& B, std::int64_t first) {
  WeightMatrix b = B;
  b.data = static_cast<const char*>(B.data) + first * static_cast<std::int64_t>(dtype_size(B.dtype));
  return b;
}

// The full column count of a panel-packed gemm_nn operand: its ld, or N when unset.
std::int64_t N_total(const WeightMatrix& B, std::int64_t N) { return B.ld > 0 ? B.ld : N; }

RowSource columns_of(const RowSource& A, std::int64_t first) {
  RowSource a = A;
  a.data += first;
  return a;
}

// Rows of A that would share L1 sets are copied first. Gathered rows are rows of x, D · 4 bytes
// apart: a multiple of 4 KB at every reference shape, so a tile's 6 or 12 rows of A (and the
// weight rows of the dot-product tiles) all map to one set of the 8-way L1 and evict each other
// at every cache line. Such rows (gathered, or 2 KB-multiples apart; 2 or more rows of K ≥ 64) are
// copied, unscaled, into a per-thread buffer (a thread_local vector that grows to the largest
// chunk) whose stride is one cache line past whole lines, at most 1 MB of rows at a time (or
// one 12-row tile, if that is more), and the kernel runs on the copy: the same values, so the
// same bits (the gain: docs/performance.md). gemm_nt's rows-layout kernels (float, exact affine)
// run through this; the panels kernel packs its own copy (gemm_panel.cpp).
template <typename Run>
void with_staggered_rows(const RowSource& A, std::int64_t M, std::int64_t K, const Run& run) {
  const bool aliased = A.index != nullptr || (A.ld * static_cast<std::int64_t>(sizeof(float))) % 2048 == 0;
  if (M < 2 || K < 64 || !aliased) return run(A, 0, M);
  const std::int64_t ld = (K + 15) / 16 * 16 + 16;
  // All rows at once when they fit 1 MB (the weights then stream once); else whole 12-row tiles.
  constexpr std::int64_t kBudget = std::int64_t{1} << 18;  // floats
  const std::int64_t chunk = M * ld <= kBudget ? M : std::max<std::int64_t>(12, kBudget / ld / 12 * 12);
  thread_local std::vector<float> buf;
  const std::size_t need = static_cast<std::size_t>(std::min(M, chunk) * ld);
  if (buf.size() < need) buf.resize(need);
  for (std::int64_t m0 = 0; m0 < M; m0 += chunk) {
    const std::int64_t m1 = std::min(M, m0 + chunk);
    for (std::int64_t i = m0; i < m1; ++i)
      std::memcpy(buf.data() + (i - m0) * ld, A.row(i), static_cast<std::size_t>(K) * sizeof(float));
    run(RowSource{buf.data(), ld, nullptr, A.scale ? A.scale + m0 : nullptr}, m0, m1);
  }
}

// The weights a kernel family handles, else a named error (never a silent read of other bytes as
// f32): plain f32 / bf16 / f16 in any layout, and — where `quantized_ok` — a quantized format of
// the list (kernels/formats/table.hpp) in rows layout.
void check_weights(const char* fn, const WeightMatrix& B, bool quantized_ok) {
  if (!B.quantized()) {
    if (is_float(B.dtype)) return;
    throw std::invalid_argument(MOEKIT_MSG("[moekit::kernels::" << fn << "] plain weights of dtype "
                                                                << dtype_name(B.dtype)
                                                                << " (expected f32, bf16 or f16)"));
  }
  if (!formats::known(B.format.element))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::kernels::" << fn << "] unknown weight format (element "
                                                                << static_cast<int>(B.format.element) << ")"));
  if (!quantized_ok || B.layout != WeightLayout::rows)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::kernels::" << fn << "] does not compute on "
                                                                << formats::describe(B.format, B.dtype)
                                                                << " weights (decode them first)"));
}

}  // namespace

namespace {
template <typename T>
void pack_typed(const T* src, std::int64_t ld, std::int64_t N, std::int64_t K, T* dst) {
  for (std::int64_t p = 0; p * kPanelRows < N; ++p) {
    T* panel = dst + p * kPanelRows * K;
    const std::int64_t rows = std::min(kPanelRows, N - p * kPanelRows);
    for (std::int64_t r = 0; r < kPanelRows; ++r) {
      const T* row = src + (p * kPanelRows + r) * ld;
      if (r < rows) {
        for (std::int64_t k = 0; k < K; ++k) panel[k * kPanelRows + r] = row[k];
      } else {
        for (std::int64_t k = 0; k < K; ++k) panel[k * kPanelRows + r] = T{0};
      }
    }
  }
}
}  // namespace

void pack_panels(const WeightMatrix& B, std::int64_t N, std::int64_t K, void* dst) {
  check_weights("pack_panels", B, false);
  // Bit patterns are moved, never converted: 2-byte dtypes as uint16, f32 as uint32.
  if (dtype_size(B.dtype) == 2) {
    pack_typed(static_cast<const std::uint16_t*>(B.data), B.ld, N, K, static_cast<std::uint16_t*>(dst));
  } else {
    pack_typed(static_cast<const std::uint32_t*>(B.data), B.ld, N, K, static_cast<std::uint32_t*>(dst));
  }
}

void pack_amx_tiles(const WeightMatrix& B, std::int64_t N, std::int64_t K, void* dst) {
  auto* out = static_cast<std::uint16_t*>(dst);
  const auto* src = static_cast<const std::uint16_t*>(B.data);
  std::memset(out, 0, static_cast<std::size_t>(amx_tile_elements(N, K)) * sizeof(std::uint16_t));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k0 = 0; k0 < K; k0 += 32)
      std::memcpy(out + weight_offset(WeightLayout::amx_tiles, n, k0, K, 0), src + n * B.ld + k0,
                  static_cast<std::size_t>(std::min<std::int64_t>(32, K - k0)) * sizeof(std::uint16_t));
}

void gemm_nt(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N, std::int64_t K,
             Threads threads, ComputeMode mode) {
  check_weights("gemm_nt", B, true);
  if (M <= 0 || N <= 0) return;
  // The plan is made for the whole call, never for a thread's share of its rows.
  const KernelPlan plan = plan_gemm_nt(B, mode == ComputeMode::bf16 ? ComputeMode::exact : mode, M, K);
  const Kernel kernel = plan.kernel;
  // The many-row int8 kernels quantize the rows once and split in whole panels or tiles.
  if (kernel == Kernel::int8_panels || kernel == Kernel::int8_amx)
    return detail::gemm_nt_int8_many(A, B, C, M, N, K, threads, plan.int8);
  split_c(
      M, N, 12, threads,
      [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
        const RowSource a = A.from(m0);
        const WeightMatrix b = rows_of(B, n0, K);
        switch (kernel) {
          case Kernel::int8_rows:
            return detail::gemm_nt_affine_int8_kernel(a, b, block_of(C, m0, n0), m1 - m0, n1 - n0, K, plan.int8);
          case Kernel::outer:  // packs A's rows itself (its own copy serves as the staggered one)
            return detail::gemm_nt_panel_kernel(a, b, block_of(C, m0, n0), m1 - m0, n1 - n0, K);
          default:
            break;
        }
        with_staggered_rows(a, m1 - m0, K, [&](const RowSource& s, std::int64_t r0, std::int64_t r1) {
          if (kernel == Kernel::dot) return detail::gemm_nt_kernel(s, b, block_of(C, m0 + r0, n0), r1 - r0, n1 - n0, K);
          detail::gemm_nt_quant_kernel(s, b, block_of(C, m0 + r0, n0), r1 - r0, n1 - n0, K,
                                       kernel == Kernel::quant_fused);
        });
      },
      kernel == Kernel::outer);
}

namespace {

// Rows of a quantized B decoded per thread, a block at a time, for the bf16 compute mode.
constexpr std::int64_t kDecodedRows = 32;

// Rows [n0, n0 + rows) of B (decode_dtype bf16: each weight already a bf16 value) as a bf16 rows
// matrix in this thread's scratch, valid until its next call.
WeightMatrix decoded_bf16(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K) {
  thread_local std::vector<std::uint16_t> scratch;
  scratch.resize(static_cast<std::size_t>(rows * K));
  dequantize_rows_bf16(B, n0, rows, K, scratch.data());
  return WeightMatrix{scratch.data(), DType::bf16, K};
}

// gemm_nt_bf16 on quantized weights (FP8): every weight decoded exactly as the format's reference
// decodes it and rounded to bf16 (what a framework does when it runs an FP8 release in bf16),
// then multiplied as a bf16 weight: on f32_fma by the exact kernel on the rounded decode, on
// avx512bf16 and amx by their kernels on blocks of kDecodedRows decoded rows — the same values
// on every path, and each path's bits those of its kernel on the decoded bf16 matrix.
void gemm_nt_bf16_decoded(const Bf16Activations& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                          std::int64_t N, std::int64_t K, Threads threads) {
  WeightMatrix R = B;
  R.format.decode_dtype = DType::bf16;
  if (A.path == Bf16Path::f32_fma) return gemm_nt({static_cast<const float*>(A.data), A.ld}, R, C, M, N, K, threads);
  if (M <= 0 || N <= 0) return;
  // Columns [n0, n1) of C for rows [m0, m1), a decoded block at a time.
  const auto blocks = [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1, const auto& kernel) {
    for (std::int64_t n = n0; n < n1; n += kDecodedRows) {
      const std::int64_t rows = std::min(kDecodedRows, n1 - n);
      kernel(decoded_bf16(R, n, rows, K), block_of(C, m0, n), m1 - m0, rows);
    }
  };
  if (A.path == Bf16Path::amx) {
    const std::int64_t panels = (M + kAmxRows - 1) / kAmxRows, pairs = (N + 31) / 32;
    split_amx(panels, pairs, threads, [&](std::int64_t p0, std::int64_t p1, std::int64_t q0, std::int64_t q1) {
      const std::int64_t m0 = p0 * kAmxRows, m1 = std::min(M, p1 * kAmxRows);
      Bf16Activations a = A;
      a.data = static_cast<const std::uint16_t*>(A.data) + p0 * kAmxRows * A.ld;
      blocks(m0, m1, q0 * 32, std::min(N, q1 * 32),
             [&](const WeightMatrix& w, const Output& c, std::int64_t rows_m, std::int64_t rows_n) {
               detail::gemm_nt_bf16_amx(a, w, c, rows_m, rows_n, K);
             });
    });
    return;
  }
  const Bf16Rows rows{static_cast<const std::uint16_t*>(A.data), A.ld};
  split_c(M, N, 12, threads, [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    blocks(m0, m1, n0, n1, [&](const WeightMatrix& w, const Output& c, std::int64_t rows_m, std::int64_t rows_n) {
      detail::gemm_nt_bf16_avx512(rows.from(m0), w, c, rows_m, rows_n, K);
    });
  });
}

}  // namespace

void gemm_nt_bf16(const Bf16Activations& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                  std::int64_t K, Threads threads) {
  check_weights("gemm_nt_bf16", B, B.quantized() && B.format.element == Element::e4m3);
  if (B.quantized()) return gemm_nt_bf16_decoded(A, B, C, M, N, K, threads);
  if (A.path == Bf16Path::f32_fma) return gemm_nt({static_cast<const float*>(A.data), A.ld}, B, C, M, N, K, threads);
  if (A.path == Bf16Path::amx) {
    // Split in whole pairs of activation panels (kAmxRows rows each, the packed form's unit) or
    // in pairs of weight tiles (32 columns), whichever has more (kernels/amx.hpp).
    const std::int64_t panels = (M + kAmxRows - 1) / kAmxRows, pairs = (N + 31) / 32;
    const auto run = [&](std::int64_t p0, std::int64_t p1, std::int64_t q0, std::int64_t q1) {
      const std::int64_t m0 = p0 * kAmxRows, m1 = std::min(M, p1 * kAmxRows);
      const std::int64_t n0 = q0 * 32, n1 = std::min(N, q1 * 32);
      Bf16Activations a = A;
      a.data = static_cast<const std::uint16_t*>(A.data) + p0 * kAmxRows * A.ld;
      detail::gemm_nt_bf16_amx(a, rows_of(B, n0, K), block_of(C, m0, n0), m1 - m0, n1 - n0, K);
    };
    if (M <= 0 || N <= 0) return;
    split_amx(panels, pairs, threads, run);
    return;
  }
  const Bf16Rows rows{static_cast<const std::uint16_t*>(A.data), A.ld};
  split_c(M, N, 12, threads, [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    detail::gemm_nt_bf16_avx512(rows.from(m0), rows_of(B, n0, K), block_of(C, m0, n0), m1 - m0, n1 - n0, K);
  });
}

void gemm_nn(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K, Threads threads) {
  check_weights("gemm_nn", B, false);
  split_c(M, N, 12, threads, [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    if (B.layout == WeightLayout::panels) {
      // Column n0 of a panel-packed [K, N]: its 16 k of panel 0 start at n0 · 16.
      WeightMatrix b = B;
      b.data = static_cast<const char*>(B.data) + n0 * kPanelRows * static_cast<std::int64_t>(dtype_size(B.dtype));
      detail::gemm_nn_panel_kernel(A.from(m0), b, block_of(C, m0, n0), m1 - m0, n1 - n0, K, N_total(B, N));
    } else {
      detail::gemm_nn_kernel(A.from(m0), columns_of(B, n0), block_of(C, m0, n0), m1 - m0, n1 - n0, K);
    }
  });
}

void gemm_tn(const RowSource& A, const RowSource& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K, Threads threads) {
  split_c(M, N, 12, threads, [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    detail::gemm_tn_kernel(columns_of(A, m0), columns_of(B, n0), block_of(C, m0, n0), m1 - m0, n1 - n0, K);
  });
}

}  // namespace moekit::kernels
