// Trainable parameters: owned f32 copies of a layer's weights, and layers that compute on them.
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "experts/weight_matrix.hpp"
#include "kernels/gemm.hpp"
#include "moekit/train.hpp"
#include "util/error.hpp"
#include "util/splitmix.hpp"

namespace moekit {

namespace {

// Expert e's matrix widened to f32 [rows, cols] at dst (any layout; a quantized format decoded
// exactly, with the values its kernels multiply by).
void widen_expert(const ExpertMatrix& m, std::int64_t e, float* dst) {
  const std::int64_t R = m.rows, C = m.cols;
  if (m.quantized()) return kernels::dequantize_rows(weight_matrix(m, e), 0, R, C, dst);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t i = kernels::weight_offset(layout(m.layout), r, c, C, m.row_stride);
      dst[r * C + c] = kernels::load_f32(m.experts[e], m.dtype, i);
    }
}

Tensor widen(const ExpertMatrix& m, bool stacked) {
  if (!m.defined()) return Tensor();
  const std::int64_t E = m.num_experts();
  Tensor t(stacked ? Shape{E, m.rows, m.cols} : Shape{m.rows, m.cols}, DType::f32);
  for (std::int64_t e = 0; e < E; ++e) widen_expert(m, e, t.data_as<float>() + e * m.rows * m.cols);
  return t;
}

Tensor copy_f32(const TensorView& v) { return v.defined() && v.numel() > 0 ? to_dtype(v, DType::f32) : Tensor(); }

void keep(MoeWeights& w, const Tensor& t) {
  if (t.numel() > 0) w.keep_alive.push_back(std::make_shared<Tensor>(t));
}

using detail::fill_normal;

}  // namespace

MoeTensors init_parameters(const MoeConfig& config, std::uint64_t seed) {
  validate(config.router);
  if (config.hidden_size < 1 || config.expert_width < 1 || config.shared_width < 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::init_parameters] hidden_size (" << config.hidden_size
                                                                                     << ") and expert_width ("
                                                                                     << config.expert_width
                                                                                     << ") must be >= 1, shared_width ("
                                                                                     << config.shared_width << ") >= 0"));
  const std::int64_t E = config.router.num_experts, D = config.hidden_size, F = config.expert_width;
  const std::int64_t S = config.shared_width;
  const bool gated = is_gated(config.body);
  std::uint64_t state = seed;
  const auto draw = [&](Shape shape, std::int64_t fan_in) {
    Tensor t(std::move(shape), DType::f32);
    fill_normal(t, 1.0 / std::sqrt(static_cast<double>(fan_in)), state);
    return t;
  };
  MoeTensors p;
  p.router = draw({E, D}, D);
  if (config.router.has_router_bias) p.router_bias = Tensor({E}, DType::f32);
  if (gated) p.gate = draw({E, F, D}, D);
  p.up = draw({E, F, D}, D);
  p.down = draw({E, D, F}, F);
  if (config.expert_bias) {
    if (gated) p.gate_bias = Tensor({E, F}, DType::f32);
    p.up_bias = Tensor({E, F}, DType::f32);
    p.down_bias = Tensor({E, D}, DType::f32);
  }
  if (S > 0) {
    if (gated) p.shared_gate_proj = draw({S, D}, D);
    p.shared_up_proj = draw({S, D}, D);
    p.shared_down_proj = draw({D, S}, S);
    if (config.shared_gated) p.shared_gate = draw({1, D}, D);
  }
  return p;
}

std::size_t MoeTensors::nbytes() const {
  std::size_t n = 0;
  for_each([&](const std::string&, const Tensor& t) { n += t.nbytes(); });
  return n;
}

MoeTensors MoeTensors::zeros_like(const MoeLayer& layer) {
  const MoeConfig& c = layer.config();
  const MoeWeights& w = layer.weights();
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width, S = c.shared_width;
  const auto z = [](Shape s) { return Tensor(std::move(s), DType::f32); };
  MoeTensors t;
  t.router = z({E, D});
  if (c.router.has_router_bias) t.router_bias = z({E});
  if (w.experts.gate.defined()) t.gate = z({E, F, D});
  t.up = z({E, F, D});
  t.down = z({E, D, F});
  if (w.experts.gate_bias.numel() > 0) t.gate_bias = z({E, F});
  if (w.experts.up_bias.numel() > 0) t.up_bias = z({E, F});
  if (w.experts.down_bias.numel() > 0) t.down_bias = z({E, D});
  if (S > 0) {
    if (w.shared.gate.defined()) t.shared_gate_proj = z({S, D});
    t.shared_up_proj = z({S, D});
    t.shared_down_proj = z({D, S});
    if (c.shared_gated) t.shared_gate = z({1, D});
  }
  return t;
}

MoeTensors MoeTensors::zeros_like(const MoeTensors& like) {
  MoeTensors z;
  for (const MoeTensorMember& m : kMoeTensorMembers)
    if ((like.*m.member).numel() > 0) z.*m.member = Tensor((like.*m.member).shape(), DType::f32);
  return z;
}

