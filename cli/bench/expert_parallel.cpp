// `mpirun -np N moekit bench --expert-parallel`: the exchange's latency and bandwidth, then per
// shape, dtype and T per rank the time of each phase of an expert-parallel forward (route,
// exchange out, experts, exchange back, combine), rows and bytes sent, resident memory.
#include "bench/bench.hpp"

#ifdef MOEKIT_HAVE_DIST
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "expert_parallel.hpp"
#include "format.hpp"
#include "git_commit.hpp"  // MOEKIT_GIT_COMMIT, generated at build time (cli/CMakeLists.txt)
#include "moekit/dist.hpp"
#endif

namespace moekit::cli::bench {

#ifdef MOEKIT_HAVE_DIST
namespace {

// The bench layer of shape `s` on one rank of an expert-parallel job: the router and shared
// experts whole, the routed experts this rank owns filled with random weights, every other
// expert pointing at the first of them (valid memory, never read), so a rank holds ~1/N of the
// routed bytes.
std::shared_ptr<MoeLayer> build_rank_layer(const BenchShape& s, const WeightFormat& format, std::uint64_t seed,
                                           const dist::ExpertPlacement& placement, int rank) {
  MoeConfig cfg = synth::config_of(s);
  const std::int64_t D = s.D, E = s.E;
  const std::vector<std::int64_t> mine = placement.experts_of(rank);
  const std::int64_t n = std::max<std::int64_t>(1, static_cast<std::int64_t>(mine.size()));
  std::uint64_t stream = seed * 1000 + 1 + static_cast<std::uint64_t>(rank) * 7919;
  std::uint64_t shared_stream = seed * 1000 + 1;  // router, biases, shared experts: the same on every rank
  MoeWeights w = synth::random_router(cfg, format.spec(), shared_stream);
  // Expert e of the layer is matrix expert `slot[e]`: its own where this rank owns e, else the first.
  std::vector<std::int64_t> slot(static_cast<std::size_t>(E), 0);
  for (std::size_t i = 0; i < mine.size(); ++i) slot[static_cast<std::size_t>(mine[i])] = static_cast<std::int64_t>(i);
  const auto spread = [&](const ExpertMatrix& m) { return m.select(slot); };
  w.experts.gate = spread(synth::random_matrix(format.spec(), n, s.F, D, stream, w.experts.keep_alive));
  w.experts.up = spread(synth::random_matrix(format.spec(), n, s.F, D, stream, w.experts.keep_alive));
  w.experts.down = spread(synth::random_matrix(format.spec(), n, D, s.F, stream, w.experts.keep_alive));
  if (cfg.shared_width > 0) w.shared = synth::random_experts(format.spec(), 1, cfg.shared_width, D, shared_stream);
  auto layer = std::make_shared<MoeLayer>(std::move(cfg), std::move(w));
  if (format.int8) layer->set_int8_activations(true);
  if (format.bf16_act) layer->set_bf16_activations(true);
  return layer;
}

// Seconds of one collective exchange of `bytes` per rank pair (MPI_Alltoall), best of `reps`.
double time_alltoall(std::size_t bytes, int reps) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  std::vector<char> out(bytes * static_cast<std::size_t>(P), 1), in(out.size());
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Alltoall(out.data(), static_cast<int>(bytes), MPI_BYTE, in.data(), static_cast<int>(bytes), MPI_BYTE,
                 MPI_COMM_WORLD);
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 0) best = std::min(best, t);
  }
  return best;
}

// Half a round trip of `bytes` between ranks 0 and 1 (ping-pong), best of `reps`.
double time_pingpong(std::size_t bytes, int reps) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<char> buf(std::max<std::size_t>(bytes, 1));
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 7, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 7, MPI_COMM_WORLD);
    }
    double t = (MPI_Wtime() - t0) / 2;
    MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (r > 0) best = std::min(best, t);
  }
  return best;
}

