// AdamW and SGD with momentum, global-norm clipping and learning-rate schedules, fp32.
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "moekit/train.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

constexpr std::int64_t kGrain = 1 << 15;  // elements per chunk of the elementwise updates

// Weight decay applies to matrices and embeddings, never to biases or norm gains.
bool decays(const std::string& name) {
  return name.find("bias") == std::string::npos && name.find("norm") == std::string::npos;
}

void check_pairs(const NamedTensors& ps, const NamedTensors& gs) {
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
}

}  // namespace

NamedTensors named_tensors(const MoeTensors& t, const std::string& prefix) {
  NamedTensors out;
  t.for_each([&](const std::string& name, const Tensor& v) { out.emplace_back(prefix + name, v); });
  return out;
}

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
  step(named_tensors(params), named_tensors(grads), lr);
}

void Optimizer::step(const NamedTensors& ps, const NamedTensors& gs, double lr, float grad_scale) {
  if (!std::isfinite(lr) || lr < 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::step] lr must be finite and >= 0, got " << lr));
  check_pairs(ps, gs);
  // The state is allocated on the first step; later steps must update the same tensors.
  if (m_.empty()) {
    for (const auto& [name, t] : ps) {
      m_[name] = Tensor(t.shape(), DType::f32);
      if (kind_ == Kind::adamw) v_[name] = Tensor(t.shape(), DType::f32);
    }
  } else {
    bool same = m_.size() == ps.size();
    for (std::size_t i = 0; same && i < ps.size(); ++i) {
      const auto it = m_.find(ps[i].first);
      same = it != m_.end() && it->second.shape() == ps[i].second.shape();
    }
    if (!same)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::step] the parameters differ from those of the first "
                                             "step (" << m_.size() << " tensors in the state, "
                                                      << ps.size() << " given)"));
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
      float* m = m_.at(ps[i].first).data_as<float>();
      float* v = v_.at(ps[i].first).data_as<float>();
      const float decay = decays(ps[i].first) ? 1.0f - flr * static_cast<float>(adam_.weight_decay) : 1.0f;
      // Elementwise: any split over threads gives the same bits.
      detail::parallel_for(ps[i].second.numel(), kGrain, [&](std::int64_t j0, std::int64_t j1) {
        for (std::int64_t j = j0; j < j1; ++j) {
          const float gj = grad_scale == 1.0f ? g[j] : g[j] * grad_scale;
          m[j] = b1 * m[j] + (1.0f - b1) * gj;
          v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
          p[j] = p[j] * decay - step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_c2 + eps);
        }
      });
    }
    return;
  }
  const float mu = static_cast<float>(sgd_.momentum), wd = static_cast<float>(sgd_.weight_decay);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    float* p = ps[i].second.data_as<float>();
    const float* g = gs[i].second.data_as<const float>();
    float* buf = m_.at(ps[i].first).data_as<float>();
    const bool d = decays(ps[i].first);
    detail::parallel_for(ps[i].second.numel(), kGrain, [&](std::int64_t j0, std::int64_t j1) {
      for (std::int64_t j = j0; j < j1; ++j) {
        const float gs_j = grad_scale == 1.0f ? g[j] : g[j] * grad_scale;
        const float gj = d ? gs_j + wd * p[j] : gs_j;
        buf[j] = steps_ == 1 ? gj : mu * buf[j] + gj;
        p[j] -= flr * (sgd_.nesterov ? gj + mu * buf[j] : buf[j]);
      }
    });
  }
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  const char* first = kind_ == Kind::adamw ? "m." : "momentum.";
  for (const auto& [name, t] : m_) out.emplace_back(first + name, t);
  if (kind_ == Kind::adamw)
    for (const auto& [name, t] : v_) out.emplace_back("v." + name, t);
  return out;
}

void Optimizer::load_state(const NamedTensors& state, std::int64_t steps, const MoeTensors& params) {
  load_state(state, steps, named_tensors(params));
}

void Optimizer::load_state(const NamedTensors& state, std::int64_t steps, const NamedTensors& ps) {
  if (steps < 0) throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::load_state] steps (" << steps << ") < 0"));
  if (steps == 0 && state.empty()) {
    m_.clear();
    v_.clear();
    steps_ = 0;
    return;
  }
  std::map<std::string, Tensor> given(state.begin(), state.end());
  std::map<std::string, Tensor> m, v;
  const std::vector<std::pair<std::string, std::map<std::string, Tensor>*>> slots =
      kind_ == Kind::adamw ? std::vector<std::pair<std::string, std::map<std::string, Tensor>*>>{{"m.", &m}, {"v.", &v}}
                           : std::vector<std::pair<std::string, std::map<std::string, Tensor>*>>{{"momentum.", &m}};
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
      (*slot.second)[param.first] = it->second.clone();
      given.erase(it);
    }
  if (!given.empty())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Optimizer::load_state] unexpected '" << given.begin()->first
                                                                                          << "' for this optimizer"));
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = steps;
}

namespace {
// Σ x² in double: fixed blocks of kBlock elements summed in order, then the block sums in order
// (the same bits for any thread count).
double sum_squares(const Tensor& t) {
  constexpr std::int64_t kBlock = 1 << 16;
  const float* p = t.data_as<const float>();
  const std::int64_t n = t.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<std::size_t>(blocks), 0.0);
  detail::parallel_for(blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      double s = 0;
      for (std::int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) s += static_cast<double>(p[i]) * p[i];
      part[static_cast<std::size_t>(b)] = s;
    }
  });
  double sum = 0;
  for (const double s : part) sum += s;
  return sum;
}
void scale_all(const Tensor& t, float s) {
  float* p = t.data_as<float>();
  detail::parallel_for(t.numel(), kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) p[i] *= s;
  });
}
}  // namespace

double grad_sum_squares(const NamedTensors& grads) {
  double sum = 0;
  for (const auto& [name, t] : grads) sum += sum_squares(t);
  return sum;
}

double grad_norm(const NamedTensors& grads) { return std::sqrt(grad_sum_squares(grads)); }

double clip_grad_norm(const NamedTensors& grads, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::clip_grad_norm] max_norm must be finite and > 0, got " << max_norm));
  const double norm = grad_norm(grads);
  if (!std::isfinite(norm))
    throw std::runtime_error(MOEKIT_MSG("[moekit::clip_grad_norm] the gradient norm is " << norm
                                                                                         << "; nothing was scaled"));
  if (norm <= max_norm) return norm;
  const float s = clip_factor(norm, max_norm);
  for (const auto& [name, t] : grads) scale_all(t, s);
  return norm;
}

float clip_factor(double norm, double max_norm) {
  return norm <= max_norm ? 1.0f : static_cast<float>(max_norm / (norm + 1e-6));
}

namespace {
NamedTensors all_named(const std::vector<const MoeTensors*>& blocks) {
  NamedTensors out;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    NamedTensors one = named_tensors(*blocks[i], std::to_string(i) + ".");
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}
}  // namespace

double grad_norm(const std::vector<const MoeTensors*>& grads) { return grad_norm(all_named(grads)); }

double clip_grad_norm(const std::vector<MoeTensors*>& grads, double max_norm) {
  return clip_grad_norm(all_named(std::vector<const MoeTensors*>(grads.begin(), grads.end())), max_norm);
}

}  // namespace moekit
