// AdamW and SGD with momentum, global-norm clipping and learning-rate schedules, fp32.
#include <cmath>
#include <map>
#include <stdexcept>

#include "moekit/train.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;

Named named(const MoeTensors& t) {
  Named out;
  t.for_each([&](const std::string& name, const Tensor& v) { out.emplace_back(name, v); });
  return out;
}

// Weight decay applies to matrices, never to biases (the usual convention).
bool decays(const std::string& name) { return name.find("bias") == std::string::npos; }

Tensor* member(MoeTensors& t, const std::string& name) {
  Tensor* all[] = {&t.router, &t.router_bias, &t.gate, &t.up, &t.down, &t.gate_bias, &t.up_bias, &t.down_bias,
                   &t.shared_gate_proj, &t.shared_up_proj, &t.shared_down_proj, &t.shared_gate};
  const char* names[] = {"router", "router_bias", "experts.gate", "experts.up", "experts.down", "experts.gate_bias",
                         "experts.up_bias", "experts.down_bias", "shared.gate_proj", "shared.up_proj",
                         "shared.down_proj", "shared_gate"};
  for (std::size_t i = 0; i < 12; ++i)
    if (name == names[i]) return all[i];
  return nullptr;
}

MoeTensors zeros_shaped(const MoeTensors& like) {
  MoeTensors z;
  like.for_each([&](const std::string& name, const Tensor& t) { *member(z, name) = Tensor(t.shape(), DType::f32); });
  return z;
}

}  // namespace

double LrSchedule::at(std::int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (decay == Decay::constant || total_steps <= warmup) return lr;
  const double f = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total_steps - warmup));
  if (decay == Decay::linear) return min_lr + (lr - min_lr) * (1.0 - f);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * f));
}

void LrSchedule::validate() const {
  if (!std::isfinite(lr) || lr < 0 || !std::isfinite(min_lr) || min_lr < 0 || min_lr > lr)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LrSchedule] need 0 <= min_lr <= lr, finite; got lr "
                                           << lr << ", min_lr " << min_lr));
  if (warmup < 0) throw std::invalid_argument(MOEKIT_MSG("[moekit::LrSchedule] warmup (" << warmup << ") < 0"));
  if (decay != Decay::constant && total_steps <= warmup)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LrSchedule] a decaying schedule needs total_steps ("
                                           << total_steps << ") > warmup (" << warmup << ")"));
}

Optimizer Optimizer::adamw(AdamWOptions options) {
  if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 && options.eps > 0 &&
        options.weight_decay >= 0 && std::isfinite(options.weight_decay)))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::adamw] need beta1, beta2 in [0, 1), eps > 0, "
                                           "weight_decay >= 0; got "
                                           << options.beta1 << ", " << options.beta2 << ", " << options.eps << ", "
                                           << options.weight_decay));
  Optimizer o;
  o.kind_ = Kind::adamw;
  o.adam_ = options;
  return o;
}

Optimizer Optimizer::sgd(SgdOptions options) {
  if (!(options.momentum >= 0 && options.momentum < 1 && options.weight_decay >= 0 &&
        std::isfinite(options.weight_decay)))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::sgd] need momentum in [0, 1), weight_decay >= 0; got "
                                           << options.momentum << ", " << options.weight_decay));
  Optimizer o;
  o.kind_ = Kind::sgd;
  o.sgd_ = options;
  return o;
}

