// Grouped expert execution over a DispatchPlan.
//
// Work is cut into tasks of (expert, up to kRowChunk of its rows). A task gathers its rows,
// runs gate/up GEMMs over all of them at once, the activation, the down GEMM, scales each row
// by its slot weight and writes it to its sorted position of a [T*K, D] buffer. Every output
// element is a fixed-order dot product, so neither the chunking nor the thread that ran it can
// change a bit. The combine then sums each token's K rows in slot order.
#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/gemm.hpp"
#include "moekit/experts.hpp"
#include "moekit/threading.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

constexpr std::int64_t kRowChunk = 64;

bool has(const Tensor& t) { return t.numel() > 0; }

// Scratch for one task, reused by the thread across tasks and calls.
struct Scratch {
  std::vector<float> x, gate, up, out;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// rows [r, D] of xin -> out [r, D] (+)= body(xin) for expert e (no weight applied). `split`
// spreads each GEMM's columns over the pool (for fewer tasks than threads, and the dense shared
// expert); the elements and their summation order are the same either way.
void expert_rows(const ExpertWeights& w, const ExpertBody& body, std::int64_t e, const float* xin, std::int64_t r,
                 float* out, Scratch& s, bool split, bool accumulate = false) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const auto gemm = split ? kernels::gemm_nt : kernels::gemm_nt_serial;
  s.up.resize(static_cast<std::size_t>(r * F));
  gemm(xin, D, w.up.experts[e], w.up.dtype, w.up.row_stride, s.up.data(), F, r, F, D, false);
  if (has(w.up_bias)) kernels::add_row_bias(s.up.data(), r, F, w.up_bias.data_as<const float>() + e * F);
  const float* g = nullptr;
  if (w.gate.defined()) {
    s.gate.resize(static_cast<std::size_t>(r * F));
    gemm(xin, D, w.gate.experts[e], w.gate.dtype, w.gate.row_stride, s.gate.data(), F, r, F, D, false);
    if (has(w.gate_bias)) kernels::add_row_bias(s.gate.data(), r, F, w.gate_bias.data_as<const float>() + e * F);
    g = s.gate.data();
  }
  kernels::apply_body(body.kind, body.swiglu_limit, body.swiglu_alpha, g, s.up.data(), s.up.data(), r * F);
  gemm(s.up.data(), F, w.down.experts[e], w.down.dtype, w.down.row_stride, out, D, r, D, F, accumulate);
  if (has(w.down_bias)) kernels::add_row_bias(out, r, D, w.down_bias.data_as<const float>() + e * D);
}

void check_xy(const char* fn, const TensorView& x, const TensorView& y, std::int64_t D) {
  if (!x.defined() || x.rank() != 2 || x.dtype() != DType::f32 || x.dim(1) != D)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] x must be f32 [T, " << D << "], got "
                                                       << dtype_name(x.dtype()) << " " << shape_str(x.shape())));
  if (!y.defined() || y.dtype() != DType::f32 || y.shape() != x.shape())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] y must be f32 " << shape_str(x.shape())
                                                       << ", got " << dtype_name(y.dtype()) << " "
                                                       << shape_str(y.shape())));
}

}  // namespace

