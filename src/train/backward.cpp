// backward(): the MoE block's backward, sparse over the dispatch plan (docs/training.md, "The gradients moekit computes").
//
// Per expert, over its rows in sorted order and in fixed chunks of kChunk rows:
//   a, b  = the gate/up pre-activations (kept by the training forward, or recomputed)
//   h     = body(a, b)
//   dhu   = dy_rows · Wd                        gemm_nn        (dy gathered by token)
//   dg    = <dhu, h> + <dy, bd>                 the slot weight's gradient (Llama-4: <dxin, x>)
//   dh    = g · dhu
//   dWd  += (g·dy_rows)ᵀ · h                    gemm_tn        dbd += Σ g·dy
//   da,db = body'(a, b) ⊙ dh
//   dWg  += daᵀ · xin, dWu += dbᵀ · xin         gemm_tn        dbg += Σ da, dbu += Σ db
//   dxin  = da · Wg + db · Wu                   gemm_nn
// The shared expert is the same computation over every token with g = σ(shared-gate logit)
// (or 1). The token's dx sums its K rows in slot order, then the router's and the shared
// parts are added, always in this order. Weight gradients are sums over rows in sorted order;
// an expert's rows are never split over threads (only a GEMM's output is), so the bits do not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "experts/expert_rows.hpp"
#include "train/backward_parts.hpp"
#include "experts/weight_matrix.hpp"
#include "kernels/activation.hpp"
#include "kernels/gemm.hpp"
#include "moekit/threading.hpp"
#include "moekit/train.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"
#include "util/workspace.hpp"

