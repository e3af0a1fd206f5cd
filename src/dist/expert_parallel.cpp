// Expert parallelism over MPI (moekit/dist.hpp, docs/distributed.md).
//
// One forward on every rank:
//   route (own tokens)  → agree → counts (Alltoall) → agree → rows + weights (Alltoallv)
//   → local experts (run_sorted_rows, each expert's rows in rank order) → agree
//   → outputs back (Alltoallv) → combine in slot order (combine_rows) → shared experts → agree
// Rows leave grouped by destination rank, then by expert (ascending id), then in the rank's own
// pair order (t·K + k), so an owner that reads, for each of its experts, the blocks of rank 0,
// 1, ... in turn hands that expert the rows in the single-process layer's order.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "dist/mpi_util.hpp"
#include "experts/expert_rows.hpp"
#include "moekit/dist.hpp"
#include "train/backward_parts.hpp"
#include "util/error.hpp"

namespace moekit::dist {

namespace {

using mpi_util::comm_rank;
using mpi_util::comm_size;
using mpi_util::copy_rows;
using mpi_util::mpi_count;

// Grows a buffer kept between forwards (its pages stay mapped: no zero-filling and first-touch
// faults per call); never shrinks.
void grow(std::vector<float>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
}

}  // namespace

ExpertParallelLayer::ExpertParallelLayer(std::shared_ptr<const MoeLayer> layer, ExpertPlacement placement,
                                         MPI_Comm comm)
    : layer_(std::move(layer)), placement_(std::move(placement)) {
  MPI_Comm_dup(comm, &comm_);
  rank_ = comm_rank(comm_);
  size_ = comm_size(comm_);
  std::exception_ptr err;
  try {
    if (!layer_) throw std::invalid_argument("[moekit::dist::ExpertParallelLayer] no layer");
    const MoeConfig& cfg = layer_->config();
    const std::int64_t E = cfg.router.num_experts;
    if (placement_.num_ranks != size_)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::ExpertParallelLayer] placement is for "
                                             << placement_.num_ranks << " ranks, the communicator has " << size_));
    if (static_cast<std::int64_t>(placement_.owner.size()) != E)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::ExpertParallelLayer] placement has "
                                             << placement_.owner.size() << " experts, the layer " << E));
    for (int r = 0; r < size_; ++r) owned_.push_back(placement_.experts_of(r));
    mine_ = owned_[static_cast<std::size_t>(rank_)];
    local_ = select_experts(layer_->weights().experts, mine_);
  } catch (...) {
    err = std::current_exception();
  }
  try {
    agree(comm_, err);
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
  // Every rank must describe the same layer and placement: compare a signature.
  const MoeConfig& cfg = layer_->config();
  std::uint64_t hash = 0;
  for (std::size_t e = 0; e < placement_.owner.size(); ++e)
    hash = hash * 1000003u + static_cast<std::uint64_t>(placement_.owner[e]) + 1u;
  std::int64_t sig[6] = {cfg.hidden_size, cfg.expert_width, cfg.router.num_experts, cfg.router.top_k,
                         cfg.shared_width, static_cast<std::int64_t>(hash >> 1)};
  std::int64_t lo[6], hi[6];
  MPI_Allreduce(sig, lo, 6, MPI_INT64_T, MPI_MIN, comm_);
  MPI_Allreduce(sig, hi, 6, MPI_INT64_T, MPI_MAX, comm_);
  if (!std::equal(lo, lo + 6, hi)) {
    static const char* names[6] = {"hidden_size", "expert_width", "num_experts", "top_k", "shared_width",
                                   "expert placement"};
    int i = 0;
    while (lo[i] == hi[i]) ++i;
    MPI_Comm_free(&comm_);
    throw RankError(0, MOEKIT_MSG("[moekit::dist::ExpertParallelLayer] the ranks disagree on " << names[i]));
  }
}

ExpertParallelLayer::~ExpertParallelLayer() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ExpertParallelLayer::refresh_biases() const {
  const ExpertWeights& w = layer_->weights().experts;
  for (auto [from, to] :
       {std::pair{&w.gate_bias, &local_.gate_bias}, std::pair{&w.up_bias, &local_.up_bias},
        std::pair{&w.down_bias, &local_.down_bias}}) {
    if (to->numel() > 0) copy_rows(*from, mine_, *to);
  }
}

