// The kernel conformance table, in the spirit of ggml's test-backend-ops: one row per
//   weight format × layout × instruction path × shape set × operation,
// each a test of its own (one ctest entry, named f32_panels_nt_AVX3_1x768x2048) that runs the
// fast kernel on random operands and holds it to the scalar reference (kernels/ref/) with the
// criterion docs/numerics.md states for it. A row whose path this CPU (or OS, or build) lacks is
// skipped with the reason, never passed.
//
// How to add a weight format
//   1. Write its descriptor, a WeightFormat (float_format, affine_format and mxfp4_format in
//      conformance_table.cpp are the ones there are):
//        name    letters and digits, the first word of its rows' names ("q4g64bf16");
//        make    random weights [rows, cols] in the format, rows layout, `ld` apart (0: the
//                format's own padded stride), owning their storage;
//        decode  the scalar reference's f32 value of every element ([rows, cols]): what the
//                kernels must compute with;
//        runs    each (mode, layout, op) it is computed in, with its criterion, its paths and
//                its shape sets (conformance_table.cpp's, or its own).
//   2. Append it to weight_formats() (conformance_table.cpp). The table then holds a row for each
//      run × path × shape set, and Conformance.EveryPathHasRows checks the paths are all there.
//   A format the existing kernels take through a WeightMatrix needs nothing else: each criterion's
//   engine (run_case in conformance_test.cpp) reads the weights only through make and decode. A
//   format with kernels or a criterion of its own needs its engine there.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"

namespace moekit::testing::conformance {

/// What the activations are: f32 (the exact mode), the bf16 compute mode (gemm_nt_bf16) or the
/// int8 fast mode on affine weights (ComputeMode::int8).
enum class Mode { f32, bf16, int8 };

/// How the weights lie in memory: kernels::WeightLayout's rows, panels and amx_tiles, or MLX
/// a quantized format's rows (its stored elements with their scales, and biases where it has them).
enum class Layout { rows, panels, amx_tiles, quant };

/// gemm_nt C = A·Bᵀ (forward), gemm_nn C = A·B (backward data), gemm_tn C = Aᵀ·B (weight gradient;
/// B is f32 rows, not a weight matrix).
enum class Op { nt, nn, tn };

/// What a row's result must meet (docs/numerics.md, "Summation order" and the modes' sections).
enum class Criterion {
  /// Within the dot-product bound of ref::gemm_nt / gemm_nn on the decoded weights:
  /// |Δ| ≤ 2·(K + 2)·ε·Σ|a_k·b_k| (· row scale) + 2·ε·|c| (Higham; both sides reorder, the epilogue
  /// rounds twice). The lane-strided kernels (nt on rows, nn on panels).
  dot_bound,
  /// One FMA chain over k: bit for bit the std::fma twin (ref::gemm_nt_fma, gemm_nn, gemm_tn)
  /// where the target fuses (testing::fused), else dot_bound (nt on panels, nn on rows, tn).
  fma_chain,
  /// A quantized format, exact mode: dequantize_rows gives the reference decode's bits, and gemm_nt
  /// gives gemm_nt's bits on that decoded matrix in rows layout.
  dense_bitwise,
  /// The bf16 compute mode on avx512bf16 and amx: the path's scalar twin
  /// (ref::gemm_nt_bf16_dpbf16, gemm_nt_bf16_tdpbf16) bit for bit.
  twin_bitwise,
  /// The bf16 compute mode on f32_fma: round_to_bf16 gives f32_to_bf16's values, and the product
  /// is gemm_nt's rows kernel on those rounded rows, bit for bit.
  rounded_rows_bitwise,
  /// The int8 fast mode: |y − y_exact| ≤ Σ_g (d_g / 2)·Σ_{k∈g} |w_k|·1.001 + 1e-5·Σ|w·x| against
  /// the exact kernel, a zero row exact; and the path against its sibling: avx2 and gemm_nt's
  /// dispatch within 1e-5·Σ|w·x| of portable, avx512vnni avx2's bits (4-bit) or within
  /// 1e-5·(|y| + 1) of them (8-bit).
  int8_bound,
  /// The int8 fast mode on AMX-INT8: the portable path's bits, alone and through gemm_nt's
  /// driver on 1–3 threads (more than kInt8MaxRows rows).
  portable_bitwise,
};

const char* name_of(Mode mode);
const char* name_of(Layout layout);
const char* name_of(Op op);
const char* name_of(Criterion criterion);

/// An instruction path: a Highway target the kernels dispatch to, and for the bf16 and int8
/// modes which of their hand-written kernels runs.
struct Path {
  std::string name;         ///< in the rows' names: "AVX3", "bf16amx", "int8avx2"
  std::int64_t target = 0;  ///< the Highway target to dispatch to (0: the CPU's best)
  kernels::Bf16Path bf16 = kernels::Bf16Path::f32_fma;
  kernels::Int8Path int8 = kernels::Int8Path::best;  ///< best: gemm_nt's dispatch