namespace moekit {

namespace {

using detail::GradSink;

constexpr std::int64_t kChunk = 256;

bool has(const Tensor& t) { return t.numel() > 0; }

struct Scratch {
  std::vector<float> a, b, h, dhu, da, db;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

float* ptr(const Tensor& t) { return has(t) ? t.data_as<float>() : nullptr; }

// The rows one expert's backward reads, in its sorted order.
struct ExpertRows {
  kernels::RowSource x;              ///< its input rows (Llama-4: scaled by the slot weight)
  const float* x_raw = nullptr;      ///< x [T, D] unscaled (Llama-4's dg)
  const std::int32_t* tokens = nullptr;  ///< token of each row; null: row i is token i
  const float* g = nullptr;          ///< slot weight of each row; null: 1
  bool weight_on_input = false;
  const float* pre_gate = nullptr;   ///< kept pre-activations, or null (recompute)
  const float* pre_up = nullptr;
  ComputeMode mode = ComputeMode::exact;  ///< the forward's, for recomputed pre-activations
};

std::int64_t token_of(const ExpertRows& in, std::int64_t i) { return in.tokens ? in.tokens[i] : i; }

// The backward of expert e over its n rows. dx_rows [n, D] receives dL/d(input row) (added when
// accumulate_dx); dg [n] the slot weights' gradients (null: not wanted). Gradients go to `sink`
// at expert e, added when `accumulate`.
void expert_backward(const ExpertWeights& w, const ExpertBody& body, std::int64_t e, const ExpertRows& in,
                     std::int64_t n, const float* dy, float* dx_rows, bool accumulate_dx, float* dg,
                     const GradSink& sink, bool accumulate, bool split, Scratch& s) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const kernels::Threads threads = split ? kernels::Threads::pool : kernels::Threads::caller;
  const bool gated = w.gate.defined();
  const std::int64_t ms = sink.matrix_stride ? sink.matrix_stride : F * D, bs = sink.bias_stride ? sink.bias_stride : F;
  float* dWg = gated ? sink.gate + e * ms : nullptr;
  float* dWu = sink.up + e * ms;
  float* dWd = sink.down + e * D * F;
  float* dbg = sink.gate_bias ? sink.gate_bias + e * bs : nullptr;
  float* dbu = sink.up_bias ? sink.up_bias + e * bs : nullptr;
  float* dbd = sink.down_bias ? sink.down_bias + e * D : nullptr;
  const float* bd = has(w.down_bias) ? w.down_bias.data_as<const float>() + e * D : nullptr;
  if (!accumulate) {
    for (float* b : {dbg, dbu}) if (b) std::fill(b, b + F, 0.0f);
    if (dbd) std::fill(dbd, dbd + D, 0.0f);
  }
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::int64_t r = std::min(kChunk, n - c0);
    const bool acc = accumulate || c0 > 0;
    const kernels::RowSource xin = in.x.from(c0);
    const std::size_t rf = static_cast<std::size_t>(r * F);
    const float* a = nullptr;
    const float* b = nullptr;
    if (in.pre_up) {
      b = in.pre_up + c0 * F;
      if (gated) a = in.pre_gate + c0 * F;
    } else {
      s.a.resize(rf);
      s.b.resize(rf);
      expert_pre_activations(w, e, xin, r, gated ? s.a.data() : nullptr, s.b.data(), split, in.mode);
      a = gated ? s.a.data() : nullptr;
      b = s.b.data();
    }
    s.h.resize(rf);
    s.dhu.resize(rf);
    s.da.resize(rf);
    s.db.resize(rf);
    kernels::apply_body(body.kind, body.swiglu_limit, body.swiglu_alpha, a, b, s.h.data(), r * F);
    const std::int32_t* tok = in.tokens ? in.tokens + c0 : nullptr;
    const float* g = in.g ? in.g + c0 : nullptr;
    // This chunk's rows of dy: gathered by token, or (no token list: row i is token i) from row c0.
    const float* dyc = tok ? dy : dy + c0 * D;
    const kernels::RowSource dy_rows{dyc, D, tok, nullptr};
    // dhu = dy · Wd: [r, D] · [D, F].
    kernels::gemm_nn(dy_rows, weight_matrix(w.down, e), {s.dhu.data(), F}, r, F, D, threads);
    if (!in.weight_on_input) {
      if (dg)
        for (std::int64_t i = 0; i < r; ++i) {
          double acc_dg = 0.0;
          const float* u = s.dhu.data() + i * F;
          const float* hv = s.h.data() + i * F;
          for (std::int64_t f = 0; f < F; ++f) acc_dg += static_cast<double>(u[f]) * hv[f];
          if (bd) {
            const float* dyt = dy + token_of(in, c0 + i) * D;
            for (std::int64_t d = 0; d < D; ++d) acc_dg += static_cast<double>(dyt[d]) * bd[d];
          }
          dg[c0 + i] = static_cast<float>(acc_dg);
        }
      if (g)
        for (std::int64_t i = 0; i < r; ++i)
          for (std::int64_t f = 0; f < F; ++f) s.dhu[i * F + f] *= g[i];
    }
    // dWd += (g·dy)ᵀ · h: [D, r] · [r, F]; the weight applies to the output unless on the input.
    const kernels::RowSource gdy{dyc, D, tok, in.weight_on_input ? nullptr : g};
    kernels::gemm_tn(gdy, {s.h.data(), F}, {dWd, F, nullptr, acc}, D, F, r, threads);
    if (dbd)
      for (std::int64_t i = 0; i < r; ++i) {
        const float* dyt = dy + token_of(in, c0 + i) * D;
        const float gi = (g && !in.weight_on_input) ? g[i] : 1.0f;
        for (std::int64_t d = 0; d < D; ++d) dbd[d] += gi * dyt[d];
      }
    kernels::apply_body_backward(body.kind, body.swiglu_limit, body.swiglu_alpha, a, b, s.dhu.data(),
                                 gated ? s.da.data() : nullptr, s.db.data(), r * F);
    kernels::gemm_tn({s.db.data(), F}, xin, {dWu, D, nullptr, acc}, F, D, r, threads);
    if (gated) kernels::gemm_tn({s.da.data(), F}, xin, {dWg, D, nullptr, acc}, F, D, r, threads);
    for (const auto& [dbias, src] : {std::pair{dbu, s.db.data()}, std::pair{dbg, s.da.data()}})
      if (dbias)
        for (std::int64_t i = 0; i < r; ++i)
          for (std::int64_t f = 0; f < F; ++f) dbias[f] += src[i * F + f];
    // dxin = db · Wu (+ da · Wg): [r, F] · [F, D].
    float* dxo = dx_rows + c0 * D;
    kernels::gemm_nn({s.db.data(), F}, weight_matrix(w.up, e), {dxo, D, nullptr, accumulate_dx}, r, D, F, threads);
    if (gated)
      kernels::gemm_nn({s.da.data(), F}, weight_matrix(w.gate, e), {dxo, D, nullptr, true}, r, D, F, threads);
    if (in.weight_on_input) {
      // xin = g·x: dg = <dxin, x>, dx = g·dxin.
      for (std::int64_t i = 0; i < r; ++i) {
        float* row = dxo + i * D;
        const float* xr = in.x_raw + token_of(in, c0 + i) * D;
        double acc_dg = 0.0;
        for (std::int64_t d = 0; d < D; ++d) acc_dg += static_cast<double>(row[d]) * xr[d];
        if (dg) dg[c0 + i] = static_cast<float>(acc_dg);
        const float gi = g ? g[i] : 1.0f;
        for (std::int64_t d = 0; d < D; ++d) row[d] *= gi;
      }
    }
  }
}

void zero_expert(const ExpertWeights& w, std::int64_t e, const GradSink& sink) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const auto zero = [](float* p, std::int64_t n) {
    if (p) std::fill(p, p + n, 0.0f);
  };
  const std::int64_t ms = sink.matrix_stride ? sink.matrix_stride : F * D, bs = sink.bias_stride ? sink.bias_stride : F;
  if (sink.gate) zero(sink.gate + e * ms, F * D);
  zero(sink.up + e * ms, F * D);
  zero(sink.down + e * D * F, D * F);
  if (sink.gate_bias) zero(sink.gate_bias + e * bs, F);
  if (sink.up_bias) zero(sink.up_bias + e * bs, F);
  if (sink.down_bias) zero(sink.down_bias + e * D, D);
}

