// Routed experts: weights, the dispatch plan and grouped (sparse, dropless) execution.
//
// Data flow (docs/architecture.md): ids [T, K] -> plan_dispatch -> per expert e: gather its rows of x,
// run the body as GEMMs over all its rows at once, scale by the slot weight -> combine in slot
// order with fp32 accumulation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/compute_mode.hpp"
#include "moekit/config.hpp"
#include "moekit/tensor.hpp"
#include "moekit/weight_format.hpp"

namespace moekit {

/// How an ExpertMatrix's elements lie in memory (the kernel layer's WeightLayout, the same three).
enum class MatrixLayout {
  rows,       ///< row-major, row_stride elements apart: read in place (checkpoints, mappings)
  /// pack_panels() in the f32 mode: per expert ceil(rows / 16) panels of [cols, 16] elements (16
  /// consecutive output rows side by side for each input index; rows past `rows` zero)
  panels,
  /// pack_panels() in the bf16 compute mode on the AMX path: per expert ceil(rows / 16) blocks of
  /// ceil(cols / 32) bf16 tiles of 16 rows × 32 columns (AMX's operand, 1 KB each; rows and
  /// columns past the matrix zero). The same values as rows, multiplied in the same order.
  amx_tiles,
};

/// One projection of every expert: E matrices of shape [rows, cols] = [out, in], each stored
/// row-major with `row_stride` elements between rows, at arbitrary per-expert addresses. This
/// describes every non-transposed checkpoint layout without a copy: stacked [E, out, in],
/// per-expert tensors, the gate or up half of a fused gate‖up tensor, interleaved gate/up rows.
struct ExpertMatrix {
  DType dtype = DType::f32;  ///< f32, bf16 or f16; accumulation is always fp32
  std::int64_t rows = 0;     ///< out
  std::int64_t cols = 0;     ///< in
  std::int64_t row_stride = 0;            ///< elements between consecutive rows (>= cols)
  std::vector<const void*> experts;      ///< E pointers to row 0 of each expert
  /// rows: as above, read in place. Else repacked by pack_panels(), in `dtype`; row_stride is
  /// then unused.
  MatrixLayout layout = MatrixLayout::rows;
  /// How the elements encode the weights (moekit/weight_format.hpp). Plain (the default): `dtype`
  /// is f32, bf16 or f16. Quantized: `experts` point at each expert's container (MLX affine: its
  /// packed codes, dtype u32, row_stride counted in uint32 words, cols · bits / 32 per row), and
  /// `scales` / `biases` at its [ceil(rows / block_rows), ceil(cols / block_cols)] scales and
  /// biases (format.scale_dtype, scale_stride elements between rows; biases empty where the format
  /// has none). Used in place; never expanded to float.
  WeightFormat format;
  std::vector<const void*> scales, biases;
  std::int64_t scale_stride = 0;

