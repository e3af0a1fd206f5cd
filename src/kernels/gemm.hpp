// The GEMM kernel layer: every matrix product of the MoE block, forward and backward.
// Internal. Kernels validate nothing (callers do) and throw nothing but std::bad_alloc — except
// that a driver given weights its kernels do not handle (a dtype or format, kernels/formats/)
// throws std::invalid_argument naming them instead of reading the bytes as f32. Besides
// fixed-size stack tiles, some keep per-thread scratch (`thread_local` vectors: staggered or
// packed activation rows, gemm_nn's partial sums, unpacked codes, dequantized weight blocks, int8
// activations) that grows to the largest call a thread has made and is reused after;
// docs/architecture.md ("Memory") bounds it.
//
//   gemm_nt  C[M, N] (+)= A[M, K] · B[N, K]ᵀ   forward: x · Wᵀ with W stored [out, in]
//   gemm_nn  C[M, N] (+)= A[M, K] · B[K, N]    backward data: dx = dh · W
//   gemm_tn  C[M, N] (+)= A[K, M]ᵀ · B[K, N]   backward weights: dW = dhᵀ · x over one expert's rows
//
// A's rows (and, for gemm_tn, B's rows) are read through an optional index list and scaled by
// an optional per-row factor, so the MoE block never gathers the rows it routes into a matrix of
// its own (a kernel may still copy them into its per-thread scratch: staggered, packed or
// quantized). The weight operand is a WeightMatrix in its stored dtype (f32, bf16, f16), widened
// in registers.
// A weight format is a panel layout plus a micro-kernel: the dot-product kernel (gemm_nt.cpp)
// reads [out, in] rows as stored; the outer-product kernel (gemm_outer.cpp) reads rows of B
// along N. Packed quantized formats are added here as further (layout, kernel) pairs.
//
// Determinism: every output element is a sum over the reduction dimension in one fixed order
// that depends only on K and the CPU target (gemm_nt: lane-strided dot product reduced in a
// fixed tree; gemm_nn / gemm_tn: one sequential fused multiply-add chain over k). Drivers split
// work over rows and columns of C, never over K, so any thread count gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "kernels/cpu.hpp"
#include "moekit/compute_mode.hpp"
#include "moekit/tensor.hpp"
#include "moekit/weight_format.hpp"

namespace moekit::kernels {

/// Rows of an f32 operand read in place: logical row i is `data + (index ? index[i] : i) * ld`,
/// multiplied elementwise by `scale[i]` when `scale` is set (the product is rounded to f32 before
/// it enters the dot product, exactly as if the scaled row had been materialised).
struct RowSource {
  const float* data = nullptr;
  std::int64_t ld = 0;
  const std::int32_t* index = nullptr;
  const float* scale = nullptr;

  const float* row(std::int64_t i) const { return data + (index ? static_cast<std::int64_t>(index[i]) : i) * ld; }
  float factor(std::int64_t i) const { return scale ? scale[i] : 1.0f; }
  /// The same source starting at logical row `first`.
  RowSource from(std::int64_t first) const {
    RowSource r = *this;
    if (index) {
      r.index += first;
    } else {
      r.data += first * ld;
    }
    if (scale) r.scale += first;
    return r;
  }
};

/// Rows of a bf16 operand (the bf16 compute mode's activations) read in place: logical row i is
/// `data + (index ? index[i] : i) * ld`. No scale: a scaled row is rounded to bf16 by its producer.
struct Bf16Rows {
  const std::uint16_t* data = nullptr;
  std::int64_t ld = 0;
  const std::int32_t* index = nullptr;