kernels::WeightMatrix view_matrix(const TensorView& t) { return {t.data(), t.dtype(), t.dim(-1)}; }

// The routed experts' backward over the forward's plan: x [T, D], the slot weights ws [T, K] in
// pair order; writes pair_dx [T·K, D] and pair_dg [T·K] in the plan's sorted order.
void routed_backward(const ExpertWeights& w, const ExpertBody& body, const float* x, const float* ws, bool woi,
                     const DispatchPlan& plan, const float* pre_gate, const float* pre_up, const float* dy,
                     float* pair_dx, float* pair_dg, const GradSink& sink, bool accumulate, ComputeMode mode) {
  const std::int64_t n = plan.num_tokens * plan.top_k, K = plan.top_k;
  std::vector<std::int32_t> src_rows(static_cast<std::size_t>(n));
  std::vector<float> slot_weight(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t pair = plan.sorted_pairs[static_cast<std::size_t>(i)];
    src_rows[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(pair / K);
    slot_weight[static_cast<std::size_t>(i)] = ws[pair];
  }
  detail::backward_sorted_rows(w, body, x, src_rows.data(), slot_weight.data(), woi, plan.offsets, pre_gate, pre_up, dy,
                               pair_dx, pair_dg, sink, accumulate, mode);
}

}  // namespace

