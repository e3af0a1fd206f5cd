// The kernel plan (kernels/plan.hpp), enumerated as the conformance table is: one test per weight
// format of the table (and per ggml type) × compute mode, each printing its plan at the row counts
// of decode and prefill and holding it to the rules the plan states; then gemm_nt against the
// kernel the plan names, called directly: the driver runs what the plan says, bit for bit.
#include "kernels/plan.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/conformance.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "kernels/ggml_blocks.hpp"

namespace moekit {
namespace {

using kernels::Int8Path;
using kernels::Kernel;
using kernels::KernelPlan;

constexpr std::int64_t kRows[] = {1, 2, 3, 4, 5, 8, 9, 16, 64, 512};
constexpr ComputeMode kModes[] = {ComputeMode::exact, ComputeMode::int8, ComputeMode::bf16};

bool is_ggml(Element e) { return e >= Element::q4_0 && e <= Element::ggml_mxfp4; }

// One row of the enumeration: a format (rows or panels layout) in one mode.
struct PlanRow {
  std::string name;
  moekit::WeightFormat format;
  DType dtype = DType::f32;
  kernels::WeightLayout layout = kernels::WeightLayout::rows;
  ComputeMode mode = ComputeMode::exact;
};

// Its name in ctest's and gtest's listings, instead of the struct's bytes.
void PrintTo(const PlanRow& row, std::ostream* os) { *os << row.name; }

std::vector<PlanRow> plan_rows() {
  std::vector<PlanRow> rows;
  const auto add = [&](const std::string& name, const moekit::WeightFormat& f, DType dtype,
                       kernels::WeightLayout layout) {
    for (const ComputeMode mode : kModes) {
      // The bf16 mode takes bf16 weights read in rows and FP8 ones (validate_bf16_activations).
      const bool bf16_ok =
          layout == kernels::WeightLayout::rows && (f.quantized() ? f.element == Element::e4m3 : dtype == DType::bf16);
      if (mode == ComputeMode::bf16 && !bf16_ok) continue;
      rows.push_back({name + "_" + compute_mode_name(mode), f, dtype, layout, mode});
    }
  };
  std::mt19937 rng(1);
  for (const auto& f : testing::conformance::weight_formats()) {
    // One row: only its format and dtype are read (this runs as each test process starts).
    const kernels::WeightMatrix w = f->make(1, 256, 0, rng).w;
    add(f->name, w.format, w.dtype, kernels::WeightLayout::rows);
    if (!w.quantized()) add(f->name + "panels", w.format, w.dtype, kernels::WeightLayout::panels);
  }
  for (int e = static_cast<int>(Element::q4_0); e <= static_cast<int>(Element::ggml_mxfp4); ++e) {
    const moekit::WeightFormat f = moekit::WeightFormat::ggml(static_cast<Element>(e));
    add(std::string("gguf_") + kernels::formats::traits(f.element).name, f, DType::u8, kernels::WeightLayout::rows);
  }
  return rows;
}

class Plan : public ::testing::TestWithParam<PlanRow> {};

// What the plan states, checked for every row count: the kernel belongs to the mode, the int8
// kernels run only on the weights, row counts and CPUs they are for, the bf16 kernels follow the
// path, and the exact kernels decode in registers only for few rows.
TEST_P(Plan, FollowsItsRules) {
  const PlanRow& row = GetParam();
  kernels::WeightMatrix B{nullptr, row.dtype, 0, row.layout, row.format};
  const bool quantized = row.format.quantized();
  const kernels::CpuPaths& cpu = kernels::cpu_paths();
  std::string line;
  for (const std::int64_t M : kRows) {
    for (const std::int64_t K : {std::int64_t{256}, std::int64_t{2048}}) {
      const KernelPlan p = kernels::plan_gemm_nt(B, row.mode, M, K);
      SCOPED_TRACE(row.name + " M " + std::to_string(M) + " K " + std::to_string(K) + ": " + kernels::describe(p));
      EXPECT_GT(std::strlen(p.reason), 0u);
      if (K == 2048) {
        line += ' ';  // (appended piece by piece: GCC 12's -Wrestrict misfires on " " + string)
        line += std::to_string(M);
        line += ':';
        line += kernels::describe(p);
      }
      switch (p.kernel) {
        case Kernel::dot:
        case Kernel::outer:
          EXPECT_FALSE(quantized);
          EXPECT_NE(row.mode, ComputeMode::bf16);
          EXPECT_EQ(p.kernel == Kernel::outer, row.layout == kernels::WeightLayout::panels);
          break;
        case Kernel::quant_fused:
          EXPECT_LE(M, kernels::kFusedRows);
          EXPECT_TRUE(kernels::detail::quant_fuses(B, K));
          [[fallthrough]];
        case Kernel::quant_blocks:
          EXPECT_TRUE(quantized);
          EXPECT_NE(row.mode, ComputeMode::bf16);
          if (M <= kernels::kFusedRows && kernels::detail::quant_fuses(B, K)) {
            EXPECT_EQ(p.kernel, Kernel::quant_fused) << "few rows decode in registers where the target can";
          }
          break;
        case Kernel::int8_rows:
          EXPECT_EQ(row.mode, ComputeMode::int8);
          EXPECT_LE(M, kernels::kInt8MaxRows);
          if (is_ggml(row.format.element) && cpu.int8 == Int8Path::avx512vnni) {
            EXPECT_LT(M, kernels::kGgmlVnniPanelMinRows);
          }
          EXPECT_NE(p.int8, Int8Path::best);
          EXPECT_NE(p.int8, Int8Path::amx);
          EXPECT_TRUE(kernels::int8_path_supported(p.int8));
          break;
        case Kernel::int8_panels:
          EXPECT_EQ(row.mode, ComputeMode::int8);
          EXPECT_TRUE(is_ggml(row.format.element));
          EXPECT_NE(cpu.int8, Int8Path::portable) << "the panels need AVX2";
          EXPECT_EQ(p.int8, cpu.int8);
          EXPECT_GE(M, cpu.int8 == Int8Path::avx512vnni ? kernels::kGgmlVnniPanelMinRows : kernels::kInt8MaxRows + 1);
          break;
        case Kernel::int8_amx:
          EXPECT_EQ(row.mode, ComputeMode::int8);
          EXPECT_TRUE(cpu.amx_int8);
          EXPECT_EQ(row.format.element, Element::affine);
          EXPECT_EQ(row.format.block_cols % kernels::kAmxInt8GroupMultiple, 0);
          EXPECT_GT(M, kernels::kInt8MaxRows);
          break;
        case Kernel::bf16_fma:
        case Kernel::bf16_dp:
        case Kernel::bf16_amx:
          EXPECT_EQ(row.mode, ComputeMode::bf16);
          EXPECT_EQ(p.bf16, kernels::bf16_path());
          EXPECT_EQ(p.decoded, quantized);
          break;
      }
      // The int8 mode never leaves quantized weights exact where its kernels take them: the
      // formats and row counts the mode documents.
      if (row.mode == ComputeMode::int8 && quantized && row.layout == kernels::WeightLayout::rows) {
        const moekit::WeightFormat& f = row.format;
        const bool affine48 = f.element == Element::affine && (f.bits == 4 || f.bits == 8) && f.block_cols % 32 == 0;
        const bool signed4 = (f.element == Element::e2m1 || (f.element == Element::int4 && !f.has_bias)) &&
                             f.block_rows == 1 && (f.block_cols == 16 || f.block_cols % 32 == 0);
        const bool few = M <= kernels::kInt8MaxRows;
        bool takes = false;
        if (is_ggml(f.element)) takes = few || cpu.int8 != Int8Path::portable;
        if (affine48) takes = few || (cpu.amx_int8 && f.block_cols % 64 == 0);
        if (signed4) takes = few;
        const bool int8 =
            p.kernel == Kernel::int8_rows || p.kernel == Kernel::int8_panels || p.kernel == Kernel::int8_amx;
        EXPECT_EQ(int8, takes);
      }
    }
  }
  std::printf("[ plan ] %s:%s\n", row.name.c_str(), line.c_str());
}

INSTANTIATE_TEST_SUITE_P(Table, Plan, ::testing::ValuesIn(plan_rows()),
                         [](const ::testing::TestParamInfo<PlanRow>& row) { return row.param.name; });

TEST(PlanThresholds, EachNamedWithItsReason) {
  const auto t = kernels::plan_thresholds();
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0].value, kernels::kFusedRows);
  EXPECT_EQ(t[1].value, kernels::kInt8MaxRows);
  EXPECT_EQ(t[2].value, kernels::kGgmlVnniPanelMinRows);
  EXPECT_EQ(t[3].value, kernels::kAmxInt8GroupMultiple);
  EXPECT_EQ(t[4].value, kernels::kInt8Block);
  for (const kernels::Threshold& x : t) {
    EXPECT_GT(std::strlen(x.name), 0u);
    EXPECT_GT(std::strlen(x.reason), 20u) << x.name;
  }
}