  bool quantized() const noexcept { return format.quantized(); }
  bool packed() const noexcept { return layout != MatrixLayout::rows; }
  /// Bytes of every expert's matrix as stored now (codes + scales + biases when quantized).
  std::size_t nbytes() const noexcept;
  /// "bf16", or "4-bit affine, group 64, bf16 scales" (inspect, messages).
  std::string describe() const;
  std::int64_t num_experts() const noexcept { return static_cast<std::int64_t>(experts.size()); }
  /// Stored elements (of `dtype`) per row: cols when plain; MLX affine cols · bits / 32 words;
  /// MXFP4 cols / 2 bytes.
  std::int64_t row_elements() const;
  /// Rows and columns of one expert's scale (and bias) array; 0 when not quantized.
  std::int64_t scale_rows() const;
  std::int64_t scale_cols() const;
  /// The same matrix over experts `ids` (expert i of the result is expert ids[i] of this one, with
  /// its scales and biases): a view, nothing copied. Ids must be in [0, num_experts()).
  ExpertMatrix select(const std::vector<std::int64_t>& ids) const;
  bool defined() const noexcept { return !experts.empty(); }
  /// A stacked, contiguous [E, rows, cols] tensor (or one [rows, cols] matrix: E = 1) viewed as
  /// an ExpertMatrix.
  static ExpertMatrix stacked(const TensorView& t);
  /// MLX affine codes stacked [E, rows, cols · bits / 32] (U32) with scales and biases
  /// [E, rows, cols / group_size], or one matrix without the E dimension, viewed as an
  /// ExpertMatrix (used in place). Throws std::invalid_argument if the shapes disagree.
  static ExpertMatrix stacked_affine(const TensorView& codes, const TensorView& scales, const TensorView& biases,
                                     int bits, int group_size);
};

/// The weights of E experts (E = 1 for a shared expert). gate is undefined for plain-MLP
/// bodies. Biases are f32 [E, F] / [E, D], undefined when the body has none.
struct ExpertWeights {
  ExpertMatrix gate;  ///< [E] x [F, D]
  ExpertMatrix up;    ///< [E] x [F, D]
  ExpertMatrix down;  ///< [E] x [D, F]
  Tensor gate_bias, up_bias, down_bias;
  /// Whatever owns the memory the matrices point into (owned tensors, mapped checkpoints).
  std::vector<std::shared_ptr<const void>> keep_alive;