  const std::uint16_t* row(std::int64_t i) const {
    return data + (index ? static_cast<std::int64_t>(index[i]) : i) * ld;
  }
  float factor(std::int64_t) const { return 1.0f; }
  Bf16Rows from(std::int64_t first) const {
    Bf16Rows r = *this;
    if (index) {
      r.index += first;
    } else {
      r.data += first * ld;
    }
    return r;
  }
};

/// How a weight matrix [N, K] (out, in) is laid out in memory.
///  rows:   row-major as stored in a checkpoint, `ld` elements between rows (read in place).
///  panels: repacked for the outer-product forward kernel: ceil(N / kPanelRows) panels, each
///          [K, kPanelRows] (element (n, k) at (n / 16)·16·K + k·16 + n % 16), rows past N zero.
///          Same dtype as the source: a bf16 model stays bf16. `ld` is unused.
///  amx_tiles: bf16 only, for the bf16 compute mode's AMX path (gemm_nt_bf16): ceil(N / 16)
///          blocks of 16 rows, each ceil(K / 32) tiles of 16 rows × 32 k — one `tdpbf16ps`
///          operand, 1 KB, loaded as one contiguous block — element (n, k) at
///          (n / 16)·16·Kp + (k / 32)·512 + (n % 16)·32 + k % 32, Kp = amx_padded_k(K); rows past
///          N and k past K zero. The same values as rows, so the same bits. `ld` is unused.
enum class WeightLayout { rows, panels, amx_tiles };
constexpr std::int64_t kPanelRows = 16;
inline std::int64_t amx_padded_k(std::int64_t K) { return (K + 31) / 32 * 32; }

/// A weight matrix [N, K] as stored (one expert's slice of an ExpertMatrix): a plain float matrix
/// (dtype f32, bf16 or f16) in one of the layouts above, or a quantized one in rows layout, its
/// container of dtype `format`'s container (formats/table.hpp) with `ld` container elements
/// between rows, and its scales (and biases) at [ceil(N / block_rows), ceil(K / block_cols)],
/// `scale_ld` elements between scale rows; a block shape that does not divide [N, K] leaves
/// ragged edge blocks. The format's rules: src/kernels/formats/.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t ld = 0;
  WeightLayout layout = WeightLayout::rows;
  WeightFormat format{};
  const void* scales = nullptr;
  const void* biases = nullptr;
  std::int64_t scale_ld = 0;
  /// Where row 0 lies in its block of block_rows rows (0 <= row_phase < block_rows): 0 for a
  /// whole matrix; rows_of() sets it for a view that starts inside a block (a thread's share of
  /// a matrix whose scales cover 128 rows, split at 64).
  std::int64_t row_phase = 0;

  bool quantized() const noexcept { return format.quantized(); }
};

/// The index into B.scales (and B.biases) of the block holding weight (n, k).
[[gnu::always_inline]] inline std::int64_t scale_index(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  const std::int64_t r = B.format.block_rows == 1 ? n : (B.row_phase + n) / B.format.block_rows;
  return r * B.scale_ld + k / B.format.block_cols;
}

