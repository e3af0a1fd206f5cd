// MoeLayer: the one place that knows the whole block (docs/routing.md, "The pipeline").
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "moekit/layer.hpp"

#include "experts/weight_matrix.hpp"
#include "kernels/activation.hpp"
#include "util/error.hpp"
#include "tensor/expect.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

void check_vector(const Tensor& t, bool wanted, std::int64_t E, const char* name) {
  const bool present = t.numel() > 0;
  if (wanted) detail::expect_tensor("MoeLayer", name, t, {DType::f32}, {E});
  if (!wanted && present)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::MoeLayer] " << name << " given but the config has none"));
}

// x [T, D] · Wᵀ (+ bias) for a quantized [N, D] matrix: router_logits()'s computation (the same
// kernel order, then the bias), so it equals router_logits on the dequantized matrix.
Tensor quantized_logits(const TensorView& x, const ExpertMatrix& m, const Tensor& bias) {
  const std::int64_t T = x.dim(0), N = m.rows;
  Tensor out({T, N}, DType::f32);
  kernels::gemm_nt({x.data_as<const float>(), m.cols}, weight_matrix(m, 0), {out.data_as<float>(), N}, T, N, m.cols);
  if (bias.numel() > 0) kernels::add_row_bias(out.data_as<float>(), T, N, bias.data_as<const float>());
  return out;
}

}  // namespace

void MoeLayer::pack_weights() {
  pack_panels(weights_.experts, mode_);
  if (weights_.shared.down.defined()) pack_panels(weights_.shared, mode_);
}

void MoeLayer::set_compute_mode(ComputeMode mode) {
  if (mode == ComputeMode::bf16) {
    validate_bf16_activations(weights_.experts, "experts");
    if (weights_.shared.down.defined()) validate_bf16_activations(weights_.shared, "shared");
  } else {
    for (const ExpertWeights* w : {&weights_.experts, &weights_.shared})
      for (const ExpertMatrix* m : {&w->gate, &w->up, &w->down})
        if (m->layout == MatrixLayout::amx_tiles)
          throw std::invalid_argument(MOEKIT_MSG(
              "[moekit::MoeLayer::set_compute_mode] the experts are packed in AMX tiles, which only the bf16 "
              "compute mode reads: it stays on (for the "
              << compute_mode_name(mode) << " mode, load the weights again and do not pack them in the bf16 mode)"));
  }
  mode_ = mode;
}

void MoeLayer::set_int8_activations(bool on) {
  if (on) {
    set_compute_mode(ComputeMode::int8);
  } else if (mode_ == ComputeMode::int8) {
    set_compute_mode(ComputeMode::exact);
  }
}

void MoeLayer::set_bf16_activations(bool on) {
  if (on) {
    set_compute_mode(ComputeMode::bf16);
  } else if (mode_ == ComputeMode::bf16) {
    set_compute_mode(ComputeMode::exact);
  }
}

ExpertBody MoeLayer::body() const noexcept {
  return ExpertBody{config_.body, config_.swiglu_limit, config_.swiglu_alpha};
}

// Shared experts use the family's activation without GPT-OSS's clamping (no family clamps them).
ExpertBody MoeLayer::shared_body() const noexcept {
  return ExpertBody{config_.body == BodyKind::swiglu_clamped ? BodyKind::swiglu : config_.body};
}

MoeLayer::MoeLayer(MoeConfig config, MoeWeights weights) : config_(std::move(config)), weights_(std::move(weights)) {
  validate(config_.router);
  const std::int64_t D = config_.hidden_size, E = config_.router.num_experts, F = config_.expert_width;
  const MoeWeights& w = weights_;
  if (w.router_quantized.defined()) {
    if (w.router.defined()) throw std::invalid_argument("[moekit::MoeLayer] both router and router_quantized given");
    validate_matrix(w.router_quantized, 1, E, D, "MoeLayer", "router_quantized");
  } else {
    detail::expect_tensor("MoeLayer", "router", w.router, {DType::f32, DType::bf16}, {E, D});
  }
  check_vector(w.router_bias, config_.router.has_router_bias, E, "router_bias");
  check_vector(w.selection_bias, config_.router.has_selection_bias, E, "selection_bias");
  if (w.selection_bias.numel() > 0) {
    const float* b = w.selection_bias.data_as<const float>();
    for (std::int64_t e = 0; e < E; ++e)
      if (!std::isfinite(b[e]))
        throw std::invalid_argument(MOEKIT_MSG("[moekit::MoeLayer] selection_bias[" << e << "] is " << b[e]));
  }
  if (w.experts.num_experts() != E || w.experts.width() != F)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::MoeLayer] experts: expected " << E << " experts of width " << F
                                                                                  << ", got " << w.experts.num_experts()
                                                                                  << " of width "
                                                                                  << w.experts.width()));
  validate_experts(w.experts, body(), D, "experts");
  const bool want_expert_bias = config_.expert_bias;
  for (const Tensor* b : {&w.experts.up_bias, &w.experts.down_bias})
    if ((b->numel() > 0) != want_expert_bias)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::MoeLayer] expert biases "
                                             << (want_expert_bias ? "missing" : "given but the config has none")));
  if (config_.shared_width > 0) {
    if (w.shared.num_experts() != 1 || w.shared.width() != config_.shared_width)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::MoeLayer] shared: expected one expert of width "
                                             << config_.shared_width << ", got " << w.shared.num_experts()
                                             << " of width " << w.shared.width()));
    validate_experts(w.shared, shared_body(), D, "shared");
  } else if (w.shared.num_experts() != 0) {
    throw std::invalid_argument("[moekit::MoeLayer] shared expert given but config.shared_width is 0");
  }
  if (config_.shared_gated && w.shared_gate_quantized.defined()) {
    validate_matrix(w.shared_gate_quantized, 1, 1, D, "MoeLayer", "shared_gate_quantized");
  } else if (config_.shared_gated) {
    detail::expect_tensor("MoeLayer", "shared_gate", w.shared_gate, {DType::f32, DType::bf16}, {1, D});
  }
}

