// The loss-free balancer (docs/training.md, "Aux-loss-free balancing"), its rate schedule and the load metrics ("Load metrics").
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "moekit/train.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"

namespace moekit {

double RateSchedule::at(std::int64_t step) const {
  if (freeze_step >= 0 && step >= freeze_step) return 0.0;
  if (!pieces.empty()) {
    double r = rate;
    for (const auto& [s, v] : pieces)
      if (s <= step) r = v;
    return r;
  }
  if (decay_end > decay_start && decay_start >= 0 && step >= decay_start) {
    if (step >= decay_end) return final_rate;
    const double f = static_cast<double>(step - decay_start) / static_cast<double>(decay_end - decay_start);
    return rate + (final_rate - rate) * f;
  }
  return rate;
}

void RateSchedule::validate() const {
  const auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  if (bad(rate) || bad(final_rate))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::RateSchedule] rates must be finite and >= 0, got rate "
                                           << rate << ", final_rate " << final_rate));
  if (decay_end >= 0 && decay_end < decay_start)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::RateSchedule] decay_end (" << decay_end << ") < decay_start ("
                                                                                << decay_start << ")"));
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (bad(pieces[i].second))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::RateSchedule] piece " << i << " has rate " << pieces[i].second));
    if (i > 0 && pieces[i].first <= pieces[i - 1].first)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::RateSchedule] piece steps must ascend: "
                                             << pieces[i - 1].first << " then " << pieces[i].first));
  }
}

LoadMetrics load_metrics(const std::vector<std::int64_t>& counts) {
  LoadMetrics m;
  m.max_violation = max_violation(counts);
  for (std::int64_t c : counts) {
    m.tokens += c;
    if (c == 0) ++m.dead_experts;
  }
  if (m.tokens > 0)
    for (std::int64_t c : counts)
      if (c > 0) {
        const double p = static_cast<double>(c) / static_cast<double>(m.tokens);
        m.entropy -= p * std::log(p);
      }
  return m;
}

LoadBalancer::LoadBalancer(std::int64_t num_experts, BalanceRule rule, RateSchedule rate)
    : rule_(rule), rate_(std::move(rate)) {
  if (num_experts < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LoadBalancer] num_experts (" << num_experts << ") must be >= 1"));
  rate_.validate();
  counts_.assign(static_cast<std::size_t>(num_experts), 0);
}

void LoadBalancer::count(const SavedForward& saved) {
  const DispatchPlan& plan = saved.routed.plan;
  if (static_cast<std::int64_t>(plan.counts.size()) != num_experts())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LoadBalancer::count] saved forward has "
                                           << plan.counts.size() << " experts, the balancer " << num_experts()));
  for (std::size_t e = 0; e < counts_.size(); ++e) counts_[e] += plan.counts[e];
}

void LoadBalancer::add_counts(const std::vector<std::int64_t>& counts) {
  if (counts.size() != counts_.size())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LoadBalancer::add_counts] " << counts.size()
                                                                               << " counts for " << num_experts()
                                                                               << " experts"));
  for (std::size_t e = 0; e < counts.size(); ++e)
    if (counts[e] < 0)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LoadBalancer::add_counts] count of expert " << e << " is "
                                                                                                << counts[e]));
  for (std::size_t e = 0; e < counts.size(); ++e) counts_[e] += counts[e];
}

BalanceUpdate LoadBalancer::update(const Tensor& bias, std::int64_t step) {
  const std::int64_t E = num_experts();
  detail::expect_tensor("LoadBalancer::update", "bias", bias, {DType::f32}, {E});
  BalanceUpdate u;
  u.load = load_metrics(counts_);
  u.rate = rate_.at(step);
  float* b = bias.data_as<float>();
  if (u.load.tokens > 0 && u.rate > 0) {
    const double mean = static_cast<double>(u.load.tokens) / static_cast<double>(E);
    const float rate = static_cast<float>(u.rate);
    for (std::int64_t e = 0; e < E; ++e) {
      const double err = mean - static_cast<double>(counts_[e]);  // > 0: under-loaded
      if (rule_ == BalanceRule::sign) {
        b[e] += err > 0 ? rate : (err < 0 ? -rate : 0.0f);
      } else {
        b[e] += static_cast<float>(u.rate * err / mean);
      }
    }
  }
  std::fill(counts_.begin(), counts_.end(), 0);
  double sum = 0;
  u.bias_min = u.bias_max = b[0];
  for (std::int64_t e = 0; e < E; ++e) {
    u.bias_min = std::min<double>(u.bias_min, b[e]);
    u.bias_max = std::max<double>(u.bias_max, b[e]);
    sum += b[e];
  }
  u.bias_mean = sum / static_cast<double>(E);
  return u;
}

MoeConfig with_selection_bias(MoeConfig config) {
  config.router.has_selection_bias = true;
  return config;
}

}  // namespace moekit
