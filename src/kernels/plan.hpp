// The kernel plan: which kernel computes a weight product, decided in one place.
//
// A product C = A · Bᵀ of the MoE block (one projection of one expert over the rows routed to
// it) is planned from four things: the weights' format and layout (WeightMatrix), the compute
// mode the layer runs in (a value passed down from MoeLayer, never stored on the weights), the
// rows of A in the call (M: decode has 1-8 per expert, prefill hundreds) and the CPU
// (cpu_paths(), resolved once). plan_gemm_nt returns the kernel and its instruction path; the
// drivers (gemm.cpp) run what it says and decide nothing themselves. Every row-count threshold
// the plan uses is a constant below with the reason it has that value; plan_thresholds() lists
// them for `moekit inspect` and docs/kernels.md. tests/kernels/plan_test.cpp enumerates the plan.
//
// The plan decides the kernel, never the bits a row gets: in the exact mode every kernel of a
// format gives the same bits for a row whatever M (docs/numerics.md), so a row's result does
// not depend on what it is batched with. The int8 mode's kernels agree to its error bound.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kernels/cpu.hpp"
#include "kernels/gemm.hpp"
#include "moekit/compute_mode.hpp"

namespace moekit::kernels {

// ---- Thresholds ----------------------------------------------------------------------------

/// Exact mode, quantized weights: rows of A up to which the codes are decoded in registers, one
/// strip of B per row of A; past them every strip would decode the weights again, and decoding a
/// block of B once into L2-resident scratch for all the rows is cheaper.
constexpr std::int64_t kFusedRows = 3;

/// int8 mode: rows of A up to which the row kernel runs (it unpacks the codes again for every
/// one or two rows; past 8 the exact prefill path, which decodes a block once, is faster) —
/// unless a many-row kernel takes the call (ggml's panels, AMX-INT8).
constexpr std::int64_t kInt8MaxRows = 8;

/// int8 mode on ggml's types with AVX512-VNNI: the fewest rows the panel kernel takes. Measured on
/// q4_K, q6_K, q8_0 and MXFP4 at T = 32, 64, 128: from 5 rows the panel is 15-27 % faster than
/// the row kernel, below level or slower. With AVX2 alone the panel starts past kInt8MaxRows (at
/// 5 or 7 rows it measured level with the row kernel or slower).
constexpr std::int64_t kGgmlVnniPanelMinRows = 5;

/// int8 mode on MLX affine codes: the group sizes AMX-INT8 takes are multiples of this (one
/// `tdpbusd` reads 64 bytes of K per row).
constexpr std::int64_t kAmxInt8GroupMultiple = 64;

/// int8 mode's row kernels: group sizes (MLX affine, e2m1, int4) and K are whole 32-blocks (the
/// activations are quantized and summed 32 at a time); e2m1 and int4 also take groups of 16.
constexpr std::int64_t kInt8Block = 32;

/// A threshold with its reason, as the plan's table prints it.
struct Threshold {
  const char* name;
  std::int64_t value;
  const char* reason;
};

/// Every threshold above, in the order they are declared.
std::span<const Threshold> plan_thresholds() noexcept;

// ---- The plan ------------------------------------------------------------------------------

/// The kernels gemm_nt and gemm_nt_bf16 run.
enum class Kernel {
  dot,           ///< f32/bf16/f16 rows: the lane-strided dot product, read in place (gemm_nt.cpp)
  outer,         ///< f32/bf16/f16 packed in panels: one FMA chain per element (gemm_panel.cpp)
  quant_fused,   ///< exact, quantized: the codes decoded in registers (gemm_quant.cpp)
  quant_blocks,  ///< exact, quantized: a block of B decoded to f32 scratch, then `dot`'s order
  int8_rows,     ///< int8: activations quantized per group, the row kernel (int8_rows.cpp)
  int8_panels,   ///< int8, ggml's types, many rows: the panel kernel (int8_panels.cpp)
  int8_amx,      ///< int8, MLX affine, many rows: AMX-INT8 tiles (gemm_amx_int8.cpp)
  bf16_fma,      ///< bf16: rounded rows kept as f32, `dot` (or quant_blocks' decode) on them
  bf16_dp,       ///< bf16: `vdpbf16ps` (gemm_bf16.cpp)
  bf16_amx,      ///< bf16: AMX-BF16 tiles (gemm_amx.cpp)
};

/// "dot", "outer", "quant_fused", ... (the enumerator's name).
const char* kernel_name(Kernel kernel) noexcept;

/// What runs one product.
struct KernelPlan {
  Kernel kernel = Kernel::dot;
  /// The int8 kernels' instruction path (resolved: never best).
  Int8Path int8 = Int8Path::portable;
  /// The bf16 kernels' path.
  Bf16Path bf16 = Bf16Path::f32_fma;
  /// bf16 kernels on FP8 weights: each block of rows decoded (and rounded to bf16) into scratch.
  bool decoded = false;
  /// One line: why this kernel for this call.
  const char* reason = "";
};

/// The instruction path a plan runs on: the int8 or bf16 path's name, or Highway's target for
/// the exact kernels ("AVX3", "AVX2", ...).
const char* path_name(const KernelPlan& plan) noexcept;

/// "int8_panels/avx512vnni": the kernel and its path.
std::string describe(const KernelPlan& plan);

/// The kernel that computes C[M, N] = A[M, K] · B[N, K]ᵀ for weights B in `mode` on this CPU:
/// gemm_nt's for the exact and int8 modes, gemm_nt_bf16's for bf16 (whose weights are bf16 in
/// rows or AMX tiles, or FP8 in rows: validate_bf16_activations). The int8 mode on weights or a
/// shape its kernels do not take plans the exact kernels (and says why). Never throws; weights no
/// kernel takes (check_weights refuses them) plan `dot`.
KernelPlan plan_gemm_nt(const WeightMatrix& B, ComputeMode mode, std::int64_t M, std::int64_t K) noexcept;

namespace detail {
/// Whether the exact mode's in-register decode takes B [.., K] on this CPU's SIMD target (the
/// format's view exists there and fits K and the group size; gemm_quant.cpp).
bool quant_fuses(const WeightMatrix& B, std::int64_t K) noexcept;
}  // namespace detail

}  // namespace moekit::kernels
