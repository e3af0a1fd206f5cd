// Grouped expert execution over a DispatchPlan.
//
// Work is cut into tasks of (expert, up to kTaskRows (expert_rows.hpp) of its rows). A task runs
// the gate/up GEMMs over all of its rows at once, reading them from x in place, the activation, the
// down GEMM whose epilogue scales each row by its slot weight, and writes it to its sorted position
// of a [T*K, D] buffer. Every output element is a fixed-order dot product, so neither the chunking
// nor the thread that ran it can change a bit. The combine then sums each token's K rows in slot
// order.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#include "experts/expert_rows.hpp"
#include "experts/weight_matrix.hpp"
#include "kernels/activation.hpp"
#include "kernels/gemm.hpp"
#include "kernels/plan.hpp"
#include "moekit/experts.hpp"
#include "moekit/threading.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"
#include "util/workspace.hpp"

namespace moekit {

namespace {

bool has(const Tensor& t) { return t.numel() > 0; }

}  // namespace

std::size_t ExpertTrace::nbytes() const noexcept {
  return pre_gate.nbytes() + pre_up.nbytes() +
         (plan.counts.size() + plan.offsets.size() + plan.sorted_pairs.size() + plan.inverse.size()) *
             sizeof(std::int64_t);
}

namespace {

// Scratch for one task, reused by the thread across tasks and calls.
struct Scratch {
  std::vector<float> gate, up;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

namespace {

// The bf16 compute mode's rounded rows, per thread (the grouped tasks run one per thread).
std::vector<float>& bf16_rows_scratch() {
  thread_local std::vector<float> v;
  return v;
}

// The rows a projection multiplies in the bf16 compute mode: rounded once per task (for gate
// and up together) in the form the planned path takes (kernels/plan.hpp; the same for every
// matrix of `w`: validate_experts keeps AMX tiles to all or none). Unused in the other modes.
kernels::Bf16Activations rounded(const ExpertWeights& w, const kernels::RowSource& rows, std::int64_t r, std::int64_t K,
                                 ComputeMode mode) {
  if (mode != ComputeMode::bf16) return {};
  const kernels::Bf16Path path = kernels::plan_gemm_nt(weight_matrix(w.up, 0), mode, r, K).bf16;
  auto& buf = bf16_rows_scratch();
  buf.resize((kernels::bf16_activation_bytes(r, K, path) + sizeof(float) - 1) / sizeof(float));
  return kernels::round_to_bf16(rows, r, K, path, buf.data());
}

// rows · Wᵀ for one projection in `mode`: f32 rows (gathered and scaled in place), or their bf16
// rounding.
void project(const ExpertMatrix& m, std::int64_t e, const kernels::RowSource& rows,
             const kernels::Bf16Activations& rows_bf16, std::int64_t r, const kernels::Output& out,
             kernels::Threads threads, ComputeMode mode) {
  const std::int64_t N = m.rows, K = m.cols;
  if (mode == ComputeMode::bf16) {
    kernels::gemm_nt_bf16(rows_bf16, weight_matrix(m, e), out, r, N, K, threads);
  } else {
    kernels::gemm_nt(rows, weight_matrix(m, e), out, r, N, K, threads, mode);
  }
}

}  // namespace

void expert_pre_activations(const ExpertWeights& w, std::int64_t e, const kernels::RowSource& xin, std::int64_t r,
                            float* gate, float* up, bool split, ComputeMode mode) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const kernels::Threads threads = split ? kernels::Threads::pool : kernels::Threads::caller;
  const kernels::Bf16Activations xb = rounded(w, xin, r, D, mode);
  const kernels::ReuseQuantizedRows once;  // the int8 mode quantizes xin once for up and gate
  project(w.up, e, xin, xb, r, {up, F}, threads, mode);
  if (has(w.up_bias)) kernels::add_row_bias(up, r, F, w.up_bias.data_as<const float>() + e * F);
  if (w.gate.defined()) {
    project(w.gate, e, xin, xb, r, {gate, F}, threads, mode);
    if (has(w.gate_bias)) kernels::add_row_bias(gate, r, F, w.gate_bias.data_as<const float>() + e * F);
  }
}

void expert_down(const ExpertWeights& w, std::int64_t e, const float* h, std::int64_t r, float* out,
                 const float* out_scale, bool split, bool accumulate, ComputeMode mode) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const kernels::Threads threads = split ? kernels::Threads::pool : kernels::Threads::caller;
  const kernels::RowSource hin{h, F};
  const kernels::Bf16Activations hb = rounded(w, hin, r, F, mode);
  if (!has(w.down_bias)) {
    project(w.down, e, hin, hb, r, {out, D, out_scale, accumulate}, threads, mode);
    return;
  }
  // The bias sits inside the weighted body, (h·Wᵀ + b)·w, so here the weight comes after it.
  project(w.down, e, hin, hb, r, {out, D, nullptr, accumulate}, threads, mode);
  kernels::add_row_bias(out, r, D, w.down_bias.data_as<const float>() + e * D);
  if (out_scale)
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t d = 0; d < D; ++d) out[i * D + d] *= out_scale[i];
}