  std::int64_t num_experts() const noexcept { return down.num_experts(); }
  std::int64_t hidden_size() const noexcept { return down.rows; }  ///< D
  std::int64_t width() const noexcept { return down.cols; }        ///< F
  /// Bytes of the expert matrices (what a forward may read; whole panels when packed; codes,
  /// scales and biases when quantized).
  std::size_t nbytes() const noexcept;
  /// Bytes the matrices take once packed by pack_panels() in `mode` (rows rounded up to whole
  /// panels, or to whole AMX tiles in the bf16 compute mode on AMX; quantized matrices stay as
  /// they are).
  std::size_t packed_nbytes(ComputeMode mode = ComputeMode::exact) const noexcept;
};

/// The expert body, with its constants.
struct ExpertBody {
  BodyKind kind = BodyKind::swiglu;
  float swiglu_limit = 7.0f;
  float swiglu_alpha = 1.702f;
};

/// Checks one projection of E experts of shape [rows, cols]: pointers set and aligned, strides,
/// a float dtype or a consistent affine quantization. Throws std::invalid_argument naming
/// `what`.`name`.
void validate_matrix(const ExpertMatrix& m, std::int64_t E, std::int64_t rows, std::int64_t cols, const char* what,
                     const char* name);

/// Checks that `w` is consistent for `body` with hidden size D: all E pointers set, shapes
/// [F, D] / [D, F], strides >= cols, dtypes f32/bf16/f16, biases f32 of the right shape, gate
/// present iff the body is gated, and — where a matrix is packed in AMX tiles — that `mode` is
/// the bf16 compute mode on a CPU with AMX-BF16. Throws std::invalid_argument naming `what` and
/// the matrix.
void validate_experts(const ExpertWeights& w, const ExpertBody& body, std::int64_t D, const char* what,
                      ComputeMode mode = ComputeMode::exact);

/// Checks that `w` can run the bf16 compute mode (ComputeMode::bf16: the rows entering each
/// projection rounded to bf16 and multiplied with the weights by kernels::gemm_nt_bf16, exact
/// bf16 × bf16 products summed in fp32): every defined matrix bf16 in rows layout (or amx_tiles),
/// or FP8 in rows layout. Throws std::invalid_argument naming `what`.`name` and its format.
void validate_bf16_activations(const ExpertWeights& w, const char* what);

/// Rows of a routing grouped by expert: a stable counting sort of the (token, slot) pairs.
struct DispatchPlan {
  std::int64_t num_tokens = 0, top_k = 0, num_experts = 0;
  std::vector<std::int64_t> counts;   ///< [E] pairs per expert
  std::vector<std::int64_t> offsets;  ///< [E + 1] prefix sums of counts
  /// [T * K] pair index p = t * K + k, ordered by expert, then by p (stable).
  std::vector<std::int64_t> sorted_pairs;
  /// [T * K] inverse: position of pair p in sorted_pairs.
  std::vector<std::int64_t> inverse;
};

/// Repacks gate, up and down of every expert into the forward kernel's packed layout for `mode`,
/// in the stored dtype (a bf16 model stays bf16), and makes `w` own the packed copy: afterwards
/// the source memory (a mapped checkpoint, say) is no longer read. Costs one pass over the weights.
///  - exact and int8 modes: panels (bytes rounded up to whole 16-row panels); the forward then runs the
///    outer-product kernel, whose summation order differs from the in-place dot-product kernel's
///    (docs/numerics.md) and is likewise fixed: bit-identical for any thread count and batch
///    composition.
///  - bf16 compute mode on the AMX path: amx_tiles (bytes rounded up to whole 16 × 32 tiles); the
///    same bits as the in-place AMX kernel, read as whole tiles. The mode cannot be turned off
///    afterwards (the f32 kernels do not read tiles). On the bf16 mode's other paths there is no
///    packed layout: std::invalid_argument.
/// A matrix already packed, and a quantized one (already in its packed format), is left as it is.
/// Throws std::invalid_argument if a matrix has an unsupported dtype.
void pack_panels(ExpertWeights& w, ComputeMode mode = ComputeMode::exact);

/// What a training forward keeps of the expert execution for the backward (the train layer).
/// Rows are in the plan's sorted order (the dense shared expert: token order).
struct ExpertTrace {
  /// Keep the gate/up pre-activations (with their biases): 2·F floats per routed row (F for a
  /// plain MLP). false: keep only the plan; the backward recomputes them with the same kernels,
  /// so the values, and the gradients, are the same bits either way.
  bool keep_pre_activations = true;
  DispatchPlan plan;
  Tensor pre_gate;  ///< [rows, F] f32 gate projection (+ bias); empty for plain-MLP bodies
  Tensor pre_up;    ///< [rows, F] f32 up projection (+ bias)
  std::size_t nbytes() const noexcept;
};

/// Builds the plan from ids [..., K] i32. Throws std::invalid_argument for a wrong dtype and
/// std::out_of_range naming the token and slot of an id outside [0, num_experts).
DispatchPlan plan_dispatch(const TensorView& ids, std::int64_t num_experts);

/// Grouped expert execution. x [T, D] f32; ids/weights [T, K] (i32 / f32); writes
/// y [T, D] f32 = Σ_k w[t,k] · expert_{ids[t,k]}(x[t]) summed in slot order in fp32 (or, with
/// weight_on_input, Σ_k expert(w · x)). y is overwritten (accumulate = false) or added to.
/// Deterministic and independent of the thread count. Experts with no rows cost nothing.
/// Preconditions are validated (shapes, dtypes, plan matching ids): std::invalid_argument.
/// With `trace`, also keeps what a backward needs (ExpertTrace); y is the same bits either way.
/// The projections run in `mode` (ComputeMode; the bf16 mode needs validate_bf16_activations'
/// weights).
void run_experts(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& ids,
                 const TensorView& weights, bool weight_on_input, const TensorView& y, bool accumulate = false,
                 ExpertTrace* trace = nullptr, ComputeMode mode = ComputeMode::exact);

/// A dense FFN on every token (the shared expert: E = 1), y (+)= body(x). x, y [T, D] f32.
/// With `trace`, also keeps the pre-activations of every token (its plan stays empty).
void run_dense_ffn(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& y,
                   bool accumulate, ExpertTrace* trace = nullptr, ComputeMode mode = ComputeMode::exact);

}  // namespace moekit