std::int64_t resident_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      std::int64_t kb = 0;
      in >> kb;
      return kb;
    }
    in.ignore(1 << 16, '\n');
  }
  return -1;
}

// What --expert-parallel's options ask for, parsed and checked.
struct EpPlan {
  std::vector<const BenchShape*> shapes;
  std::vector<WeightFormat> dtypes;
  std::vector<std::int64_t> tokens;
  int reps = 0, threads = 0;
  std::uint64_t seed = 0;
};

EpPlan check_ep_options(const Options& o) {
  EpPlan p;
  p.shapes = parse_shapes(o.shape);
  p.dtypes = parse_dtypes(o.dtype);
  p.tokens = parse_int_list(o.tokens.empty() ? "1,32,512" : o.tokens, "--tokens", 1, 1 << 20);
  const std::vector<std::int64_t> t = parse_int_list(o.threads, "--threads", 1, 4096);
  if (t.size() != 1) throw std::invalid_argument("--expert-parallel takes one --threads value (threads per rank)");
  p.threads = static_cast<int>(t[0]);
  p.reps = static_cast<int>(parse_int(o.reps, "--reps", 1, 1000));
  p.seed = static_cast<std::uint64_t>(parse_int(o.seed, "--seed", 0, INT64_MAX));
  if (o.mode != "forward") throw std::invalid_argument("--expert-parallel measures the forward only");
  if (o.output != "md") throw std::invalid_argument("--expert-parallel prints markdown only (-o md)");
  for (const WeightFormat& d : p.dtypes)
    if (d.bf16_act && o.layout != "rows" && o.layout != "panels") throw std::invalid_argument("bad --layout");
  return p;
}

// The header, then the exchange's latency and bandwidth (MPI_Alltoall, and ping-pong between
// ranks 0 and 1 where there are two).
void print_exchange(const MpiSession& mpi, const EpPlan& p) {
  const int P = mpi.size;
  if (mpi.rank == 0) {
    std::printf("moekit bench --expert-parallel (commit %s)\n\n", MOEKIT_GIT_COMMIT);
    std::printf("- machine: %s; %d ranks x %d threads (mpirun); one MPI_COMM_WORLD\n", cpu_model().c_str(), P,
                p.threads);
    std::printf(
        "- each rank routes its own T tokens (data parallel) and owns a contiguous block of experts;\n"
        "  phase times are the slowest rank's, medians of %d forwards after one warm-up\n\n",
        p.reps);
    std::printf("| exchange (same run) | bytes per rank pair | time | per-rank bandwidth |\n|---|---|---|---|\n");
  }
  for (const std::size_t b : {std::size_t{8}, std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20,
                              std::size_t{8} << 20}) {
    const double t = time_alltoall(b, 5);
    if (mpi.rank == 0)
      std::printf("| MPI_Alltoall | %s | %.1f us | %.2f GB/s |\n", format_bytes(b).c_str(), t * 1e6,
                  static_cast<double>(b) * (P - 1) / t * 1e-9);
  }
  if (P >= 2)
    for (const std::size_t b : {std::size_t{8}, std::size_t{1} << 20}) {
      const double t = time_pingpong(b, 20);
      if (mpi.rank == 0)
        std::printf("| ping-pong rank 0 <-> 1 (half round trip) | %s | %.1f us | %.2f GB/s |\n", format_bytes(b).c_str(),
                    t * 1e6, static_cast<double>(b) / t * 1e-9);
    }
}

