// `moekit forward`: y = MoE_L(x) for one MoE layer of a checkpoint folder, .npy in and out.
//
// All-or-nothing outputs: the layer is loaded, the input read and checked and the forward run
// before any output is touched; each output is then written beside its destination under a
// staging name (write_npy is itself atomic) and renamed into place only once all were written.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "format.hpp"
#include "layer_io.hpp"
#include "moekit/moekit.hpp"
#ifdef MOEKIT_HAVE_DIST
#include "mpi_session.hpp"
#include "moekit/dist.hpp"
#endif

namespace moekit::cli {

namespace {

namespace fs = std::filesystem;

struct ForwardOptions {
  std::string model;
  std::int64_t layer = -1;
  std::string input, output, ids_out, weights_out;
  std::vector<std::string> router_knobs;  // KEY=VALUE
  bool pack = false;
  bool int8 = false;
  bool bf16_activations = false;
  bool expert_parallel = false;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

std::string fail_prefix() { return "[moekit forward] "; }

struct Output {
  std::string path;
  TensorView tensor;
  std::string staged;
};

// Writes every output under a staging name, then renames them all into place. On a failure the
// staged files are removed and no destination is touched (a rename failing halfway, which needs
// the directory to change under us, is the one case that can leave earlier outputs in place).
void write_all(std::vector<Output>& outputs) {
  const std::string suffix = ".moekit-staged-" + std::to_string(::getpid());
  auto discard = [&] {
    std::error_code ec;
    for (const Output& o : outputs)
      if (!o.staged.empty()) fs::remove(o.staged, ec);
  };
  try {
    for (Output& o : outputs) {
      o.staged = o.path + suffix;
      write_npy(o.staged, o.tensor);
    }
    for (Output& o : outputs) {
      std::error_code ec;
      fs::rename(o.staged, o.path, ec);
      if (ec)
        throw std::runtime_error(fail_prefix() + "cannot move output into place at '" + o.path +
                                 "': " + ec.message());
      o.staged.clear();
    }
  } catch (...) {
    discard();
    throw;
  }
}

void check_outputs(const ForwardOptions& opt) {
  std::vector<std::pair<std::string, const char*>> outs = {{opt.output, "--output"}};
  if (!opt.ids_out.empty()) outs.emplace_back(opt.ids_out, "--ids-out");
  if (!opt.weights_out.empty()) outs.emplace_back(opt.weights_out, "--weights-out");
  std::set<std::string> seen;
  for (const auto& [path, option] : outs) {
    check_output_path(fail_prefix(), path, option);
    if (!seen.insert(fs::absolute(path).lexically_normal().string()).second)
      throw std::invalid_argument(fail_prefix() + option + " '" + path +
                                  "' is also another output");
  }
}

MoeLayer load(const ForwardOptions& opt) {
  MoeLayer layer = load_layer_with_knobs(fail_prefix(), opt.model, opt.layer, opt.router_knobs);
  if (opt.pack) layer.pack_weights();
  if (opt.int8) layer.set_int8_activations(true);
  if (opt.bf16_activations) layer.set_bf16_activations(true);
  return layer;
}

void write_results(const ForwardOptions& opt, const Tensor& y, const ForwardInfo& info) {
  std::vector<Output> outputs = {{opt.output, y.view(), {}}};
  if (!opt.ids_out.empty()) outputs.push_back({opt.ids_out, info.routing.ids.view(), {}});
  if (!opt.weights_out.empty())
    outputs.push_back({opt.weights_out, info.routing.weights.view(), {}});
  write_all(outputs);
}

void run_forward(const ForwardOptions& opt) {
  check_outputs(opt);
  apply_threads_option(opt.threads_option, opt.threads);
  const MoeLayer layer = load(opt);
  const Tensor x = read_activation(fail_prefix(), "input", opt.input, layer.config().hidden_size, opt.model, opt.layer);
  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  write_results(opt, y, info);
}

#ifdef MOEKIT_HAVE_DIST
int as_count(std::int64_t n) {
  if (n > INT32_MAX) throw std::length_error(fail_prefix() + "the input is too large for one MPI message");
  return static_cast<int>(n);
}

// Every rank loads the layer (mapped: a rank touches only its own experts' pages); rank 0 reads
// x and hands each rank a consecutive slice of its rows; the outputs come back to rank 0, which
// writes them. Every failure is agreed on (dist::agree), so every rank exits with 1 and rank 0
// alone prints the message.
void run_forward_expert_parallel(const MpiSession& mpi, const ForwardOptions& opt) {
  std::exception_ptr err;
  std::shared_ptr<MoeLayer> layer;
  Tensor x;
  try {
    if (mpi.rank == 0) check_outputs(opt);
    apply_threads_option(opt.threads_option, opt.threads);
    layer = std::make_shared<MoeLayer>(load(opt));
    if (mpi.rank == 0)
      x = read_activation(fail_prefix(), "input", opt.input, layer->config().hidden_size, opt.model, opt.layer);
  } catch (...) {
    err = std::current_exception();
  }
  dist::agree(MPI_COMM_WORLD, err);
  const std::int64_t D = layer->config().hidden_size, K = layer->config().router.top_k;
  std::int64_t T = mpi.rank == 0 ? x.view().rows() : 0;
  MPI_Bcast(&T, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::vector<int> rows(static_cast<std::size_t>(mpi.size)), first(static_cast<std::size_t>(mpi.size), 0);
  for (int r = 0; r < mpi.size; ++r) rows[r] = as_count(T / mpi.size + (r < T % mpi.size ? 1 : 0));
  for (int r = 1; r < mpi.size; ++r) first[r] = first[r - 1] + rows[r - 1];
  const auto scaled = [&](std::int64_t f, std::vector<int>& c, std::vector<int>& d) {
    for (int r = 0; r < mpi.size; ++r) {
      c[r] = as_count(rows[r] * f);
      d[r] = as_count(first[r] * f);
    }
  };
  std::vector<int> cx(rows.size()), dx(rows.size()), ck(rows.size()), dk(rows.size());
  scaled(D, cx, dx);
  scaled(K, ck, dk);
  const std::int64_t mine = rows[mpi.rank];
  Tensor slice({mine, D}, DType::f32);
  MPI_Scatterv(mpi.rank == 0 ? x.data() : nullptr, cx.data(), dx.data(), MPI_FLOAT, slice.data(), cx[mpi.rank],
               MPI_FLOAT, 0, MPI_COMM_WORLD);
  const dist::ExpertParallelLayer ep(layer, dist::ExpertPlacement::contiguous(layer->config().router.num_experts,
                                                                             mpi.size),
                                     MPI_COMM_WORLD);
  ForwardInfo part;
  const Tensor y_part = ep.forward(slice, &part);
  Tensor y, ids, weights;
  if (mpi.rank == 0) {
    y = Tensor({T, D}, DType::f32);
    ids = Tensor({T, K}, DType::i32);
    weights = Tensor({T, K}, DType::f32);
  }
  MPI_Gatherv(y_part.data(), cx[mpi.rank], MPI_FLOAT, mpi.rank == 0 ? y.data() : nullptr, cx.data(), dx.data(),
              MPI_FLOAT, 0, MPI_COMM_WORLD);
  MPI_Gatherv(part.routing.ids.data(), ck[mpi.rank], MPI_INT32_T, mpi.rank == 0 ? ids.data() : nullptr, ck.data(),
              dk.data(), MPI_INT32_T, 0, MPI_COMM_WORLD);
  MPI_Gatherv(part.routing.weights.data(), ck[mpi.rank], MPI_FLOAT, mpi.rank == 0 ? weights.data() : nullptr,
              ck.data(), dk.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
  try {
    if (mpi.rank == 0) {
      Shape ys = x.shape(), ks = x.shape();
      ks.back() = K;
      y.reshape(ys);
      ids.reshape(ks);
      weights.reshape(ks);
      ForwardInfo info;
      info.routing.ids = ids;
      info.routing.weights = weights;
      write_results(opt, y, info);
    }
  } catch (...) {
    err = std::current_exception();
  }
  dist::agree(MPI_COMM_WORLD, err);
}

void run_forward_mpi(const ForwardOptions& opt) {
  const MpiSession mpi;
  try {
    run_forward_expert_parallel(mpi, opt);
  } catch (const dist::RankError& e) {
    end_failed_job(mpi, e, "");
  }
}
#endif

}  // namespace

void register_forward(CLI::App& app) {
  auto opt = std::make_shared<ForwardOptions>();
  auto* cmd = app.add_subcommand("forward", "Run one MoE layer of a checkpoint on an .npy input");
  cmd->add_option("--model", opt->model, "Checkpoint folder (config.json + *.safetensors)")
      ->required();
  cmd->add_option("--layer", opt->layer, "Decoder layer index (must be an MoE layer)")->required();
  cmd->add_option("--input", opt->input, "X: .npy, f32 (or f16) [..., D]")->required();
  cmd->add_option("--output", opt->output, "Y: .npy, f32, X's shape")->required();
  cmd->add_option("--ids-out", opt->ids_out, "Expert ids: .npy, int32 [..., K]");
  cmd->add_option("--weights-out", opt->weights_out, "Routing weights: .npy, f32 [..., K]");
  cmd->add_option("--router", opt->router_knobs,
                  "Override a routing knob, KEY=VALUE (repeatable), e.g. mask_fill=legacy_zero to reproduce "
                  "mlx-lm; see docs/routing.md");
  cmd->add_flag("--pack", opt->pack,
                "Repack the experts into the forward kernel's panels first (faster prefill; the expert "
                "bytes become resident instead of read in place from the mapped file)");
  cmd->add_flag("--int8", opt->int8,
                "The fast mode for MLX-quantized experts: int8 activations and integer dot products for 4- and "
                "8-bit codes where an expert has few rows (error bound: docs/numerics.md); the router stays exact");
  cmd->add_flag("--bf16-activations", opt->bf16_activations,
                "The bf16 compute mode for bf16 checkpoints, as torch and MLX run them: the experts' input rows "
                "and intermediate rounded to bf16, bf16 x bf16 products summed in fp32 (AMX or AVX512-BF16 where "
                "the CPU has them); the router stays fp32 (docs/numerics.md)");
  cmd->add_flag("--expert-parallel", opt->expert_parallel,
                "Run under mpirun with the routed experts split over the ranks in contiguous blocks (MPI; "
                "docs/distributed.md): rank 0 reads the input and writes the outputs, which equal the "
                "single-process run byte for byte");
  opt->threads_option = add_threads_option(*cmd, opt->threads);
  cmd->callback([opt] {
    if (!opt->expert_parallel) return run_forward(*opt);
#ifdef MOEKIT_HAVE_DIST
    run_forward_mpi(*opt);
#else
    throw std::invalid_argument(fail_prefix() + "--expert-parallel: this moekit was built without MPI "
                                "(-DMOEKIT_WITH_MPI=OFF)");
#endif
  });
}

}  // namespace moekit::cli