Tensor ExpertParallelLayer::collective_forward(const std::function<Tensor(const MoeLayer::RoutedExperts&)>& run) const {
  times_ = PhaseTimes{};
  refresh_biases();
  started_ = MPI_Wtime();
  Tensor y;
  std::exception_ptr err;
  try {
    y = run([this](const TensorView& xs, const Routing& r, const TensorView& ys) { routed(xs, r, ys); });
  } catch (const RankError&) {
    throw;  // agreed on inside the exchange: every rank throws it
  } catch (...) {
    err = std::current_exception();
  }
  // Whatever failed outside the exchange — before it (the other ranks wait in its first
  // agreement) or after it (the shared experts) — meets the others here.
  agree(comm_, err);
  times_.combine =
      MPI_Wtime() - started_ - times_.route - times_.exchange_out - times_.compute - times_.exchange_back;
  return y;
}

Tensor ExpertParallelLayer::forward(const TensorView& x, ForwardInfo* info) const {
  return collective_forward([&](const MoeLayer::RoutedExperts& r) { return layer_->forward_with(x, r, info); });
}

Tensor ExpertParallelLayer::forward_train(const TensorView& x, DistSavedForward& saved, bool keep_pre_activations) const {
  return forward_train(x, saved.home, saved, keep_pre_activations);
}

Tensor ExpertParallelLayer::forward_train(const TensorView& x, SavedForward& home,
                                          DistSavedForward& saved,
                                          bool keep_pre_activations) const {
  saved = DistSavedForward{};
  saving_ = &saved;
  keep_pre_ = keep_pre_activations;
  struct Reset {
    const ExpertParallelLayer* l;
    ~Reset() { l->saving_ = nullptr; }
  } reset{this};
  Tensor y = collective_forward([&](const MoeLayer::RoutedExperts& r) {
    return layer_->forward_train_with(x, home, r, keep_pre_activations);
  });
  saved.filled = true;
  return y;
}