MoeTensors trainable_parameters(const MoeLayer& layer) {
  const MoeWeights& w = layer.weights();
  MoeTensors p;
  // Quantized matrices (MLX affine, MXFP4, ...) widen exactly to the values the forward computes with.
  p.router = w.router_quantized.defined() ? widen(w.router_quantized, false) : copy_f32(w.router);
  p.router_bias = copy_f32(w.router_bias);
  p.gate = widen(w.experts.gate, true);
  p.up = widen(w.experts.up, true);
  p.down = widen(w.experts.down, true);
  p.gate_bias = copy_f32(w.experts.gate_bias);
  p.up_bias = copy_f32(w.experts.up_bias);
  p.down_bias = copy_f32(w.experts.down_bias);
  if (w.shared.down.defined()) {
    p.shared_gate_proj = widen(w.shared.gate, false);
    p.shared_up_proj = widen(w.shared.up, false);
    p.shared_down_proj = widen(w.shared.down, false);
  }
  p.shared_gate = w.shared_gate_quantized.defined() ? widen(w.shared_gate_quantized, false) : copy_f32(w.shared_gate);
  return p;
}

namespace {

MoeLayer trainable_layer(const MoeConfig& config, const MoeTensors& params,
                         const Tensor& selection_bias, const std::vector<std::int64_t>* local) {
  const auto shape_of = [](const Tensor& t, int rank, const char* name) {
    if (t.numel() > 0 && (t.dtype() != DType::f32 || t.rank() != rank))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::make_trainable_layer] params." << name << " must be f32 of rank "
                                                                                      << rank << ", got "
                                                                                      << dtype_name(t.dtype()) << " "
                                                                                      << shape_str(t.shape())));
  };
  shape_of(params.router, 2, "router");
  for (const auto& [t, name] : {std::pair{&params.gate, "gate"}, std::pair{&params.up, "up"}, std::pair{&params.down, "down"}})
    shape_of(*t, 3, name);
  for (const auto& [t, name] : {std::pair{&params.shared_gate_proj, "shared_gate_proj"},
                                std::pair{&params.shared_up_proj, "shared_up_proj"},
                                std::pair{&params.shared_down_proj, "shared_down_proj"},
                                std::pair{&params.shared_gate, "shared_gate"}})
    shape_of(*t, 2, name);
  if (params.up.rank() != 3 || params.down.rank() != 3 || params.router.numel() == 0 ||
      (!local && (params.up.numel() == 0 || params.down.numel() == 0)))
    throw std::invalid_argument("[moekit::make_trainable_layer] params.router, params.up and params.down are required");
  MoeWeights w;
  // Routed experts: all of them stacked, or (expert parallel) the local ones stacked and the
  // others pointing at one zero matrix per projection.
  const std::int64_t E = config.router.num_experts;
  const auto routed = [&](const Tensor& t, const char* name) {
    if (!local) return ExpertMatrix::stacked(t);
    if (t.dim(0) != static_cast<std::int64_t>(local->size()))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::make_trainable_layer] params."
                                             << name << " holds " << t.dim(0) << " experts for "
                                             << local->size() << " local experts"));
    Tensor zero({t.dim(1), t.dim(2)}, DType::f32);
    keep(w, zero);
    ExpertMatrix m = ExpertMatrix::stacked(zero);
    m.experts.assign(static_cast<std::size_t>(E), zero.data());
    const std::size_t step = static_cast<std::size_t>(t.dim(1) * t.dim(2));
    for (std::size_t i = 0; i < local->size(); ++i)
      m.experts[static_cast<std::size_t>((*local)[i])] = t.data_as<const float>() + i * step;
    return m;
  };
  if (local)
    for (std::size_t i = 0; i < local->size(); ++i)
      if ((*local)[i] < 0 || (*local)[i] >= E || (i > 0 && (*local)[i] <= (*local)[i - 1]))
        throw std::invalid_argument(
            MOEKIT_MSG("[moekit::make_trainable_layer] local expert ids must ascend within [0, "
                       << E << "); entry " << i << " is " << (*local)[i]));
  w.router = params.router.view();
  w.router_bias = params.router_bias;
  w.selection_bias = selection_bias;
  if (local ? params.gate.rank() == 3 : params.gate.numel() > 0)
    w.experts.gate = routed(params.gate, "gate");
  w.experts.up = routed(params.up, "up");
  w.experts.down = routed(params.down, "down");
  w.experts.gate_bias = params.gate_bias;
  w.experts.up_bias = params.up_bias;
  w.experts.down_bias = params.down_bias;
  if (params.shared_down_proj.numel() > 0) {
    if (params.shared_gate_proj.numel() > 0) w.shared.gate = ExpertMatrix::stacked(params.shared_gate_proj);
    if (params.shared_up_proj.numel() > 0) w.shared.up = ExpertMatrix::stacked(params.shared_up_proj);
    w.shared.down = ExpertMatrix::stacked(params.shared_down_proj);
  }
  if (params.shared_gate.numel() > 0) w.shared_gate = params.shared_gate.view();
  params.for_each([&](const std::string&, const Tensor& t) { keep(w, t); });
  w.layout = "trainable";
  return MoeLayer(config, std::move(w));
}

}  // namespace

MoeLayer make_trainable_layer(const MoeConfig& config, const MoeTensors& params,
                              const Tensor& selection_bias) {
  return trainable_layer(config, params, selection_bias, nullptr);
}

MoeLayer make_trainable_layer(const MoeConfig& config, const MoeTensors& params,
                              const Tensor& selection_bias,
                              const std::vector<std::int64_t>& local_experts) {
  return trainable_layer(config, params, selection_bias, &local_experts);
}

}  // namespace moekit