Tensor backward(const MoeLayer& layer, const SavedForward& saved, const TensorView& dy_in, MoeTensors& grads,
                const BackwardOptions& options) {
  const MoeConfig& cfg = layer.config();
  const MoeWeights& w = layer.weights();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts, K = cfg.router.top_k, F = cfg.expert_width;
  const std::int64_t S = cfg.shared_width;
  detail::check_float_weights("backward", layer);
  // --- the saved state must be this layer's
  const std::int64_t T = saved.x.numel() > 0 ? saved.x.dim(0) : 0;
  const bool saved_ok = saved.x.rank() == 2 && saved.x.dim(1) == D && saved.logits.rank() == 2 &&
                        saved.logits.dim(0) == T && saved.logits.dim(1) == E && saved.routing.ids.rank() == 2 &&
                        saved.routing.ids.dim(0) == T && saved.routing.ids.dim(1) == K &&
                        saved.routed.plan.num_tokens == T && saved.routed.plan.top_k == K &&
                        saved.routed.plan.num_experts == E && shape_numel(saved.shape) == T * D;
  if (!saved_ok)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::backward] saved state does not belong to this layer (D = "
                                           << D << ", E = " << E << ", K = " << K
                                           << "): fill it with this layer's forward_train; got x "
                                           << shape_str(saved.x.shape()) << ", logits " << shape_str(saved.logits.shape())));
  const bool gated = w.experts.gate.defined();
  const bool kept = has(saved.routed.pre_up);
  if (kept && (saved.routed.pre_up.shape() != Shape{T * K, F} ||
               (gated && saved.routed.pre_gate.shape() != Shape{T * K, F})))
    throw std::invalid_argument("[moekit::backward] saved pre-activations do not match the layer's expert width");
  if (S > 0 && has(saved.shared.pre_up) && saved.shared.pre_up.shape() != Shape{T, S})
    throw std::invalid_argument("[moekit::backward] saved shared pre-activations do not match the shared width");
  if (cfg.shared_gated && S > 0 && saved.shared_gate_logits.numel() != T)
    throw std::invalid_argument("[moekit::backward] saved state has no shared-gate logits for a gated shared expert");
  Tensor dy_owned;
  const float* dy = detail::checked_dy("backward", dy_in, saved.shape, T, D, E, options, dy_owned);
  // Gradient buffers: checked (all of them) before any is written.
  MoeTensors g = grads;
  detail::check_grads("backward", layer, E, g);
  const bool accumulate = options.accumulate;

  const float* x = saved.x.data_as<const float>();
  const DispatchPlan& plan = saved.routed.plan;
  const ExpertBody body = layer.body();
  const bool woi = cfg.router.weight_on_input;

  // --- routed experts
  // [T*K, D] dL/d(input row) in sorted order; every row is written before it is read.
  const detail::Workspace pair_dx(static_cast<std::size_t>(T * K * D), detail::WorkspaceSlot::backward_rows);
  std::vector<float> pair_dg(static_cast<std::size_t>(T * K));
  routed_backward(w.experts, body, x, saved.routing.weights.data_as<const float>(), woi, plan,
                  kept ? saved.routed.pre_gate.data_as<const float>() : nullptr,
                  kept ? saved.routed.pre_up.data_as<const float>() : nullptr, dy, pair_dx.data(), pair_dg.data(),
                  detail::expert_sink(g), accumulate, layer.compute_mode());
  Tensor dx = detail::backward_tail(layer, saved, dy, pair_dx.data(), pair_dg.data(), plan.inverse.data(), g,
                                    accumulate, options);
  grads = g;
  dx.reshape(saved.shape);
  return dx;
}