void run_experts(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& ids,
                 const TensorView& weights, bool weight_on_input, const TensorView& y, bool accumulate) {
  const std::int64_t D = w.hidden_size();
  const std::int64_t E = w.num_experts();
  validate_experts(w, body, D, "experts");
  check_xy("run_experts", x, y, D);
  const std::int64_t T = x.dim(0);
  if (!ids.defined() || ids.rank() != 2 || ids.dim(0) != T || ids.dtype() != DType::i32)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::run_experts] ids must be i32 [" << T << ", K], got "
                                                                                   << dtype_name(ids.dtype()) << " "
                                                                                   << shape_str(ids.shape())));
  if (!weights.defined() || weights.shape() != ids.shape() || weights.dtype() != DType::f32)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::run_experts] weights must be f32 " << shape_str(ids.shape())
                                                                                       << ", got "
                                                                                       << dtype_name(weights.dtype())
                                                                                       << " "
                                                                                       << shape_str(weights.shape())));
  const DispatchPlan plan = plan_dispatch(ids, E);
  const std::int64_t K = plan.top_k;
  const float* xs = x.data_as<const float>();
  const float* ws = weights.data_as<const float>();
  float* ys = y.data_as<float>();

  // (expert, first row, row count) tasks, in expert order.
  struct Task {
    std::int64_t expert, begin, count;
  };
  std::vector<Task> tasks;
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; r += kRowChunk)
      tasks.push_back({e, r, std::min(kRowChunk, plan.offsets[e + 1] - r)});

  // [T*K, D] expert outputs in sorted order. Every row is written before it is read, so the
  // buffer is never zeroed. Up to kKeptWorkspace floats it is a per-calling-thread workspace
  // that stays between calls (re-faulting tens of MB of fresh pages on every forward measured
  // ~10 % of a T = 512 forward); larger, rarer calls get a buffer freed on return, so a huge
  // batch never pins its workspace.
  constexpr std::size_t kKeptWorkspace = std::size_t{64} << 20 >> 2;  // 64 MB of floats
  const std::size_t need = static_cast<std::size_t>(T * K * D);
  thread_local std::vector<float> workspace;
  std::unique_ptr<float[]> large;
  float* pair_out;
  if (need <= kKeptWorkspace) {
    if (workspace.size() < need) workspace.resize(need);
    pair_out = workspace.data();
  } else {
    large.reset(new float[need]);
    pair_out = large.get();
  }
  // Fewer tasks than threads (decode with K = 1 or 2): run the tasks one after another with each
  // GEMM split over the pool instead of leaving threads idle.
  const std::int64_t n_tasks = static_cast<std::int64_t>(tasks.size());
  const bool split = n_tasks < num_threads();
  const auto run_task = [&](std::int64_t ti) {
    const Task& task = tasks[static_cast<std::size_t>(ti)];
    Scratch& s = scratch();
    s.x.resize(static_cast<std::size_t>(task.count * D));
    for (std::int64_t i = 0; i < task.count; ++i) {
      const std::int64_t pair = plan.sorted_pairs[task.begin + i];
      const float* src = xs + (pair / K) * D;
      float* dst = s.x.data() + i * D;
      if (weight_on_input) {
        const float wv = ws[pair];
        for (std::int64_t d = 0; d < D; ++d) dst[d] = src[d] * wv;
      } else {
        std::memcpy(dst, src, static_cast<std::size_t>(D) * sizeof(float));
      }
    }
    float* out = pair_out + task.begin * D;
    expert_rows(w, body, task.expert, s.x.data(), task.count, out, s, split);
    if (!weight_on_input) {
      for (std::int64_t i = 0; i < task.count; ++i) {
        const float wv = ws[plan.sorted_pairs[task.begin + i]];
        for (std::int64_t d = 0; d < D; ++d) out[i * D + d] *= wv;
      }
    }
  };
  if (split) {
    for (std::int64_t ti = 0; ti < n_tasks; ++ti) run_task(ti);
  } else {
    detail::parallel_tasks(n_tasks, run_task);
  }

  detail::parallel_for(T, 8, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      float* yt = ys + t * D;
      if (!accumulate) std::fill(yt, yt + D, 0.0f);
      for (std::int64_t k = 0; k < K; ++k) {
        const float* o = pair_out + plan.inverse[t * K + k] * D;
        for (std::int64_t d = 0; d < D; ++d) yt[d] += o[d];
      }
    }
  });
}

void run_dense_ffn(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& y,
                   bool accumulate) {
  const std::int64_t D = w.hidden_size();
  validate_experts(w, body, D, "shared");
  if (w.num_experts() != 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::run_dense_ffn] expected 1 expert, got " << w.num_experts()));
  check_xy("run_dense_ffn", x, y, D);
  // Whole-batch GEMMs split over the pool. The scratch is local, not the per-thread one, so a
  // large batch does not keep its [T, F] buffers alive after the call.
  Scratch local;
  expert_rows(w, body, 0, x.data_as<const float>(), x.dim(0), y.data_as<float>(), local, true, accumulate);
}

}  // namespace moekit