namespace {

// r rows of xin (read in place: gathered and scaled as the RowSource says) -> out [r, D] (+)=
// body(rows) · out_scale for expert e. `split` spreads each GEMM's columns over the pool (for
// fewer tasks than threads, and the dense shared expert); the elements and their summation
// order are the same either way. `pre_gate` / `pre_up`, when set, receive the [r, F]
// pre-activations (a training forward's trace) instead of the scratch.
void expert_rows(const ExpertWeights& w, const ExpertBody& body, std::int64_t e, const kernels::RowSource& xin,
                 std::int64_t r, float* out, const float* out_scale, Scratch& s, bool split, bool accumulate,
                 float* pre_gate, float* pre_up, ComputeMode mode) {
  const std::int64_t F = w.width();
  s.up.resize(static_cast<std::size_t>(r * F));
  float* up = pre_up ? pre_up : s.up.data();
  float* gate = nullptr;
  if (w.gate.defined()) {
    s.gate.resize(static_cast<std::size_t>(r * F));
    gate = pre_gate ? pre_gate : s.gate.data();
  }
  expert_pre_activations(w, e, xin, r, gate, up, split, mode);
  kernels::apply_body(body.kind, body.swiglu_limit, body.swiglu_alpha, gate, up, s.up.data(), r * F);
  expert_down(w, e, s.up.data(), r, out, out_scale, split, accumulate, mode);
}

// The trace's pre-activation buffers for `rows` rows: the ones it holds when their shape is
// right (a training loop's SavedForward reused step after step keeps its pages), else new ones.
void prepare_trace(ExpertTrace& trace, std::int64_t rows, std::int64_t F, bool gated, float*& gate, float*& up) {
  const auto buffer = [&](Tensor& t, bool want) -> float* {
    if (!want || !trace.keep_pre_activations) {
      t = Tensor();
      return nullptr;
    }
    if (t.shape() != Shape{rows, F} || t.dtype() != DType::f32) t = Tensor::uninitialized({rows, F}, DType::f32);
    return t.data_as<float>();
  };
  up = buffer(trace.pre_up, true);
  gate = buffer(trace.pre_gate, gated);
}

void check_xy(const char* fn, const TensorView& x, const TensorView& y, std::int64_t D) {
  detail::expect_tensor(fn, "x", x, {DType::f32}, {"T", D});
  detail::expect_tensor(fn, "y", y, {DType::f32}, x.shape());
}

}  // namespace

std::vector<ExpertTask> expert_tasks(const std::vector<std::int64_t>& offsets) {
  std::vector<ExpertTask> tasks;
  for (std::size_t e = 0; e + 1 < offsets.size(); ++e)
    for (std::int64_t r = offsets[e]; r < offsets[e + 1]; r += kTaskRows)
      tasks.push_back({static_cast<std::int64_t>(e), r, std::min(kTaskRows, offsets[e + 1] - r)});
  return tasks;
}

void run_sorted_rows(const ExpertWeights& w, const ExpertBody& body, const float* x, const std::int32_t* src,
                     const float* weight, bool weight_on_input, const std::vector<std::int64_t>& offsets, float* out,
                     float* keep_gate, float* keep_up, ComputeMode mode) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const std::vector<ExpertTask> tasks = expert_tasks(offsets);
  // Fewer tasks than threads (decode with K = 1 or 2): run the tasks one after another with each
  // GEMM split over the pool instead of leaving threads idle.
  const std::int64_t n_tasks = static_cast<std::int64_t>(tasks.size());
  const bool split = split_gemms(n_tasks, num_threads());
  const auto run_task = [&](std::int64_t ti) {
    const ExpertTask& task = tasks[static_cast<std::size_t>(ti)];
    const float* wt = weight + task.begin;
    const kernels::RowSource rows{x, D, src + task.begin, weight_on_input ? wt : nullptr};
    expert_rows(w, body, task.expert, rows, task.count, out + task.begin * D, weight_on_input ? nullptr : wt, scratch(),
                split, false, keep_gate ? keep_gate + task.begin * F : nullptr,
                keep_up ? keep_up + task.begin * F : nullptr, mode);
  };
  if (split) {
    for (std::int64_t ti = 0; ti < n_tasks; ++ti) run_task(ti);
  } else {
    detail::parallel_tasks(n_tasks, run_task);
  }
}