std::size_t SavedForward::nbytes() const noexcept {
  return x.nbytes() + logits.nbytes() + routing.ids.nbytes() + routing.weights.nbytes() + routed.nbytes() +
         shared.nbytes() + shared_gate_logits.nbytes();
}

Tensor MoeLayer::forward(const TensorView& x, ForwardInfo* info) const { return forward_impl(x, info, nullptr); }

Tensor MoeLayer::forward_train(const TensorView& x, SavedForward& saved, bool keep_pre_activations) const {
  // The pre-activation buffers of a SavedForward used before are reused when their shapes fit.
  saved.shared_gate_logits = Tensor();
  saved.routed.keep_pre_activations = saved.shared.keep_pre_activations = keep_pre_activations;
  if (config_.shared_width == 0) saved.shared = ExpertTrace();
  return forward_impl(x, nullptr, &saved);
}

Tensor MoeLayer::forward_with(const TensorView& x, const RoutedExperts& routed, ForwardInfo* info) const {
  return forward_impl(x, info, nullptr, &routed);
}

Tensor MoeLayer::forward_train_with(const TensorView& x, SavedForward& saved, const RoutedExperts& routed,
                                    bool keep_pre_activations) const {
  saved.shared_gate_logits = Tensor();
  saved.routed = ExpertTrace();
  saved.shared.keep_pre_activations = keep_pre_activations;
  if (config_.shared_width == 0) saved.shared = ExpertTrace();
  return forward_impl(x, nullptr, &saved, &routed);
}

Tensor MoeLayer::forward_impl(const TensorView& x, ForwardInfo* info, SavedForward* saved,
                              const RoutedExperts* routed) const {
  const std::int64_t D = config_.hidden_size;
  detail::expect_tensor("MoeLayer::forward", "x", x, {DType::f32, DType::bf16}, detail::trailing(D));
  const std::int64_t T = x.rows();
  // f32 input is used in place; bf16 is widened once.
  Tensor x_owned;
  TensorView x32 = x.reshaped({T, D});
  if (x.dtype() != DType::f32) {
    x_owned = to_dtype(x32, DType::f32);
    x32 = x_owned.view();
  }
  // NaN/Inf in x would only surface as non-finite router logits; name the input element instead.
  const float* xs = x32.data_as<const float>();
  for (std::int64_t i = 0; i < x32.numel(); ++i)
    if (!std::isfinite(xs[i]))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::MoeLayer::forward] x has a non-finite value " << xs[i]
                                                                                                   << " at row " << i / D
                                                                                                   << ", column " << i % D));
  const MoeWeights& w = weights_;

  Tensor logits = w.router_quantized.defined() ? quantized_logits(x32, w.router_quantized, w.router_bias)
                                               : router_logits(x32, w.router, w.router_bias.view());
  Routing routing = route(config_.router, logits, w.selection_bias.view());

  Tensor y = Tensor::uninitialized({T, D}, DType::f32);  // run_experts overwrites every row
  if (routed) {
    (*routed)(x32, routing, y);
  } else {
    run_experts(w.experts, body(), x32, routing.ids, routing.weights, config_.router.weight_on_input, y, false,
                saved ? &saved->routed : nullptr, mode_);
  }

  if (config_.shared_width > 0) {
    ExpertTrace* shared_trace = saved ? &saved->shared : nullptr;
    if (!config_.shared_gated) {
      run_dense_ffn(w.shared, shared_body(), x32, y, true, shared_trace, mode_);
    } else {
      Tensor s = Tensor::uninitialized({T, D}, DType::f32);
      run_dense_ffn(w.shared, shared_body(), x32, s, false, shared_trace, mode_);
      const Tensor g = w.shared_gate_quantized.defined() ? quantized_logits(x32, w.shared_gate_quantized, Tensor())
                                                         : router_logits(x32, w.shared_gate);  // [T, 1] fp32
      if (saved) saved->shared_gate_logits = g;
      float* ys = y.data_as<float>();
      const float* ss = s.data_as<const float>();
      const float* gs = g.data_as<const float>();
      detail::parallel_for(T, 16, [&](std::int64_t t0, std::int64_t t1) {
        for (std::int64_t t = t0; t < t1; ++t) {
          const float gate = 1.0f / (1.0f + std::exp(-gs[t]));
          for (std::int64_t d = 0; d < D; ++d) ys[t * D + d] += gate * ss[t * D + d];
        }
      });
    }
  }

  y.reshape(x.shape());
  if (saved != nullptr) {
    saved->shape = x.shape();
    saved->dtype = x.dtype();
    if (x_owned.numel() > 0) {
      saved->x = x_owned;
    } else {
      saved->x = Tensor::uninitialized(x32.shape(), DType::f32);
      if (x32.nbytes() > 0) std::memcpy(saved->x.data(), x32.data(), x32.nbytes());
    }
    saved->logits = std::move(logits);
    saved->routing = std::move(routing);
  }
  if (info != nullptr) {
    Shape ls = x.shape();
    ls.back() = config_.router.num_experts;
    logits.reshape(ls);
    Shape rs = x.shape();
    rs.back() = config_.router.top_k;
    routing.ids.reshape(rs);
    routing.weights.reshape(rs);
    info->logits = std::move(logits);
    info->routing = std::move(routing);
  }
  if (x.dtype() == DType::f32) return y;
  return to_dtype(y, x.dtype());
}

}  // namespace moekit
