#include "kernels/plan.hpp"

#include "kernels/formats/table.hpp"

namespace moekit::kernels {

namespace {

constexpr Threshold kThresholds[] = {
    {"kFusedRows", kFusedRows,
     "exact, quantized: rows decoded in registers per row of A; past them a block decoded once to L2 scratch is "
     "cheaper"},
    {"kInt8MaxRows", kInt8MaxRows,
     "int8: most rows on the row kernel, which unpacks the codes again per one or two rows; past them the exact "
     "prefill path is faster unless a many-row kernel takes the call"},
    {"kGgmlVnniPanelMinRows", kGgmlVnniPanelMinRows,
     "int8, ggml's types, AVX512-VNNI: the panel kernel from 5 rows (15-27 % faster than the row kernel on q4_K, "
     "q6_K, q8_0, MXFP4); with AVX2 alone it starts past kInt8MaxRows"},
    {"kAmxInt8GroupMultiple", kAmxInt8GroupMultiple,
     "int8, MLX affine on AMX-INT8: group sizes in whole 64-input chunks (one tdpbusd reads 64 bytes of K per row)"},
    {"kInt8Block", kInt8Block,
     "int8 row kernels: group sizes and K in whole 32-blocks (activations quantized and summed 32 at a time; e2m1 "
     "and int4 also take groups of 16)"},
};

// The rows the int8 row kernel takes for B: fewer for ggml's types where the VNNI panel runs.
std::int64_t int8_row_max(bool ggml, const CpuPaths& cpu) {
  return ggml && cpu.int8 == Int8Path::avx512vnni ? kGgmlVnniPanelMinRows - 1 : kInt8MaxRows;
}

// Why the int8 mode runs the exact kernels for B with M rows (nullptr: it does not).
const char* int8_refusal(const WeightMatrix& B, std::int64_t M, std::int64_t K, const CpuPaths& cpu) {
  const WeightFormat& f = B.format;
  const std::int64_t gs = f.block_cols;
  if (!B.quantized()) return "int8 mode on float weights: the exact kernels";
  if (B.layout != WeightLayout::rows) return "int8 mode on packed weights: the exact kernels";
  if (formats::inline_scales(f)) {  // ggml's block types
    if (M <= int8_row_max(true, cpu))
      return formats::ggml_int8(f.element) ? nullptr : "int8: no row kernel for this ggml type";
    return cpu.int8 == Int8Path::portable
               ? "int8, ggml type, many rows: no panel kernel without AVX2: the exact kernels"
               : nullptr;
  }
  if (f.element == Element::affine) {
    if ((f.bits != 4 && f.bits != 8) || gs % kInt8Block != 0)
      return "int8 mode takes 4- and 8-bit MLX affine codes in whole 32-blocks: the exact kernels";
    if (M <= kInt8MaxRows) return nullptr;
    if (cpu.amx_int8 && gs % kAmxInt8GroupMultiple == 0) return nullptr;
    return "int8, more than kInt8MaxRows rows and no AMX-INT8 kernel for them: the exact prefill path";
  }
  const bool signed4 = f.element == Element::e2m1 || (f.element == Element::int4 && !f.has_bias);
  if (!signed4 || f.block_rows != 1 || !(gs == 16 || gs % kInt8Block == 0) || K % kInt8Block != 0 || K % gs != 0)
    return "int8 mode has no kernel for this format or group shape: the exact kernels";
  if (M > kInt8MaxRows) return "int8, more than kInt8MaxRows rows: the exact prefill path";
  return nullptr;
}

KernelPlan exact_plan(const WeightMatrix& B, std::int64_t M, std::int64_t K, const char* why) {
  KernelPlan p;
  if (!B.quantized()) {
    p.kernel = B.layout == WeightLayout::panels ? Kernel::outer : Kernel::dot;
    p.reason = why                                ? why
               : B.layout == WeightLayout::panels ? "float weights packed in panels: the outer product"
                                                  : "float weights in rows: the dot product, read in place";
    return p;
  }
  if (M <= kFusedRows && detail::quant_fuses(B, K)) {
    p.kernel = Kernel::quant_fused;
    p.reason = why ? why : "at most kFusedRows rows: the codes decoded in registers, one pass over the stored stream";
  } else {
    p.kernel = Kernel::quant_blocks;
    p.reason = why               ? why
               : M <= kFusedRows ? "this target does not decode the format in registers: blocks decoded to scratch"
                                 : "more than kFusedRows rows: a block of B decoded once for every row of A";
  }
  return p;
}

KernelPlan int8_plan(const WeightMatrix& B, std::int64_t M, std::int64_t K, const CpuPaths& cpu) {
  if (const char* refused = int8_refusal(B, M, K, cpu)) return exact_plan(B, M, K, refused);
  KernelPlan p;
  const bool ggml = formats::inline_scales(B.format);
  if (M <= int8_row_max(ggml, cpu)) {
    p.kernel = Kernel::int8_rows;
    // 4-bit codes take the x86 row kernels with K a multiple of 64, else the portable one.
    const bool four = B.format.element != Element::affine || B.format.bits == 4;
    p.int8 = !ggml && four && K % 64 != 0 ? Int8Path::portable : cpu.int8;
    p.reason = "int8, few rows: activations quantized per group, integer dot products with the codes row by row";
    return p;
  }
  if (ggml) {
    p.kernel = Kernel::int8_panels;
    p.int8 = cpu.int8;
    p.reason = "int8, ggml type, many rows: A quantized once, B decoded a panel at a time";
    return p;
  }
  p.kernel = Kernel::int8_amx;
  p.int8 = Int8Path::amx;
  p.reason = "int8, MLX affine, many rows: AMX-INT8 tiles";
  return p;
}

KernelPlan bf16_plan(const WeightMatrix& B) {
  KernelPlan p;
  p.decoded = B.quantized();
  // Weights packed in AMX tiles run on the amx path (pack_panels chose it), whatever bf16_path()
  // answers now.
  p.bf16 = B.layout == WeightLayout::amx_tiles ? Bf16Path::amx : bf16_path();
  switch (p.bf16) {
    case Bf16Path::amx:
      p.kernel = Kernel::bf16_amx;
      p.reason = "bf16 mode, AMX-BF16: tdpbf16ps tiles";
      break;
    case Bf16Path::avx512bf16:
      p.kernel = Kernel::bf16_dp;
      p.reason = "bf16 mode, AVX512-BF16 where vdpbf16ps runs at the FMA rate (AMD)";
      break;
    case Bf16Path::f32_fma:
      p.kernel = Kernel::bf16_fma;
      p.reason = "bf16 mode without a faster bf16 instruction: the rounded rows through the f32 kernel";
      break;
  }
  return p;
}

}  // namespace

std::span<const Threshold> plan_thresholds() noexcept { return kThresholds; }

const char* kernel_name(Kernel kernel) noexcept {
  switch (kernel) {
    case Kernel::dot:
      return "dot";
    case Kernel::outer:
      return "outer";
    case Kernel::quant_fused:
      return "quant_fused";
    case Kernel::quant_blocks:
      return "quant_blocks";
    case Kernel::int8_rows:
      return "int8_rows";
    case Kernel::int8_panels:
      return "int8_panels";
    case Kernel::int8_amx:
      return "int8_amx";
    case Kernel::bf16_fma:
      return "bf16_fma";
    case Kernel::bf16_dp:
      return "bf16_dp";
    case Kernel::bf16_amx:
      return "bf16_amx";
  }
  return "?";
}

const char* path_name(const KernelPlan& plan) noexcept {
  switch (plan.kernel) {
    case Kernel::int8_rows:
    case Kernel::int8_panels:
    case Kernel::int8_amx:
      return int8_path_name(plan.int8);
    case Kernel::bf16_fma:
    case Kernel::bf16_dp:
    case Kernel::bf16_amx:
      return bf16_path_name(plan.bf16);
    default:
      return simd_target_name();
  }
}

std::string describe(const KernelPlan& plan) {
  std::string s = kernel_name(plan.kernel);
  s += '/';
  s += path_name(plan);
  if (plan.decoded) s += "+decoded";
  return s;
}

KernelPlan plan_gemm_nt(const WeightMatrix& B, ComputeMode mode, std::int64_t M, std::int64_t K) noexcept {
  switch (mode) {
    case ComputeMode::int8:
      return int8_plan(B, M, K, cpu_paths());
    case ComputeMode::bf16:
      return bf16_plan(B);
    case ComputeMode::exact:
      break;
  }
  return exact_plan(B, M, K, nullptr);
}

}  // namespace moekit::kernels