// The CPU's paths are resolved once and are ones it runs.
TEST(PlanCpu, PathsAreSupported) {
  const kernels::CpuPaths& cpu = kernels::cpu_paths();
  EXPECT_NE(cpu.int8, Int8Path::best);
  EXPECT_NE(cpu.int8, Int8Path::amx);
  EXPECT_TRUE(kernels::int8_path_supported(cpu.int8));
  EXPECT_TRUE(kernels::bf16_path_supported(cpu.bf16));
  if (cpu.amx_int8) {
    EXPECT_TRUE(kernels::int8_path_supported(Int8Path::amx));
  }
  EXPECT_EQ(&cpu, &kernels::cpu_paths());
  std::printf("[ plan ] this CPU: int8 %s, AMX-INT8 %s, bf16 %s, exact kernels %s\n", kernels::int8_path_name(cpu.int8),
              cpu.amx_int8 ? "yes" : "no", kernels::bf16_path_name(cpu.bf16), kernels::simd_target_name());
}

// The weights the driver test runs: the table's quantized formats (MLX affine at group 64) and
// every ggml type's rows from tests/goldens/gguf/blocks.gguf.
struct DriverWeights {
  std::string name;
  kernels::WeightMatrix w;
  std::int64_t N, K;
  testing::conformance::Weights owner;
};