/// Element i of an f32, bf16, f16, f8_e8m0 or f8_e4m3 array, widened to f32 (scales, biases,
/// scalar paths).
[[gnu::always_inline]] inline float load_f32(const void* base, DType dtype, std::int64_t i) {
  if (dtype == DType::bf16) {  // the top half of an f32, inlined (kernels call this per group)
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(base)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  if (dtype == DType::f16) return f16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
  if (dtype == DType::f8_e8m0) return e8m0_to_f32(static_cast<const std::uint8_t*>(base)[i]);
  if (dtype == DType::f8_e4m3) return e4m3_to_f32(static_cast<const std::uint8_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

/// Decodes rows [n0, n0 + rows) of a quantized [N, K] matrix (any format of kernels/formats/) into
/// dst [rows, K] f32, with exactly the values the kernels multiply by (the format's reference
/// decode: MLX affine w = fma(scale, q, bias), MXFP4 w = e2m1 value × 2^(s − 127)).
void dequantize_rows(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, float* dst);

/// dequantize_rows for B whose decode gives bf16 values (decode_dtype bf16), stored as bf16 bits
/// (exact); FP8 decodes straight to them.
void dequantize_rows_bf16(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K,
                          std::uint16_t* dst);

/// Elements of the panel layout of an [N, K] matrix (N rounded up to whole panels).
inline std::int64_t panel_elements(std::int64_t N, std::int64_t K) {
  return (N + kPanelRows - 1) / kPanelRows * kPanelRows * K;
}

/// Repacks a rows-layout [N, K] matrix into `dst` (panel_elements(N, K) elements of B.dtype).
void pack_panels(const WeightMatrix& B, std::int64_t N, std::int64_t K, void* dst);

/// Elements of the amx_tiles layout of an [N, K] matrix (whole 16-row blocks, K padded to 32).
inline std::int64_t amx_tile_elements(std::int64_t N, std::int64_t K) {
  return (N + 15) / 16 * 16 * amx_padded_k(K);
}

/// Repacks a rows-layout bf16 [N, K] matrix into `dst` (amx_tile_elements(N, K) bf16 elements).
void pack_amx_tiles(const WeightMatrix& B, std::int64_t N, std::int64_t K, void* dst);

/// Where element (n, k) of an [N, K] matrix in `layout` lies, in elements from its start (`ld`:
/// the rows layout's row stride). Not for quantized matrices.
inline std::int64_t weight_offset(WeightLayout layout, std::int64_t n, std::int64_t k, std::int64_t K,
                                  std::int64_t ld) {
  switch (layout) {
    case WeightLayout::panels: return (n / kPanelRows) * kPanelRows * K + k * kPanelRows + n % kPanelRows;
    case WeightLayout::amx_tiles: return (n / 16) * 16 * amx_padded_k(K) + (k / 32) * 512 + (n % 16) * 32 + k % 32;
    case WeightLayout::rows: break;
  }
  return n * ld + k;
}

/// The f32 output: C[m, n] = data[m * ld + n]. With `row_scale` each row's result is multiplied by
/// row_scale[m] (after the full sum, before it is stored or added); with `accumulate` it is added
/// to what C holds.
struct Output {
  float* data = nullptr;
  std::int64_t ld = 0;
  const float* row_scale = nullptr;
  bool accumulate = false;
  /// Kernel-internal, set by gemm_tn (callers leave it false): whole aligned vectors go out with
  /// non-temporal stores, for a large result that is not read back soon (a weight gradient).
  bool stream = false;
};

/// Whether a driver may use the thread pool or must stay on the calling thread (for callers
/// that already parallelise at a coarser level).
enum class Threads { pool, caller };

/// C[M, N] (+)= A[M, K] · B[N, K]ᵀ, with the kernel plan_gemm_nt (kernels/plan.hpp) picks for
/// `mode` (exact or int8; the bf16 mode's products are gemm_nt_bf16's). Preconditions (not checked): M, N, K >= 0; rows
/// hold K elements; B.dtype in {f32, bf16, f16}, or B quantized (rows layout) with K a multiple of its group size. B in
/// rows layout runs the dot-product kernel (each element a lane-strided dot product); B in panels runs the
/// outer-product kernel (each element one sequential FMA chain over k, as gemm_nn): the layout, fixed when the weights
/// are loaded, decides the summation order — never M, the batch or the thread count. A quantized B runs the dot-product
/// kernel's order on its decoded values: for few rows of A decoded in registers from the stored stream (the format's
/// view, dot-inl.h), for many rows decoded a block of B at a time into a cache-resident scratch
/// that every row of A reuses; either way the result equals gemm_nt on the materialised decoded
/// matrix in rows layout, bit for bit. In the int8 mode, where plan_gemm_nt takes it, the
/// activations are quantized to int8 per group and multiplied with the codes as integers (error
/// bound: docs/numerics.md).
void gemm_nt(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N, std::int64_t K,
             Threads threads = Threads::pool, ComputeMode mode = ComputeMode::exact);

/// C[M, N] (+)= A[M, K] · B[K, N]. B is a weight matrix (dx = dh · W with W [out, in]: K = out,
/// N = in). In rows layout: the outer-product kernel reading B in place (one FMA chain per
/// element). In panels (the forward's packing of W, over K = out; B.ld = N): the dot-product
/// kernel reading 16 consecutive k of a panel per column, no packing (lane-strided order, as
/// gemm_nt on rows).
void gemm_nn(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K, Threads threads = Threads::pool);

/// C[M, N] (+)= Σ_{k < K} A(k)[m] · B(k)[n]: A and B are K rows (of at least M and N elements),
/// both gathered and scaled per row k as RowSource says (dW = dhᵀ · x over one expert's rows).
void gemm_tn(const RowSource& A, const RowSource& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K, Threads threads = Threads::pool);

/// The bf16 compute mode's products: activations rounded to bf16, multiplied with bf16 weights
/// (rows layout) as exact bf16 × bf16 products summed in fp32. Two paths, one chosen per CPU:
///  - Bf16Path::f32_fma: the rounded activations are kept as the f32 values they are and run
///    gemm_nt's rows kernel (the weights widened in registers): bit-identical to gemm_nt on the
///    rounded rows.
///  - Bf16Path::avx512bf16: `vdpbf16ps` on bf16 activations. Each C element owns 16 fp32 lanes;
///    lane j takes the pairs k = 32·s + 2j + {1, 0} for s = 0, 1, ... (odd element first), each
///    added by a fused multiply-add that reads denormal inputs as zero and flushes a denormal
///    result to zero (the instruction's fixed DAZ/FTZ); K is padded with zeros to a multiple of
///    32; the 16 lanes are then summed by ref::reduce16's tree.
///  - Bf16Path::amx: AMX tiles (`tdpbf16ps`) on bf16 activations packed in pairs of k
///    (Bf16Activations). K is zero-padded to a multiple of 32 and taken in chunks of 32 in order;
///    per chunk the even-indexed products are added from +0 in k order by fused multiply-adds,
///    the odd-indexed likewise, and the element becomes acc + (even + odd), every step rounded,
///    denormal inputs read as zero and denormal sums flushed (ref::tdpbf16_chunk). The weights are read in place, rows
///    layout: the weight rows are the tile's A operand, the activations its B operand.
/// Each is bit-identical for any thread count and split, and for any M (a row's result does not
/// depend on the other rows of the batch).
/// (Bf16Path itself is in kernels/cpu.hpp.)
///
/// The path on this CPU: cpu_paths().bf16 (kernels/cpu.hpp says how it is chosen), or the one
/// detail::set_bf16_path_for_tests forced.
Bf16Path bf16_path() noexcept;

/// Rounded activations for gemm_nt_bf16 in `path`'s form: rows of K, f32 holding bf16 values
/// (f32_fma) or bf16 (avx512bf16), ld = bf16_activation_ld(K, path); for amx, bf16 in AMX tile panels of
/// kAmxRows rows: element (m, k) at (m / 16)·16·Kp + (k / 2)·32 + (m % 16)·2 + k % 2, with
/// Kp = amx_padded_k(K) = ld, rows past the last and k past K zero.
struct Bf16Activations {
  const void* data = nullptr;
  std::int64_t ld = 0;
  Bf16Path path = Bf16Path::f32_fma;
};

constexpr std::int64_t kAmxRows = 16;

/// The row stride (elements) of round_to_bf16's output on `path`. For f32_fma and avx512bf16:
/// K rounded up to whole 64-byte lines plus one line, so that consecutive rows start in
/// different L1 sets: at a stride that is a multiple of 4 KB (K = 2048 bf16) every row of a
/// 6-row tile and the tile's weight rows would map to the same set of the 8-way L1 and evict
/// each other.
inline std::int64_t bf16_activation_ld(std::int64_t K, Bf16Path path) {
  if (path == Bf16Path::amx) return amx_padded_k(K);
  const std::int64_t line = path == Bf16Path::avx512bf16 ? 32 : 16;  // elements per 64 bytes
  return (K + line - 1) / line * line + line;
}

/// Bytes round_to_bf16 writes for `rows` rows of K on `path`.
inline std::size_t bf16_activation_bytes(std::int64_t rows, std::int64_t K, Bf16Path path) {
  if (path == Bf16Path::amx)
    return static_cast<std::size_t>((rows + kAmxRows - 1) / kAmxRows * kAmxRows * amx_padded_k(K)) * 2;
  return static_cast<std::size_t>(rows * bf16_activation_ld(K, path)) * (path == Bf16Path::avx512bf16 ? 2 : 4);
}

/// rows × K elements of A (gathered and scaled as A says; the scaled product rounded to f32
/// first) rounded to bf16 (to nearest even, as f32_to_bf16: denormals kept, a NaN stays a NaN)
/// into dst, in `path`'s form.
Bf16Activations round_to_bf16(const RowSource& A, std::int64_t rows, std::int64_t K, Bf16Path path, void* dst);

/// C[M, N] (+)= A[M, K] · B[N, K]ᵀ on A's path; B bf16 in rows layout, or in amx_tiles on the amx
/// path (preconditions, unchecked). Both layouts give the same bits. B may also be FP8 (e4m3, any
/// block scales) in rows layout: each weight is decoded as its format's reference decodes it and
/// rounded to bf16 (decode_dtype bf16), a block of rows at a time into per-thread scratch, and
/// multiplied as that bf16 matrix would be — the same bits as gemm_nt_bf16 on the decoded matrix.
void gemm_nt_bf16(const Bf16Activations& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                  std::int64_t N, std::int64_t K, Threads threads = Threads::pool);

/// While one is alive on this thread, the int8 fast mode's many-row path on ggml's block types
/// keeps the rows of A it quantized (and laid out for the panel kernel) and takes them again for
/// the next call on the same rows — the same RowSource pointers, M, K and block type — instead
/// of quantizing them again: an expert's up and gate projections read the same rows. The caller
/// promises that A's values do not change while the scope is open; rows quantized in one scope
/// are never taken in another. Scopes nest.
class ReuseQuantizedRows {
 public:
  ReuseQuantizedRows() noexcept;
  ~ReuseQuantizedRows();
  ReuseQuantizedRows(const ReuseQuantizedRows&) = delete;
  ReuseQuantizedRows& operator=(const ReuseQuantizedRows&) = delete;
};

/// The SIMD target the kernels dispatch to on this CPU ("AVX3", "AVX2", "SSE4", "NEON", ...),
/// for benchmark headers.
const char* simd_target_name();

namespace detail {
// The single-threaded kernels behind the drivers, one per micro-kernel family.
void gemm_nt_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                    std::int64_t K);
void gemm_nt_quant_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                          std::int64_t K, bool in_registers);
void gemm_nt_panel_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                          std::int64_t N, std::int64_t K);
// in_registers: the plan's quant_fused (B decoded in registers; quant_fuses(B, K) must hold),
// else quant_blocks.
// The int8 mode's row kernel (plan.hpp's int8_rows). `path` picks its instruction set (tests,
// benchmarks; best: cpu_paths().int8; amx: the AMX-INT8 kernel on one thread); a path must be
// supported (int8_path_supported). AVX512-VNNI and AVX2 give the same bits for 4-bit codes and
// agree to f32 rounding for 8-bit ones; AMX gives the portable path's bits (whole-group integer
// sums, the same scalar float steps per element).
void gemm_nt_affine_int8_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                std::int64_t N, std::int64_t K, Int8Path path = Int8Path::best);
// The int8 mode's driver for the many-row kernels (plan.hpp's int8_panels and int8_amx):
// ggml's types on the panel kernel (A quantized once, B decoded a panel of 16 rows with
// AVX512-VNNI, 8 with AVX2, at a time, split over the pool in whole panels; `path` avx2 or
// avx512vnni picks the width, where the CPU has it), MLX affine codes on AMX-INT8
// (split in whole 16-row panels or 32-column tile pairs).
void gemm_nt_int8_many(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                       std::int64_t K, Threads threads, Int8Path path = Int8Path::best);
// ggml's block types in the exact mode: rows [n0, n0 + rows) of B decoded into dst [rows, K]
// with ggml's dequantize_row_* values bit for bit, a block's codes unpacked in vectors (the panel
// kernel's unpack) and w = ws · (u − off) + wb per group, the product and the sum each rounded as
// ggml rounds them; 8 weights a step with AVX2, 16 with AVX-512 (`path` avx2 / avx512vnni, as
// the fast mode's: best follows MOEKIT_INT8_PATH). False (nothing written) for the portable path,
// a path the CPU lacks, or B not a ggml type: the caller decodes with the types' scalar Block().
bool ggml_dequant_rows(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, float* dst,
                       Int8Path path = Int8Path::best);