void run_experts(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& ids,
                 const TensorView& weights, bool weight_on_input, const TensorView& y, bool accumulate,
                 ExpertTrace* trace, ComputeMode mode) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const std::int64_t E = w.num_experts();
  validate_experts(w, body, D, "experts", mode);
  check_xy("run_experts", x, y, D);
  const std::int64_t T = x.dim(0);
  detail::expect_tensor("run_experts", "ids", ids, {DType::i32}, {T, "K"});
  detail::expect_tensor("run_experts", "weights", weights, {DType::f32}, ids.shape());
  DispatchPlan local_plan;
  DispatchPlan& plan = trace ? trace->plan : local_plan;
  plan = plan_dispatch(ids, E);
  const std::int64_t K = plan.top_k;
  float* keep_gate = nullptr;
  float* keep_up = nullptr;
  if (trace) prepare_trace(*trace, T * K, F, w.gate.defined(), keep_gate, keep_up);
  const float* xs = x.data_as<const float>();
  const float* ws = weights.data_as<const float>();
  float* ys = y.data_as<float>();

  // [T*K, D] expert outputs in sorted order. Every row is written before it is read, so the
  // buffer is never zeroed (util/workspace.hpp: kept per thread between calls).
  const detail::Workspace workspace(static_cast<std::size_t>(T * K * D), detail::WorkspaceSlot::forward_rows);
  float* pair_out = workspace.data();
  // Per sorted row: the token it reads and its slot weight, so the GEMMs read x in place and
  // apply the weight on the input (Llama-4) or in the down projection's epilogue.
  std::vector<std::int32_t> src_rows(static_cast<std::size_t>(T * K));
  std::vector<float> slot_weight(static_cast<std::size_t>(T * K));
  for (std::int64_t i = 0; i < T * K; ++i) {
    const std::int64_t pair = plan.sorted_pairs[static_cast<std::size_t>(i)];
    src_rows[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(pair / K);
    slot_weight[static_cast<std::size_t>(i)] = ws[pair];
  }
  run_sorted_rows(w, body, xs, src_rows.data(), slot_weight.data(), weight_on_input, plan.offsets, pair_out, keep_gate,
                  keep_up, mode);

  combine_rows(pair_out, plan.inverse.data(), T, K, D, ys, accumulate);
}

void combine_rows(const float* rows, const std::int64_t* position, std::int64_t T, std::int64_t K, std::int64_t D,
                  float* y, bool accumulate) {
  detail::parallel_for(T, 8, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      float* yt = y + t * D;
      if (!accumulate) std::fill(yt, yt + D, 0.0f);
      for (std::int64_t k = 0; k < K; ++k) {
        const float* o = rows + position[t * K + k] * D;
        for (std::int64_t d = 0; d < D; ++d) yt[d] += o[d];
      }
    }
  });
}

void run_dense_ffn(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& y,
                   bool accumulate, ExpertTrace* trace, ComputeMode mode) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  validate_experts(w, body, D, "shared", mode);
  if (w.num_experts() != 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::run_dense_ffn] expected 1 expert, got " << w.num_experts()));
  check_xy("run_dense_ffn", x, y, D);
  // Whole-batch GEMMs split over the pool. The scratch is local, not the per-thread one, so a
  // large batch does not keep its [T, F] buffers alive after the call.
  Scratch local;
  const std::int64_t T = x.dim(0);
  float* keep_gate = nullptr;
  float* keep_up = nullptr;
  if (trace) {
    trace->plan = DispatchPlan();
    prepare_trace(*trace, T, F, w.gate.defined(), keep_gate, keep_up);
  }
  expert_rows(w, body, 0, {x.data_as<const float>(), D}, T, y.data_as<float>(), nullptr, local, true, accumulate,
              keep_gate, keep_up, mode);
}

}  // namespace moekit