Tensor experts_backward(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& ids,
                        const TensorView& weights, bool weight_on_input, const ExpertTrace& trace,
                        const TensorView& dy_in, MoeTensors& grads, Tensor& dweights,
                        const ExpertGradOptions& options) {
  constexpr const char* fn = "experts_backward";
  const bool accumulate = options.accumulate;
  detail::check_float_experts(fn, w);
  const std::int64_t E = w.num_experts(), D = w.hidden_size(), F = w.width();
  detail::expect_tensor(fn, "x", x, {DType::f32}, {"T", D});
  const std::int64_t T = x.dim(0);
  detail::expect_tensor(fn, "ids", ids, {DType::i32}, {T, "K"});
  const std::int64_t K = ids.dim(1);
  detail::expect_tensor(fn, "weights", weights, {DType::f32}, {T, K}, "ids");
  const DispatchPlan& plan = trace.plan;
  if (plan.num_tokens != T || plan.top_k != K || plan.num_experts != E ||
      static_cast<std::int64_t>(plan.sorted_pairs.size()) != T * K)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] the trace's plan (" << plan.num_tokens
                                                       << " tokens, top-" << plan.top_k << " of " << plan.num_experts
                                                       << ") is not this forward's (" << T << " tokens, top-" << K
                                                       << " of " << E << ")"));
  const bool gated = w.gate.defined();
  const bool kept = has(trace.pre_up);
  if (kept && (trace.pre_up.shape() != Shape{T * K, F} || (gated && trace.pre_gate.shape() != Shape{T * K, F})))
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::" << fn << "] the trace's pre-activations are not [" << T * K << ", " << F << "]"));
  Tensor dy_owned;
  const float* dy = detail::checked_dy(fn, dy_in, {T, D}, T, D, E, {}, dy_owned);
  // Gradient buffers: every one checked before any is written.
  const bool fused = options.fuse_gate_up;
  if (fused && (!gated || has(w.gate_bias) != has(w.up_bias)))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn
                                                       << "] fuse_gate_up needs a gated body with both or neither "
                                                          "of the gate and up biases"));
  MoeTensors g = grads;
  const auto check = [&](Tensor& t, const Shape& shape, const char* name) {
    if (!has(t)) {
      // Every element is written (active experts overwrite, idle ones are zeroed) unless accumulating.
      t = accumulate ? Tensor(shape, DType::f32) : Tensor::uninitialized(shape, DType::f32);
      return;
    }
    detail::expect_tensor(fn, std::string("grads.") + name, t, {DType::f32}, shape);
  };
  const std::int64_t halves = fused ? 2 : 1;
  if (gated) check(g.gate, {E, halves * F, D}, fused ? "gate (fused gate_up)" : "gate");
  if (!fused) check(g.up, {E, F, D}, "up");
  check(g.down, {E, D, F}, "down");
  if (has(w.gate_bias)) check(g.gate_bias, {E, halves * F}, fused ? "gate_bias (fused gate_up)" : "gate_bias");
  if (has(w.up_bias) && !fused) check(g.up_bias, {E, F}, "up_bias");
  if (has(w.down_bias)) check(g.down_bias, {E, D}, "down_bias");
  detail::GradSink sink = detail::expert_sink(g);
  if (fused) {
    sink.up = sink.gate + F * D;
    sink.matrix_stride = 2 * F * D;
    if (sink.gate_bias) {
      sink.up_bias = has(w.up_bias) ? sink.gate_bias + F : nullptr;
      sink.bias_stride = 2 * F;
    }
  }

  const detail::Workspace pair_dx(static_cast<std::size_t>(T * K * D), detail::WorkspaceSlot::backward_rows);
  std::vector<float> pair_dg(static_cast<std::size_t>(T * K));
  routed_backward(w, body, x.data_as<const float>(), weights.data_as<const float>(), weight_on_input, plan,
                  kept && gated ? trace.pre_gate.data_as<const float>() : nullptr,
                  kept ? trace.pre_up.data_as<const float>() : nullptr, dy, pair_dx.data(), pair_dg.data(), sink,
                  accumulate, options.mode);
  Tensor dx = Tensor::uninitialized({T, D}, DType::f32);
  dweights = Tensor::uninitialized({T, K}, DType::f32);
  detail::combine_backward(T, K, D, pair_dx.data(), pair_dg.data(), plan.inverse.data(), dx.data_as<float>(),
                           dweights.data_as<float>());
  grads = g;
  return dx;
}

namespace detail {

void combine_backward(std::int64_t T, std::int64_t K, std::int64_t D, const float* pair_dx, const float* pair_dg,
                      const std::int64_t* position, float* dx, float* dweights) {
  parallel_for(T, 8, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      float* row = dx + t * D;
      std::fill(row, row + D, 0.0f);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int64_t pos = position[t * K + k];
        const float* o = pair_dx + pos * D;
        for (std::int64_t d = 0; d < D; ++d) row[d] += o[d];
        dweights[t * K + k] = pair_dg[pos];
      }
    }
  });
}

void check_float_experts(const char* fn, const ExpertWeights& x) {
  for (const ExpertMatrix* m : {&x.gate, &x.up, &x.down})
    if (m->quantized())
      throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] the experts have quantized weights ("
                                                         << m->describe()
                                                         << "), which have no gradient here; train a float copy "
                                                            "(moekit::trainable_parameters needs float weights too)"));
  for (const ExpertMatrix* m : {&x.gate, &x.up, &x.down})
    if (m->layout == MatrixLayout::amx_tiles)
      throw std::invalid_argument(
          MOEKIT_MSG("[moekit::" << fn
                                 << "] the experts are packed in AMX tiles, a "
                                    "forward-only layout; the backward reads rows or f32-mode panels"));
}

void check_float_weights(const char* fn, const MoeLayer& layer) {
  const MoeWeights& w = layer.weights();
  if (w.router_quantized.defined() || w.shared_gate_quantized.defined())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] the layer has quantized weights, which have no "
                                           "gradient here; train a float copy (moekit::trainable_parameters needs "
                                           "float weights too)"));
  for (const ExpertWeights* x : {&w.experts, &w.shared}) check_float_experts(fn, *x);
}