// n_total: the packed matrix's full column count (its panel stride); B.data points at column 0
// of the call's first column.
void gemm_nn_panel_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                          std::int64_t N, std::int64_t K, std::int64_t n_total);
void gemm_nn_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                    std::int64_t K);
void gemm_tn_kernel(const RowSource& A, const RowSource& B, const Output& C, std::int64_t M, std::int64_t N,
                    std::int64_t K);
// gemm_nt_bf16's AVX512-BF16 kernel (single-threaded; only where the CPU has it), and
// round_to_bf16's kernel (as_f32: f32 values out, else bf16 bits), rows `ld` elements apart.
void gemm_nt_bf16_avx512(const Bf16Rows& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                         std::int64_t K);
void round_rows_bf16(const RowSource& A, std::int64_t rows, std::int64_t K, bool as_f32, void* dst,
                     std::int64_t ld);
// gemm_nt_bf16's AMX kernel (single-threaded; only where the CPU has it): A is the amx form of
// M rows starting at a panel boundary (data at its first panel, ld = amx_padded_k(K)); B in rows
// or amx_tiles layout (then starting at a 16-row block).
void gemm_nt_bf16_amx(const Bf16Activations& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                      std::int64_t N, std::int64_t K);
// Tests: make bf16_path() answer `path` (where the CPU supports it), or, with nullopt, the
// CPU's choice again.
void set_bf16_path_for_tests(std::optional<Bf16Path> path);
}  // namespace detail

}  // namespace moekit::kernels