// One row of the phase table: `reps` forwards of T fresh tokens per rank after one warm-up, each
// phase the slowest rank's, their medians printed by rank 0.
void time_phases(const MpiSession& mpi, const dist::ExpertParallelLayer& ep, const BenchShape& s, const WeightFormat& d,
                 std::int64_t T, const EpPlan& p, std::int64_t rss_max) {
  Tensor x = Tensor::uninitialized({T, s.D}, DType::f32);
  std::vector<double> phase[6];
  std::int64_t rows = 0, bytes = 0;
  for (int r = 0; r < p.reps + 1; ++r) {
    synth::fill_uniform(x, 1.0f,
                        p.seed * 1000 + 500 + static_cast<std::uint64_t>(mpi.rank) * 131 + r);  // fresh routing
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    (void)ep.forward(x);
    const double total = MPI_Wtime() - t0;
    const dist::PhaseTimes& pt = ep.last_times();
    double v[6] = {total, pt.route, pt.exchange_out, pt.compute, pt.exchange_back, pt.combine};
    MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r == 0) continue;
    for (int i = 0; i < 6; ++i) phase[i].push_back(v[i]);
    rows = pt.rows_sent;
    bytes = pt.bytes_sent;
  }
  std::int64_t mx[2] = {rows, bytes};
  MPI_Allreduce(MPI_IN_PLACE, mx, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (mpi.rank == 0) {
    double med[6];
    for (int i = 0; i < 6; ++i) med[i] = median_of(phase[i]) * 1e3;
    std::printf("| %s | %s | %lld | %s | %s | %s | %s | %s | %s | %.2f | %lld | %.1f | %lld |\n", s.name,
                d.name().c_str(), static_cast<long long>(T), sig3(med[0]).c_str(), sig3(med[1]).c_str(),
                sig3(med[2]).c_str(), sig3(med[3]).c_str(), sig3(med[4]).c_str(), sig3(med[5]).c_str(),
                (med[2] + med[4]) / std::max(1e-9, med[3]), static_cast<long long>(mx[0]),
                static_cast<double>(mx[1]) * 1e-6, static_cast<long long>(rss_max / 1024));
  }
}

// The rows of one shape and dtype: this rank's part of the layer built, the largest resident
// memory over the ranks, then each T.
void bench_layer(const MpiSession& mpi, const BenchShape& s, const WeightFormat& d, const EpPlan& p) {
  const dist::ExpertPlacement placement = dist::ExpertPlacement::contiguous(s.E, mpi.size);
  std::shared_ptr<MoeLayer> layer;
  std::exception_ptr err;
  try {
    layer = build_rank_layer(s, d, p.seed, placement, mpi.rank);
  } catch (...) {
    err = std::current_exception();
  }
  dist::agree(MPI_COMM_WORLD, err);
  const std::int64_t rss = resident_kib();
  std::int64_t rss_max = 0;
  MPI_Reduce(&rss, &rss_max, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
  const dist::ExpertParallelLayer ep(layer, placement, MPI_COMM_WORLD);
  for (const std::int64_t T : p.tokens) time_phases(mpi, ep, s, d, T, p, rss_max);
}

void run_bench_expert_parallel(const MpiSession& mpi, const Options& o) {
  std::exception_ptr err;
  EpPlan p;
  try {
    p = check_ep_options(o);
  } catch (...) {
    err = std::current_exception();
  }
  dist::agree(MPI_COMM_WORLD, err);
  set_num_threads(p.threads);
  print_exchange(mpi, p);
  if (mpi.rank == 0)
    std::printf("\n| shape | dtype | T per rank | total ms | route | exchange out | experts | exchange back | "
                "combine + shared | exchange / compute | rows sent per rank | MB sent per rank | resident MiB per rank |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BenchShape* s : p.shapes)
    for (const WeightFormat& d : p.dtypes) bench_layer(mpi, *s, d, p);
  if (mpi.rank == 0)
    std::printf("\nexchange / compute = (exchange out + back) / experts. Resident: the largest VmRSS over the "
                "ranks after building (router, shared experts and 1/N of the routed experts).\n");
}

}  // namespace

void run_expert_parallel(const Options& o) {
  run_mpi_job("[moekit bench] ", [&](const MpiSession& mpi) { run_bench_expert_parallel(mpi, o); });
}
#else
void run_expert_parallel(const Options&) {
  throw std::invalid_argument("--expert-parallel: this moekit was built without MPI (-DMOEKIT_WITH_MPI=OFF)");
}
#endif

}  // namespace moekit::cli::bench