const float* checked_dy(const char* fn, const TensorView& dy_in, const Shape& shape, std::int64_t T, std::int64_t D,
                        std::int64_t E, const BackwardOptions& options, Tensor& owned) {
  detail::expect_tensor(fn, "dy", dy_in, {DType::f32, DType::bf16}, shape, "the forward's x");
  if (options.extra_dlogits.defined() &&
      (options.extra_dlogits.dtype() != DType::f32 || options.extra_dlogits.numel() != T * E ||
       options.extra_dlogits.dim(-1) != E))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] extra_dlogits must be f32 [" << T << ", " << E
                                                       << "], got " << dtype_name(options.extra_dlogits.dtype())
                                                       << " " << shape_str(options.extra_dlogits.shape())));
  TensorView dyv = dy_in.reshaped({T, D});
  if (dy_in.dtype() != DType::f32) {
    owned = to_dtype(dyv, DType::f32);
    dyv = owned.view();
  }
  const float* dy = dyv.data_as<const float>();
  for (std::int64_t i = 0; i < T * D; ++i)
    if (!std::isfinite(dy[i]))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::" << fn << "] dy has a non-finite value " << dy[i]
                                                         << " at row " << i / D << ", column " << i % D));
  return dy;
}

void check_grads(const char* fn, const MoeLayer& layer, std::int64_t num_experts, MoeTensors& g) {
  const MoeConfig& cfg = layer.config();
  const MoeWeights& w = layer.weights();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts, F = cfg.expert_width, S = cfg.shared_width,
                     X = num_experts;
  const auto check = [fn](Tensor& t, const Shape& shape, const char* name) {
    if (!has(t)) {
      t = Tensor(shape, DType::f32);  // zeroed: accumulating into a fresh buffer starts from 0
      return;
    }
    detail::expect_tensor(fn, std::string("grads.") + name, t, {DType::f32}, shape);
  };
  check(g.router, {E, D}, "router");
  if (cfg.router.has_router_bias) check(g.router_bias, {E}, "router_bias");
  if (w.experts.gate.defined()) check(g.gate, {X, F, D}, "gate");
  check(g.up, {X, F, D}, "up");
  check(g.down, {X, D, F}, "down");
  if (has(w.experts.gate_bias)) check(g.gate_bias, {X, F}, "gate_bias");
  if (has(w.experts.up_bias)) check(g.up_bias, {X, F}, "up_bias");
  if (has(w.experts.down_bias)) check(g.down_bias, {X, D}, "down_bias");
  if (S > 0) {
    if (w.shared.gate.defined()) check(g.shared_gate_proj, {S, D}, "shared_gate_proj");
    check(g.shared_up_proj, {S, D}, "shared_up_proj");
    check(g.shared_down_proj, {D, S}, "shared_down_proj");
    if (cfg.shared_gated) check(g.shared_gate, {1, D}, "shared_gate");
  }
}

GradSink expert_sink(const MoeTensors& g) {
  return {ptr(g.gate), ptr(g.up), ptr(g.down), ptr(g.gate_bias), ptr(g.up_bias), ptr(g.down_bias)};
}

void backward_sorted_rows(const ExpertWeights& w, const ExpertBody& body, const float* x, const std::int32_t* src,
                          const float* slot_weight, bool woi, const std::vector<std::int64_t>& offsets,
                          const float* pre_gate, const float* pre_up, const float* dy, float* pair_dx, float* pair_dg,
                          const GradSink& sink, bool accumulate, ComputeMode mode) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  const std::int64_t E = static_cast<std::int64_t>(offsets.size()) - 1;
  const bool gated = w.gate.defined();
  std::vector<std::int64_t> active;
  for (std::int64_t e = 0; e < E; ++e) {
    if (offsets[e + 1] > offsets[e]) {
      active.push_back(e);
    } else if (!accumulate) {
      zero_expert(w, e, sink);
    }
  }
  const bool split = static_cast<std::int64_t>(active.size()) < num_threads();
  const auto run_expert = [&](std::int64_t i) {
    const std::int64_t e = active[static_cast<std::size_t>(i)];
    const std::int64_t o = offsets[e];
    ExpertRows rows;
    rows.x = {x, D, src + o, woi ? slot_weight + o : nullptr};
    rows.x_raw = x;
    rows.tokens = src + o;
    rows.g = slot_weight + o;
    rows.weight_on_input = woi;
    rows.mode = mode;
    if (pre_up) {
      rows.pre_up = pre_up + o * F;
      if (gated) rows.pre_gate = pre_gate + o * F;
    }
    expert_backward(w, body, e, rows, offsets[e + 1] - o, dy, pair_dx + o * D, false, pair_dg + o, sink, accumulate,
                    split, scratch());
  };
  if (split) {
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(active.size()); ++i) run_expert(i);
  } else {
    parallel_tasks(static_cast<std::int64_t>(active.size()), run_expert);
  }
}

