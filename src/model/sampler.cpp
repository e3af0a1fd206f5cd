// Sampling from logits (moekit/causal_lm.hpp): llama.cpp's chain — repetition penalty, top-k,
// top-p, min-p, temperature, then a draw — or greedy argmax.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "moekit/causal_lm.hpp"
#include "util/error.hpp"

namespace moekit {

void validate(const SamplingParams& p) {
  auto bad = [](const char* what, double v, const char* range) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::sampling] " << what << " " << v << " outside " << range));
  };
  if (!(p.temperature >= 0.0) || p.temperature > 100.0) bad("temperature", p.temperature, "[0, 100]");
  if (p.top_k < 0) bad("top_k", static_cast<double>(p.top_k), "[0, vocabulary]");
  if (!(p.top_p > 0.0) || p.top_p > 1.0) bad("top_p", p.top_p, "(0, 1]");
  if (!(p.min_p >= 0.0) || p.min_p > 1.0) bad("min_p", p.min_p, "[0, 1]");
  if (!(p.repetition_penalty > 0.0) || p.repetition_penalty > 100.0)
    bad("repetition_penalty", p.repetition_penalty, "(0, 100]");
  if (p.repeat_last_n < 0) bad("repeat_last_n", static_cast<double>(p.repeat_last_n), "[0, context]");
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

std::int32_t Sampler::sample(const float* logits, std::int64_t V, const std::vector<std::int32_t>& history) {
  std::vector<std::pair<float, std::int32_t>>& c = scratch_;
  c.resize(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < V; ++i) {
    if (!std::isfinite(logits[i]) && !(std::isinf(logits[i]) && logits[i] < 0))
      throw std::runtime_error(
          MOEKIT_MSG("[moekit::sample] logit " << i << " is " << logits[i] << ": the model's computation overflowed"));
    c[static_cast<std::size_t>(i)] = {logits[i], static_cast<std::int32_t>(i)};
  }
  if (p_.repetition_penalty != 1.0 && p_.repeat_last_n > 0) {
    const std::size_t n = std::min(history.size(), static_cast<std::size_t>(p_.repeat_last_n));
    std::vector<std::int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const float r = static_cast<float>(p_.repetition_penalty);
    for (const std::int32_t id : seen) {
      if (id < 0 || id >= V) continue;
      float& l = c[static_cast<std::size_t>(id)].first;
      l = l > 0 ? l / r : l * r;
    }
  }
  // Highest logit first; the lower id first among equals (so greedy is the lowest argmax).
  auto better = [](const std::pair<float, std::int32_t>& a, const std::pair<float, std::int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p_.temperature <= 0.0) return std::min_element(c.begin(), c.end(), better)->second;
  std::size_t keep = c.size();
  if (p_.top_k > 0) keep = std::min(keep, static_cast<std::size_t>(p_.top_k));
  std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(keep), c.end(), better);
  c.resize(keep);
  // Probabilities at temperature 1 for top-p and min-p (llama.cpp applies them before the temperature).
  std::vector<double> prob(c.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < c.size(); ++i) sum += prob[i] = std::exp(static_cast<double>(c[i].first - c[0].first));
  if (p_.top_p < 1.0) {
    double acc = 0.0;
    std::size_t n = 0;
    while (n < c.size()) {
      acc += prob[n++] / sum;
      if (acc >= p_.top_p) break;
    }
    c.resize(n);
    prob.resize(n);
  }
  if (p_.min_p > 0.0) {
    std::size_t n = 1;
    while (n < c.size() && prob[n] / prob[0] >= p_.min_p) ++n;
    c.resize(n);
  }
  std::vector<double> w(c.size());
  for (std::size_t i = 0; i < c.size(); ++i)
    w[i] = std::exp(static_cast<double>(c[i].first - c[0].first) / p_.temperature);
  std::discrete_distribution<std::size_t> pick(w.begin(), w.end());
  return c[pick(rng_)].second;
}

}  // namespace moekit
