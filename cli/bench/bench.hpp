// `moekit bench`, in parts: its options and weight formats (formats.cpp), the machine's limits
// (limits.cpp), the timed rows (bench.cpp), their md / csv / json output (report.cpp), decode at
// the memory limit over distinct layers (decode.cpp, --decode) and the expert-parallel benchmark
// under mpirun (expert_parallel.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "moekit/moekit.hpp"
#include "synth/random_layer.hpp"

namespace moekit::cli::bench {

using BenchShape = synth::ReferenceShape;

struct Options {
  std::string shape = "all", dtype = "f32,bf16", layout = "panels", tokens, threads, reps = "5", seed = "0",
              output = "md", dram_mib = "1024", mode = "forward", simulate_threads, layers, model;
  bool expert_parallel = false;
  bool decode = false;
  bool int8 = false;   ///< --int8: a --model checkpoint's quantized layers in the fast mode
  bool exact = false;  ///< --exact: --e2e in the exact mode (default: the file's own, LmOptions::mode)
  bool e2e = false;    ///< --e2e: a whole model (--model), pp / tg as llama-bench measures them
  std::string prompt_tokens = "512", gen_tokens = "128";  ///< --e2e's -p and -n
  std::string parallel;  ///< --e2e's --parallel: sequence counts of batched tg rows (empty: none)
};

// ---- formats.cpp: what the options name ------------------------------------------------------

/// A weight format of the benchmark: a float dtype, MXFP4 (GPT-OSS's release), block-scaled FP8
/// (DeepSeek-V3's: 128 × 128 blocks, f32 scales), or MLX affine codes of `bits` bits (group 64,
/// bf16 scales and biases: what mlx-community's models use). "-int8": the fast mode
/// (MoeLayer::set_int8_activations); "bf16-act": bf16 weights with the bf16 compute mode
/// (MoeLayer::set_bf16_activations).
struct WeightFormat {
  DType dtype = DType::f32;
  int bits = 0;
  bool int8 = false;
  bool bf16_act = false;
  /// With bits != 0: affine, e2m1 (MXFP4: group 32, e8m0 scales) or e4m3 (FP8, 128 × 128 blocks).
  Element element = Element::affine;
  bool nv = false;  ///< e2m1 as NVFP4 (group 16, e4m3 scales) rather than MXFP4
  static constexpr int kGroup = 64;
  bool quantized() const { return bits != 0; }
  std::string name() const;
  /// How synth draws the layer's weights in this format.
  synth::WeightSpec spec() const;
};

/// The names parse_dtypes accepts, for --help and its error.
extern const char* const kDtypeList;

std::vector<const BenchShape*> parse_shapes(const std::string& text);
std::vector<WeightFormat> parse_dtypes(const std::string& text);
std::vector<std::string> parse_layouts(const std::string& text);

/// Bytes of one expert's three matrices (quantized: codes + bf16 scales and biases).
double expert_bytes(const BenchShape& s, const WeightFormat& f);
/// Bytes of all routed and shared experts.
double layer_weight_bytes(const BenchShape& s, const WeightFormat& f);
/// "1.23 GB".
std::string gb(double bytes);
/// MemAvailable from /proc/meminfo in bytes, or -1 where it cannot be read.
double available_memory();

/// The layer of shape `s` with random weights in `format`, packed into panels if asked, its
/// compute modes set.
std::unique_ptr<MoeLayer> build_layer(const BenchShape& s, const WeightFormat& format, bool panels,
                                      std::uint64_t seed);

// ---- limits.cpp: the machine's limits, measured with moekit's own means ----------------------

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

/// The GEMM the peaks are measured on: M rows x [N, K] weights (6 MB of f32: cached).
constexpr std::int64_t kPeakM = 256, kPeakN = 768, kPeakK = 2048;

struct Limits {
  int dram_threads = 0;
  std::size_t dram_bytes = 0;
  double dram_gbs = 0;
  std::vector<std::pair<int, double>> gemm_peak;  // (threads, GFLOP/s)
  std::vector<std::pair<int, double>> bf16_peak;  // (threads, GFLOP/s); only with a bf16-act dtype
  static double at(const std::vector<std::pair<int, double>>& v, int threads) {
    for (const auto& [t, x] : v)
      if (t == threads) return x;
    return 0.0;
  }
  double peak_for(int threads) const { return at(gemm_peak, threads); }
};

/// Multi-threaded streaming sum over `bytes` of floats, best of 3, in GB/s.
double measure_dram_read(int threads, std::size_t bytes);
/// moekit's f32 forward GEMM on panels at the peak shape, GFLOP/s, best of 3.
double measure_gemm_peak(int threads);
/// The bf16 compute mode's GEMM on the CPU's bf16 path, rounding included, GFLOP/s, best of 3.
double measure_bf16_peak(int threads);
/// The CPU's model name from /proc/cpuinfo.
std::string cpu_model();

// ---- report.cpp: the results and their output ------------------------------------------------

struct Row {
  std::string mode = "forward";  // "forward", or "train" (forward_train + backward)
  std::string shape, dtype, layout;
  std::int64_t tokens = 0;
  int threads = 0;
  double median_ms = 0, min_ms = 0, tokens_per_s = 0, gflops = 0, weight_gbs = 0;
  std::string limit;  // "gemm_peak", "bf16_peak" or "dram_read"
  double limit_value = 0, limit_pct = 0;
  double saved_bytes_per_token = 0;  // train: what the training forward keeps for the backward
  // --simulate-threads (forward): the last call's routed-expert tasks, the model's time for them
  // at this row's threads, and the schedule's efficiency at each simulated thread count.
  std::int64_t sim_tasks = 0;
  double sim_model_ms = 0;
  std::vector<std::pair<int, double>> sim_efficiency;
  // The kernel plan the last call ran (planned_kernels).
  std::string kernels;
};

struct Header {
  std::string commit, cpu, simd;
  unsigned hardware_threads = 0;
  std::vector<std::int64_t> threads;
  int reps = 0;
  std::uint64_t seed = 0;
};

double median_of(std::vector<double> v);
/// The kernels (kernels/plan.hpp) one forward of `layer` ran for the routed experts' up
/// projections, given the rows each expert had (`counts`, [E]), and for the shared experts'
/// (T rows): "int8_panels/avx512vnni x90 + int8_rows/avx512vnni x38 + shared dot/AVX3".
std::string planned_kernels(const MoeLayer& layer, const std::vector<std::int64_t>& counts, std::int64_t T);
/// The md output's first lines: "<title> (commit ...)", the machine and the SIMD target.
void print_md_header(const char* title, const Header& h);
/// The json output's header fields: commit, cpu, hardware_threads, simd_target, threads, reps, seed.
nlohmann::json header_json(const Header& h);
/// Three significant digits, at least one decimal below 100 ("0.412", "14.8", "196").
std::string sig3(double v);

void print_md(const Header& h, const Limits& l, const std::vector<const BenchShape*>& shapes,
              const std::vector<Row>& rows);
void print_csv(const Header& h, const std::vector<Row>& rows);
void print_json(const Header& h, const Limits& l, const std::vector<const BenchShape*>& shapes,
                const std::vector<Row>& rows);

// ---- bench.cpp: the plan and the pieces every mode shares --------------------------------------

/// What the command line asked for, parsed and checked before anything is measured.
struct Plan {
  std::vector<const BenchShape*> shapes;
  std::vector<WeightFormat> dtypes;
  std::vector<std::string> layouts;
  std::vector<std::int64_t> tokens, threads, simulate;
  int reps = 0;
  std::uint64_t seed = 0;
  std::int64_t dram_mib = 0;
  bool train = false;
  bool decode = false;
  std::int64_t layers = 0;  ///< --decode's layers; 0: chosen from the last-level cache
};

Plan check_options(const Options& o);
Header make_header(const Plan& p);
/// The DRAM read limit, and (not for --decode) the GEMM peaks at each thread count.
Limits measure_limits(const Plan& p, bool progress);
/// Whether format `d` runs in `layout` of the listed `layouts` (quantized formats once, the bf16
/// mode where it has that layout).
bool runs_layout(const WeightFormat& d, const std::string& layout, const std::vector<std::string>& layouts);
/// Throws where `copies` times the layer's weight bytes, plus 256 MB, exceed `avail` (-1: no check).
void check_memory(const BenchShape& s, const WeightFormat& format, int copies, double avail);
/// build_layer, after a memory check, with a progress line and a named out-of-memory error.
std::unique_ptr<MoeLayer> build_checked(const BenchShape& s, const WeightFormat& format, bool panels,
                                        std::uint64_t seed, bool progress);

// ---- decode.cpp ------------------------------------------------------------------------------

/// `moekit bench --decode`: decode at the memory limit (docs/cli.md).
void run_decode(const Options& o);

// ---- e2e.cpp: a whole model -------------------------------------------------------------------

/// `--e2e`: the model at --model timed as llama-bench times one (pp<p>, tg<n>).
void run_e2e(const Options& o);

// ---- expert_parallel.cpp ---------------------------------------------------------------------

/// `mpirun -np N moekit bench --expert-parallel`: the exchange's latency and bandwidth, then the
/// phases of an expert-parallel forward per shape, dtype and T. Throws where built without MPI.
void run_expert_parallel(const Options& o);

}  // namespace moekit::cli::bench