Tensor backward_tail(const MoeLayer& layer, const SavedForward& saved, const float* dy, const float* pair_dx,
                     const float* pair_dg, const std::int64_t* position, MoeTensors& g, bool accumulate,
                     const BackwardOptions& options) {
  const MoeConfig& cfg = layer.config();
  const MoeWeights& w = layer.weights();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts, K = cfg.router.top_k;
  const std::int64_t S = cfg.shared_width;
  const std::int64_t T = saved.x.numel() > 0 ? saved.x.dim(0) : 0;
  const float* x = saved.x.data_as<const float>();

  // --- combine: dx_t = Σ_k (slot order) of its rows; the weights' gradients back in pair order
  Tensor dx = Tensor::uninitialized({T, D}, DType::f32);
  float* dxs = dx.data_as<float>();
  Tensor dweights = Tensor::uninitialized({T, K}, DType::f32);
  combine_backward(T, K, D, pair_dx, pair_dg, position, dxs, dweights.data_as<float>());

  // --- router
  Tensor dlogits = router_backward(cfg.router, saved.logits, saved.routing.ids, dweights, w.selection_bias.view());
  if (options.extra_dlogits.defined()) {
    float* dz = dlogits.data_as<float>();
    const float* extra = options.extra_dlogits.data_as<const float>();
    for (std::int64_t i = 0; i < T * E; ++i) dz[i] += extra[i];
  }
  const float* dz = dlogits.data_as<const float>();
  kernels::gemm_tn({dz, E}, {x, D}, {g.router.data_as<float>(), D, nullptr, accumulate}, E, D, T);
  if (cfg.router.has_router_bias) {
    float* db = g.router_bias.data_as<float>();
    if (!accumulate) std::fill(db, db + E, 0.0f);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t e = 0; e < E; ++e) db[e] += dz[t * E + e];
  }
  kernels::gemm_nn({dz, E}, view_matrix(w.router), {dxs, D, nullptr, true}, T, D, E);

  // --- shared experts (one expert over every token, weighted by the shared gate if any)
  if (S > 0) {
    std::vector<float> gate_value, dgate;
    if (cfg.shared_gated) {
      const float* q = saved.shared_gate_logits.data_as<const float>();
      gate_value.resize(static_cast<std::size_t>(T));
      dgate.resize(static_cast<std::size_t>(T));
      for (std::int64_t t = 0; t < T; ++t) gate_value[t] = 1.0f / (1.0f + std::exp(-q[t]));
    }
    ExpertRows rows;
    rows.x = {x, D};
    rows.x_raw = x;
    rows.g = cfg.shared_gated ? gate_value.data() : nullptr;
    rows.mode = layer.compute_mode();
    if (has(saved.shared.pre_up)) {
      rows.pre_up = saved.shared.pre_up.data_as<const float>();
      rows.pre_gate = saved.shared.pre_gate.data_as<const float>();
    }
    const GradSink shared_sink{ptr(g.shared_gate_proj), ptr(g.shared_up_proj), ptr(g.shared_down_proj)};
    expert_backward(w.shared, layer.shared_body(), 0, rows, T, dy, dxs, true,
                    cfg.shared_gated ? dgate.data() : nullptr, shared_sink, accumulate, true, scratch());
    if (cfg.shared_gated) {
      // y += σ(q)·s: dq = <dy, s>·σ(1 − σ); dw_sg = Σ dq·x; dx += dq·w_sg.
      for (std::int64_t t = 0; t < T; ++t) dgate[t] *= gate_value[t] * (1.0f - gate_value[t]);
      kernels::gemm_tn({dgate.data(), 1}, {x, D}, {g.shared_gate.data_as<float>(), D, nullptr, accumulate}, 1, D, T);
      kernels::gemm_nn({dgate.data(), 1}, view_matrix(w.shared_gate), {dxs, D, nullptr, true}, T, D, 1);
    }
  }
  return dx;
}

}  // namespace detail

}  // namespace moekit