std::vector<DriverWeights> driver_weights(std::mt19937& rng) {
  std::vector<DriverWeights> out;
  for (const auto& f : testing::conformance::weight_formats()) {
    testing::conformance::Weights q = f->make(40, 512, 0, rng);
    const moekit::WeightFormat& w = q.w.format;
    if (!w.quantized() || (w.element == Element::affine && w.block_cols != 64)) continue;
    const kernels::WeightMatrix m = q.w;
    out.push_back({f->name, m, 40, 512, std::move(q)});
  }
  for (int e = static_cast<int>(Element::q4_0); e <= static_cast<int>(Element::ggml_mxfp4); ++e) {
    const moekit::WeightFormat f = moekit::WeightFormat::ggml(static_cast<Element>(e));
    const std::string name = kernels::formats::traits(f.element).name;
    const GgufTensorInfo* t = testing::ggml_blocks().find(name + ".q");
    if (t == nullptr) continue;
    kernels::WeightMatrix m{t->data, DType::u8, 0, kernels::WeightLayout::rows, f};
    const std::int64_t K = t->ne[0], N = t->ne[1];
    m.ld = static_cast<std::int64_t>(t->nbytes) / N;
    out.push_back({name, m, N, K, {}});
  }
  return out;
}

// gemm_nt runs the kernel the plan names: its output equals that kernel's, called directly, bit
// for bit (on the calling thread, one call).
TEST(PlanDriver, GemmNtRunsThePlannedKernel) {
  std::mt19937 rng(5);
  const std::vector<DriverWeights> all = driver_weights(rng);
  ASSERT_GT(all.size(), 20u);
  for (const DriverWeights& d : all) {
    const kernels::WeightMatrix& B = d.w;
    const std::int64_t N = d.N, K = d.K;
    for (const ComputeMode mode : {ComputeMode::exact, ComputeMode::int8}) {
      for (const std::int64_t M :
           {std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, std::int64_t{5}, std::int64_t{9}}) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(static_cast<std::size_t>(M * K));
        for (float& v : x) v = nd(rng);
        const kernels::RowSource A{x.data(), K};
        std::vector<float> got(static_cast<std::size_t>(M * N)), want(got.size());
        const KernelPlan p = kernels::plan_gemm_nt(B, mode, M, K);
        SCOPED_TRACE(d.name + " " + compute_mode_name(mode) + " M " + std::to_string(M) + ": " + kernels::describe(p));
        kernels::gemm_nt(A, B, {got.data(), N}, M, N, K, kernels::Threads::caller, mode);
        switch (p.kernel) {
          case Kernel::quant_fused:
          case Kernel::quant_blocks:
            kernels::detail::gemm_nt_quant_kernel(A, B, {want.data(), N}, M, N, K, p.kernel == Kernel::quant_fused);
            break;
          case Kernel::int8_rows:
            kernels::detail::gemm_nt_affine_int8_kernel(A, B, {want.data(), N}, M, N, K, p.int8);
            break;
          case Kernel::int8_panels:
          case Kernel::int8_amx:
            kernels::detail::gemm_nt_int8_many(A, B, {want.data(), N}, M, N, K, kernels::Threads::caller, p.int8);
            break;
          default:
            ADD_FAILURE() << "a float kernel planned for quantized weights";
        }
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      }
    }
  }
}

}  // namespace
}  // namespace moekit