  /// Why this path cannot run here ("" when it can).
  std::string unsupported() const;
};

/// One product: C[M, N] from A[M, K] (tn: K rows of M), gathered and scaled rows of A (and of
/// tn's B), the row-scale epilogue and accumulation as flagged, on the pool or the calling thread.
struct Case {
  std::int64_t M = 0, N = 0, K = 0;
  bool gather = false, scaled = false, row_scale = false, accumulate = false;
  std::int64_t ld = 0;  ///< the weight rows' stride in elements (0: the format's padded default)
  kernels::Threads threads = kernels::Threads::pool;
};

struct ShapeSet {
  std::string name;  ///< letters, digits: "tails", "1x768x2048"
  std::vector<Case> cases;
};

/// Weights in a format, rows layout: `w` points into the tensors, which own the memory.
struct Weights {
  Tensor data, scales, biases;
  kernels::WeightMatrix w;
};

/// One way a format is computed.
struct Run {
  Mode mode = Mode::f32;
  Layout layout = Layout::rows;
  Op op = Op::nt;
  Criterion criterion = Criterion::dot_bound;
  std::vector<Path> paths;
  std::vector<std::shared_ptr<const ShapeSet>> shapes;
};

struct WeightFormat {
  std::string name;
  std::function<Weights(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::mt19937& rng)>
      make;
  std::function<Tensor(const kernels::WeightMatrix& w, std::int64_t rows, std::int64_t cols)>
      decode;
  std::vector<Run> runs;
};

/// A row of the table.
struct Row {
  std::shared_ptr<const WeightFormat> format;
  Mode mode = Mode::f32;
  Layout layout = Layout::rows;
  Op op = Op::nt;
  Criterion criterion = Criterion::dot_bound;
  Path path;
  std::shared_ptr<const ShapeSet> shapes;

  /// format_layout_op_path_shapes, e.g. "f32_panels_nt_AVX3_tails".
  std::string name() const;
};

inline void PrintTo(const Row& row, std::ostream* os) { *os << row.name(); }

// ---- The table (conformance_table.cpp) ---------------------------------------------------------

/// Every weight format the kernels take.
const std::vector<std::shared_ptr<const WeightFormat>>& weight_formats();
/// Every row: each format's runs × paths × shape sets.
std::vector<Row> table();

// Path families.
std::vector<Path> highway_paths();       ///< every compiled Highway target (exact mode)
std::vector<Path> bf16_f32_fma_paths();  ///< the bf16 mode's f32_fma path on every target
Path bf16_path(kernels::Bf16Path path);  ///< avx512bf16 or amx
Path int8_path(kernels::Int8Path path);
std::vector<Path> int8_paths();  ///< portable, avx2, avx512vnni and gemm_nt's dispatch

}  // namespace moekit::testing::conformance