namespace {

void sum_in_rank_order(MPI_Comm comm, Tensor& part) {
  mpi_util::sum_in_rank_order(comm, part.data_as<float>(), part.numel());
}

// The exchange's two ways, each rank's counts and displacements (in floats) given as the home
// side (the rank of the tokens) sees them: `home` what it sends out and gets back, `owner` what
// the experts' side receives and returns.
void to_owners(MPI_Comm comm, const float* from, float* to, const std::vector<int>& home,
               const std::vector<int>& home_displ, const std::vector<int>& owner, const std::vector<int>& owner_displ) {
  MPI_Alltoallv(from, home.data(), home_displ.data(), MPI_FLOAT, to, owner.data(), owner_displ.data(), MPI_FLOAT, comm);
}

void to_home(MPI_Comm comm, const float* from, float* to, const std::vector<int>& home,
             const std::vector<int>& home_displ, const std::vector<int>& owner, const std::vector<int>& owner_displ) {
  MPI_Alltoallv(from, owner.data(), owner_displ.data(), MPI_FLOAT, to, home.data(), home_displ.data(), MPI_FLOAT, comm);
}

// The owners' R expert-sorted rows (D floats each) back in receive order: sorted row i to row
// src[i] of `out`.
void to_receive_order(const float* sorted, const std::int32_t* src, std::int64_t R, std::int64_t D, float* out) {
  for (std::int64_t i = 0; i < R; ++i)
    std::memcpy(out + static_cast<std::int64_t>(src[i]) * D, sorted + i * D,
                static_cast<std::size_t>(D) * sizeof(float));
}

// One forward's exchange as this rank sees it: the send row of each of its (token, slot) pairs,
// and the rows (and f32 elements, D per row) it sends to and receives from each rank.
struct Exchange {
  Exchange(std::int64_t pairs, std::size_t P, std::size_t Emax)
      : position(static_cast<std::size_t>(pairs)),
        send_rows(P, 0),
        send_displ(P, 0),
        send_counts(P * std::max<std::size_t>(Emax, 1), 0) {}
  std::vector<std::int64_t> position;                  // [T·K] pair -> send row
  std::vector<int> send_rows, send_displ;              // [P] rows to each rank
  std::vector<std::int64_t> send_counts, recv_counts;  // [P, Emax] rows for each of a rank's experts
  std::vector<int> recv_rows, recv_displ;              // [P] rows from each rank
  std::vector<int> sx, sxd, rx, rxd;                   // [P] f32 elements to / from each rank
  std::int64_t R = 0;                                  // rows received
};

// This rank's rows and slot weights in send order (destination rank, then its experts ascending,
// then pair order) into send_x / send_w; the pairs' send rows and the counts per rank and expert
// into `ex`.
void pack_rows(const TensorView& x, const Routing& routing, const std::vector<std::vector<std::int64_t>>& owned,
               std::int64_t E, std::int64_t K, std::int64_t D, std::size_t Emax, std::vector<float>& send_x,
               std::vector<float>& send_w, Exchange& ex) {
  const std::int64_t T = x.dim(0);
  const DispatchPlan plan = plan_dispatch(routing.ids, E);
  grow(send_x, T * K * D);
  grow(send_w, T * K);
  const float* xs = x.data_as<const float>();
  const float* ws = routing.weights.data_as<const float>();
  std::int64_t row = 0;
  for (std::size_t d = 0; d < ex.send_rows.size(); ++d) {
    const std::int64_t first = row;
    for (std::size_t i = 0; i < owned[d].size(); ++i) {
      const std::int64_t e = owned[d][i];
      for (std::int64_t j = plan.offsets[e]; j < plan.offsets[e + 1]; ++j, ++row) {
        const std::int64_t pair = plan.sorted_pairs[static_cast<std::size_t>(j)];
        ex.position[static_cast<std::size_t>(pair)] = row;
        std::memcpy(send_x.data() + row * D, xs + (pair / K) * D, static_cast<std::size_t>(D) * sizeof(float));
        send_w[static_cast<std::size_t>(row)] = ws[pair];
      }
      ex.send_counts[d * Emax + i] = plan.counts[static_cast<std::size_t>(e)];
    }
    ex.send_rows[d] = mpi_count(row - first, "rows to one rank");
    mpi_count((row - first) * D, "row elements to one rank");
  }
}

// Collective: the counts (block d of what rank s sends holds, for each of d's experts, how many
// rows), then the rows and elements each way with their displacements; `local` this rank's
// number of experts, `pairs` its rows sent (T·K).
void exchange_counts(MPI_Comm comm, std::size_t local, std::size_t Emax, std::int64_t D, std::int64_t pairs,
                     Exchange& ex) {
  const std::size_t P = ex.send_rows.size();
  ex.recv_counts.assign(ex.send_counts.size(), 0);  // [P, Emax]: from s, per local expert
  const int block = static_cast<int>(std::max<std::size_t>(Emax, 1));
  MPI_Alltoall(ex.send_counts.data(), block, MPI_INT64_T, ex.recv_counts.data(), block, MPI_INT64_T, comm);
  ex.recv_rows.assign(P, 0);
  ex.recv_displ.assign(P, 0);
  for (std::vector<int>* v : {&ex.sx, &ex.sxd, &ex.rx, &ex.rxd}) v->assign(P, 0);
  std::exception_ptr err;
  try {
    for (std::size_t s = 0; s < P; ++s) {
      std::int64_t n = 0;
      for (std::size_t i = 0; i < local; ++i) n += ex.recv_counts[s * Emax + i];
      ex.recv_rows[s] = mpi_count(n, "rows from one rank");
      mpi_count(n * D, "row elements from one rank");
      ex.R += n;
    }
    for (std::size_t r = 1; r < P; ++r) {
      ex.send_displ[r] = ex.send_displ[r - 1] + ex.send_rows[r - 1];
      ex.recv_displ[r] = ex.recv_displ[r - 1] + ex.recv_rows[r - 1];
    }
    mpi_count(ex.R * D, "all row elements received");
    mpi_count(pairs * D, "all row elements sent");
    for (std::size_t r = 0; r < P; ++r) {
      ex.sx[r] = static_cast<int>(ex.send_rows[r] * D);
      ex.sxd[r] = static_cast<int>(ex.send_displ[r] * D);
      ex.rx[r] = static_cast<int>(ex.recv_rows[r] * D);
      ex.rxd[r] = static_cast<int>(ex.recv_displ[r] * D);
    }
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm, err);
}

// The received rows in expert order: for each local expert, the blocks of rank 0, 1, ... in turn.
struct ExpertOrder {
  std::vector<std::int64_t> offsets;  // [E_local + 1] rows of each local expert
  std::vector<std::int32_t> src;      // [R] expert-sorted row -> receive row
  std::vector<float> wt;              // [R] its slot weight
};

ExpertOrder sort_by_expert(const Exchange& ex, const float* recv_w, std::size_t local, std::size_t Emax) {
  ExpertOrder o;
  o.offsets.assign(local + 1, 0);
  o.src.resize(static_cast<std::size_t>(ex.R));
  o.wt.resize(static_cast<std::size_t>(ex.R));
  std::int64_t i = 0;
  for (std::size_t le = 0; le < local; ++le) {
    for (std::size_t s = 0; s < ex.recv_displ.size(); ++s) {
      std::int64_t at = ex.recv_displ[s];
      for (std::size_t j = 0; j < le; ++j) at += ex.recv_counts[s * Emax + j];
      for (std::int64_t c = 0; c < ex.recv_counts[s * Emax + le]; ++c, ++i) {
        o.src[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(at + c);
        o.wt[static_cast<std::size_t>(i)] = recv_w[at + c];
      }
    }
    o.offsets[le + 1] = i;
  }
  return o;
}

// forward_train keeping the pre-activations: [R, F] in `sv` for the experts to write into
// ({gate, up}; gate null where the experts have none).
std::pair<float*, float*> keep_pre_activations(DistSavedForward& sv, std::int64_t R, std::int64_t F, bool gate) {
  sv.pre_up = Tensor::uninitialized({R, F}, DType::f32);
  float* keep_up = sv.pre_up.data_as<float>();
  float* keep_gate = nullptr;
  if (gate) {
    sv.pre_gate = Tensor::uninitialized({R, F}, DType::f32);
    keep_gate = sv.pre_gate.data_as<float>();
  }
  return {keep_gate, keep_up};
}

// What backward() needs of a forward_train: the received rows, their expert order and the exchange.
void save_exchange(DistSavedForward& sv, const Exchange& ex, const ExpertOrder& order, const float* rows,
                   std::int64_t T, std::int64_t D) {
  const std::int64_t R = ex.R;
  sv.rows = Tensor::uninitialized({R, D}, DType::f32);
  if (R > 0) std::memcpy(sv.rows.data(), rows, static_cast<std::size_t>(R * D) * sizeof(float));
  sv.src = order.src;
  sv.row_weight = order.wt;
  sv.offsets = order.offsets;
  sv.position = ex.position;
  sv.sx = ex.sx;
  sv.sxd = ex.sxd;
  sv.rx = ex.rx;
  sv.rxd = ex.rxd;
  sv.send_rows = ex.send_rows;
  sv.send_displ = ex.send_displ;
  sv.recv_rows = ex.recv_rows;
  sv.recv_displ = ex.recv_displ;
  sv.T = T;
  sv.R = R;
}

}  // namespace

Tensor ExpertParallelLayer::backward(const DistSavedForward& saved, const TensorView& dy,
                                     MoeTensors& grads, const BackwardOptions& options) const {
  return backward(saved, saved.home, dy, grads, options);
}

Tensor ExpertParallelLayer::backward(const DistSavedForward& saved, const SavedForward& home,
                                     const TensorView& dy_in, MoeTensors& grads,
                                     const BackwardOptions& options) const {
  const MoeConfig& cfg = layer_->config();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts, K = cfg.router.top_k;
  std::exception_ptr err;
  Tensor dy_owned;
  const float* dy = nullptr;
  MoeTensors part;  // this rank's partial router and shared-expert gradients
  MoeTensors g = grads;
  const std::int64_t T = saved.T, R = saved.R;
  try {
    detail::check_float_weights("dist::backward", *layer_);
    if (!saved.filled || static_cast<std::int64_t>(saved.position.size()) != T * K ||
        saved.rows.numel() != R * D || saved.offsets.size() != mine_.size() + 1)
      throw std::invalid_argument("[moekit::dist::backward] saved state does not belong to this layer: fill it with "
                                  "this layer's forward_train");
    dy = detail::checked_dy("dist::backward", dy_in, home.shape, T, D, E, options, dy_owned);
    detail::check_grads("dist::backward", *layer_, static_cast<std::int64_t>(mine_.size()), g);
    for (auto [from, to] : {std::pair{&g.router, &part.router}, std::pair{&g.router_bias, &part.router_bias},
                            std::pair{&g.shared_gate_proj, &part.shared_gate_proj},
                            std::pair{&g.shared_up_proj, &part.shared_up_proj},
                            std::pair{&g.shared_down_proj, &part.shared_down_proj},
                            std::pair{&g.shared_gate, &part.shared_gate}})
      if (from->numel() > 0 && size_ > 1) *to = Tensor(from->shape(), DType::f32);  // (one rank: into g)
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm_, err);

  // dy's rows to the owners, in the forward's layout.
  std::vector<float> send_dy(static_cast<std::size_t>(T * K * D)), recv_dy(static_cast<std::size_t>(R * D));
  for (std::int64_t p = 0; p < T * K; ++p)
    std::memcpy(send_dy.data() + saved.position[static_cast<std::size_t>(p)] * D, dy + (p / K) * D,
                static_cast<std::size_t>(D) * sizeof(float));
  to_owners(comm_, send_dy.data(), recv_dy.data(), saved.sx, saved.sxd, saved.rx, saved.rxd);

  // The owners: each local expert's backward over its rows, as in one process.
  std::vector<float> back_dx(static_cast<std::size_t>(R * D)), back_dg(static_cast<std::size_t>(R));
  try {
    std::vector<float> pair_dx(static_cast<std::size_t>(R * D)), pair_dg(static_cast<std::size_t>(R));
    detail::backward_sorted_rows(local_, layer_->body(), saved.rows.data_as<const float>(), saved.src.data(),
                                 saved.row_weight.data(), cfg.router.weight_on_input, saved.offsets,
                                 saved.pre_gate.numel() > 0 ? saved.pre_gate.data_as<const float>() : nullptr,
                                 saved.pre_up.numel() > 0 ? saved.pre_up.data_as<const float>() : nullptr,
                                 recv_dy.data(), pair_dx.data(), pair_dg.data(), detail::expert_sink(g),
                                 options.accumulate, layer_->compute_mode());
    to_receive_order(pair_dx.data(), saved.src.data(), R, D, back_dx.data());
    for (std::int64_t i = 0; i < R; ++i)
      back_dg[static_cast<std::size_t>(saved.src[static_cast<std::size_t>(i)])] = pair_dg[static_cast<std::size_t>(i)];
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm_, err);

  // dL/d(row) and dL/d(slot weight) back home; the rest of the block there.
  std::vector<float> home_dx(static_cast<std::size_t>(T * K * D)), home_dg(static_cast<std::size_t>(T * K));
  to_home(comm_, back_dx.data(), home_dx.data(), saved.sx, saved.sxd, saved.rx, saved.rxd);
  to_home(comm_, back_dg.data(), home_dg.data(), saved.send_rows, saved.send_displ, saved.recv_rows, saved.recv_displ);
  Tensor dx;
  try {
    // One rank: the router and shared gradients straight into g (accumulating as one process
    // does, the same bits); more: this rank's partials, summed below.
    dx = size_ == 1 ? detail::backward_tail(*layer_, home, dy, home_dx.data(), home_dg.data(),
                                            saved.position.data(), g, options.accumulate, options)
                    : detail::backward_tail(*layer_, home, dy, home_dx.data(), home_dg.data(),
                                            saved.position.data(), part, false, options);
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm_, err);

  // The whole batch's router and shared gradients: partial sums added in rank order.
  const auto reduce = [&](Tensor& p, Tensor& into) {
    if (p.numel() == 0 || size_ == 1) return;
    sum_in_rank_order(comm_, p);
    float* dst = into.data_as<float>();
    const float* src = p.data_as<const float>();
    for (std::int64_t i = 0; i < p.numel(); ++i)
      dst[i] = options.accumulate ? dst[i] + src[i] : src[i];
  };
  reduce(part.router, g.router);
  reduce(part.router_bias, g.router_bias);
  reduce(part.shared_gate_proj, g.shared_gate_proj);
  reduce(part.shared_up_proj, g.shared_up_proj);
  reduce(part.shared_down_proj, g.shared_down_proj);
  reduce(part.shared_gate, g.shared_gate);
  grads = g;
  dx.reshape(home.shape);
  return dx;
}

void ExpertParallelLayer::routed(const TensorView& x, const Routing& routing, const TensorView& y) const {
  const MoeConfig& cfg = layer_->config();
  const std::int64_t T = x.dim(0), D = cfg.hidden_size, K = cfg.router.top_k, E = cfg.router.num_experts;
  const auto P = static_cast<std::size_t>(size_);
  const std::size_t Emax = std::max_element(owned_.begin(), owned_.end(), [](const auto& a, const auto& b) {
                             return a.size() < b.size();
                           })->size();

  // Send order: destination rank, then its experts ascending, then pair order.
  Exchange ex(T * K, P, Emax);
  Buffers& b = buffers_;
  std::exception_ptr err;
  try {
    pack_rows(x, routing, owned_, E, K, D, Emax, b.send_x, b.send_w, ex);
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm_, err);
  times_.route = MPI_Wtime() - started_;  // input checks and router included

  // Counts, then the rows and their slot weights to the experts' owners.
  const double t_out = MPI_Wtime();
  exchange_counts(comm_, mine_.size(), Emax, D, T * K, ex);
  const std::int64_t R = ex.R;
  grow(b.recv_x, R * D);
  grow(b.recv_w, R);
  to_owners(comm_, b.send_x.data(), b.recv_x.data(), ex.sx, ex.sxd, ex.rx, ex.rxd);
  to_owners(comm_, b.send_w.data(), b.recv_w.data(), ex.send_rows, ex.send_displ, ex.recv_rows, ex.recv_displ);
  times_.exchange_out = MPI_Wtime() - t_out;
  times_.rows_sent = T * K;
  times_.rows_received = R;
  times_.bytes_sent = T * K * (D + 1) * 4;
  times_.bytes_received = R * (D + 1) * 4;

  // The local experts: for each, the blocks of rank 0, 1, ... in turn.
  const double t_compute = MPI_Wtime();
  grow(b.back, R * D);
  try {
    const ExpertOrder order = sort_by_expert(ex, b.recv_w.data(), mine_.size(), Emax);
    grow(b.out, R * D);
    float* keep_gate = nullptr;
    float* keep_up = nullptr;
    if (saving_ && keep_pre_)
      std::tie(keep_gate, keep_up) = keep_pre_activations(*saving_, R, cfg.expert_width, local_.gate.defined());
    if (R > 0)
      run_sorted_rows(local_, layer_->body(), b.recv_x.data(), order.src.data(), order.wt.data(),
                      cfg.router.weight_on_input, order.offsets, b.out.data(), keep_gate, keep_up,
                      layer_->compute_mode());
    if (saving_) save_exchange(*saving_, ex, order, b.recv_x.data(), T, D);
    to_receive_order(b.out.data(), order.src.data(), R, D, b.back.data());
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm_, err);
  times_.compute = MPI_Wtime() - t_compute;

  // Outputs back in the order they came; then the combine in slot order.
  const double t_back = MPI_Wtime();
  grow(b.mine_out, T * K * D);
  to_home(comm_, b.back.data(), b.mine_out.data(), ex.sx, ex.sxd, ex.rx, ex.rxd);
  times_.exchange_back = MPI_Wtime() - t_back;
  times_.bytes_sent += R * D * 4;
  times_.bytes_received += T * K * D * 4;
  combine_rows(b.mine_out.data(), ex.position.data(), T, K, D, y.data_as<float>(), false);
}

}  // namespace moekit::dist