void Optimizer::step(MoeTensors& params, const MoeTensors& grads, double lr) {
  if (!std::isfinite(lr) || lr < 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::step] lr must be finite and >= 0, got " << lr));
  const Named ps = named(params), gs = named(grads);
  if (ps.size() != gs.size())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::step] " << ps.size() << " parameters but "
                                                                        << gs.size() << " gradients"));
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (ps[i].first != gs[i].first || ps[i].second.shape() != gs[i].second.shape() ||
        gs[i].second.dtype() != DType::f32 || ps[i].second.dtype() != DType::f32)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::step] parameter " << ps[i].first << " "
                                                                                    << shape_str(ps[i].second.shape())
                                                                                    << " vs gradient " << gs[i].first
                                                                                    << " "
                                                                                    << shape_str(gs[i].second.shape())));
  if (steps_ == 0 && named(m_).empty()) {
    m_ = zeros_shaped(params);
    if (kind_ == Kind::adamw) v_ = zeros_shaped(params);
  }
  ++steps_;
  const float flr = static_cast<float>(lr);
  if (kind_ == Kind::adamw) {
    const float b1 = static_cast<float>(adam_.beta1), b2 = static_cast<float>(adam_.beta2);
    const float eps = static_cast<float>(adam_.eps);
    const double c1 = 1.0 - std::pow(adam_.beta1, static_cast<double>(steps_));
    const double c2 = 1.0 - std::pow(adam_.beta2, static_cast<double>(steps_));
    const float step_size = static_cast<float>(lr / c1);
    const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      float* p = ps[i].second.data_as<float>();
      const float* g = gs[i].second.data_as<const float>();
      float* m = member(m_, ps[i].first)->data_as<float>();
      float* v = member(v_, ps[i].first)->data_as<float>();
      const float decay = decays(ps[i].first) ? 1.0f - flr * static_cast<float>(adam_.weight_decay) : 1.0f;
      for (std::int64_t j = 0; j < ps[i].second.numel(); ++j) {
        m[j] = b1 * m[j] + (1.0f - b1) * g[j];
        v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
        p[j] = p[j] * decay - step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_c2 + eps);
      }
    }
    return;
  }
  const float mu = static_cast<float>(sgd_.momentum), wd = static_cast<float>(sgd_.weight_decay);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    float* p = ps[i].second.data_as<float>();
    const float* g = gs[i].second.data_as<const float>();
    float* buf = member(m_, ps[i].first)->data_as<float>();
    const bool d = decays(ps[i].first);
    for (std::int64_t j = 0; j < ps[i].second.numel(); ++j) {
      const float gj = d ? g[j] + wd * p[j] : g[j];
      buf[j] = steps_ == 1 ? gj : mu * buf[j] + gj;
      p[j] -= flr * (sgd_.nesterov ? gj + mu * buf[j] : buf[j]);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  Named out;
  const char* first = kind_ == Kind::adamw ? "m." : "momentum.";
  for (auto& [name, t] : named(m_)) out.emplace_back(first + name, t);
  if (kind_ == Kind::adamw)
    for (auto& [name, t] : named(v_)) out.emplace_back("v." + name, t);
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state, std::int64_t steps,
                           const MoeTensors& params) {
  if (steps < 0) throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::load_state] steps (" << steps << ") < 0"));
  std::map<std::string, Tensor> given(state.begin(), state.end());
  MoeTensors m, v;
  const Named ps = named(params);
  const std::vector<std::pair<std::string, MoeTensors*>> slots =
      kind_ == Kind::adamw ? std::vector<std::pair<std::string, MoeTensors*>>{{"m.", &m}, {"v.", &v}}
                           : std::vector<std::pair<std::string, MoeTensors*>>{{"momentum.", &m}};
  if (steps == 0 && state.empty()) {
    m_ = MoeTensors();
    v_ = MoeTensors();
    steps_ = 0;
    return;
  }
  // (No structured bindings here: clang 14 cannot capture them in MOEKIT_MSG's lambda.)
  for (const auto& slot : slots)
    for (const auto& param : ps) {
      const std::string key = slot.first + param.first;
      const Shape& shape = param.second.shape();
      const auto it = given.find(key);
      if (it == given.end())
        throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::load_state] missing '" << key << "'"));
      if (it->second.shape() != shape || it->second.dtype() != DType::f32)
        throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::load_state] '" << key << "' is "
                                                                                   << dtype_name(it->second.dtype())
                                                                                   << " "
                                                                                   << shape_str(it->second.shape())
                                                                                   << ", the parameter f32 "
                                                                                   << shape_str(shape)));
      *member(*slot.second, param.first) = it->second.clone();
      given.erase(it);
    }
  if (!given.empty())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::load_state] unexpected '" << given.begin()->first
                                                                                          << "' for this optimizer"));
  m_ = m;
  v_ = v;
  steps_ = steps;
}

double grad_norm(const std::vector<const MoeTensors*>& grads) {
  double sum = 0;
  for (const MoeTensors* g : grads)
    g->for_each([&](const std::string&, const Tensor& t) {
      const float* p = t.data_as<const float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) sum += static_cast<double>(p[i]) * p[i];
    });
  return std::sqrt(sum);
}

double clip_grad_norm(const std::vector<MoeTensors*>& grads, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::clip_grad_norm] max_norm must be finite and > 0, got " << max_norm));
  const std::vector<const MoeTensors*> cg(grads.begin(), grads.end());
  const double norm = grad_norm(cg);
  if (!std::isfinite(norm))
    throw std::runtime_error(MOEKIT_MSG("[moekit::clip_grad_norm] the gradient norm is " << norm
                                                                                         << "; nothing was scaled"));
  if (norm <= max_norm) return norm;
  const float s = static_cast<float>(max_norm / (norm + 1e-6));
  for (MoeTensors* g : grads)
    g->for_each([&](const std::string&, const Tensor& t) {
      float* p = t.data_as<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= s;
    });
  return norm;
}

}  // namespace moekit
