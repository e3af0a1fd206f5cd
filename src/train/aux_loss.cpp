// Auxiliary load-balancing losses and the router z-loss (docs/training.md, "Auxiliary losses"), with their gradients
// with respect to the router logits; counts are constants.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "moekit/train.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// p(t) = the token's scores normalised over all E, and dp -> dz (the Jacobian's transpose).
struct Normalised {
  ScoreFunc f;
  std::vector<double> s, p;  // raw scores (sigmoid kinds), normalised scores
  double sum = 1;

  void eval(const float* z, std::int64_t E) {
    s.resize(static_cast<std::size_t>(E));
    p.resize(static_cast<std::size_t>(E));
    if (f == ScoreFunc::softmax || f == ScoreFunc::softmax_selected) {
      double mx = z[0];
      for (std::int64_t e = 1; e < E; ++e) mx = std::max<double>(mx, z[e]);
      sum = 0;
      for (std::int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(z[e] - mx));
      for (std::int64_t e = 0; e < E; ++e) p[e] = s[e] / sum;
      return;
    }
    sum = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      s[e] = f == ScoreFunc::sqrt_softplus ? std::sqrt(std::max(0.0, static_cast<double>(z[e])) +
                                                       std::log1p(std::exp(-std::fabs(static_cast<double>(z[e])))))
                                           : sigmoid(z[e]);
      sum += s[e];
    }
    for (std::int64_t e = 0; e < E; ++e) p[e] = s[e] / sum;
  }

  // dz[e] += the gradient through p of dL/dp = dp.
  void backward(const float* z, const double* dp, std::int64_t E, float* dz) const {
    double dot = 0;
    for (std::int64_t e = 0; e < E; ++e) dot += dp[e] * p[e];
    for (std::int64_t e = 0; e < E; ++e) {
      if (f == ScoreFunc::softmax || f == ScoreFunc::softmax_selected) {
        dz[e] += static_cast<float>(p[e] * (dp[e] - dot));
        continue;
      }
      const double ds = (dp[e] - dot) / sum;
      const double dsdz = f == ScoreFunc::sqrt_softplus ? (s[e] > 0 ? sigmoid(z[e]) / (2 * s[e]) : 0.0)
                                                         : s[e] * (1 - s[e]);
      dz[e] += static_cast<float>(ds * dsdz);
    }
  }
};

}  // namespace

AuxLosses aux_losses(const RouterConfig& cfg, const TensorView& logits, const TensorView& ids,
                     const AuxLossOptions& o) {
  validate(cfg);
  const std::int64_t E = cfg.num_experts, K = cfg.top_k;
  // (Not a structured binding: clang 14 cannot capture one in MOEKIT_MSG's lambda.)
  for (const auto& coef : {std::pair{o.switch_coef, "switch_coef"}, std::pair{o.seq_coef, "seq_coef"},
                           std::pair{o.z_coef, "z_coef"}})
    if (!std::isfinite(coef.first) || coef.first < 0)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::aux_losses] " << coef.second << " must be finite and >= 0, got "
                                                                     << coef.first));
  detail::expect_tensor("aux_losses", "logits", logits, {DType::f32}, {"T", E});
  const std::int64_t T = logits.dim(0);
  detail::expect_tensor("aux_losses", "ids", ids, {DType::i32}, {T, K});
  std::vector<std::int64_t> starts = o.sequence_starts.empty() ? std::vector<std::int64_t>{0} : o.sequence_starts;
  if (starts.front() != 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::aux_losses] sequence_starts must begin at 0, got " << starts.front()));
  for (std::size_t i = 1; i < starts.size(); ++i)
    if (starts[i] <= starts[i - 1] || starts[i] >= T)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::aux_losses] sequence_starts must ascend strictly within [0, "
                                             << T << "), got " << starts[i - 1] << " then " << starts[i]));
  if (o.total_tokens < 0 || (o.total_tokens > 0 && o.total_tokens < T) || o.total_sequences < 0 ||
      (!o.total_counts.empty() && static_cast<std::int64_t>(o.total_counts.size()) != E))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::aux_losses] total_tokens ("
                                           << o.total_tokens << ") must be 0 or >= T (" << T
                                           << "), total_sequences (" << o.total_sequences
                                           << ") >= 0, total_counts " << o.total_counts.size()
                                           << " entries (0 or E = " << E << ")"));
  std::vector<std::int64_t> counts = expert_counts(ids, E);  // validates the ids
  if (!o.total_counts.empty()) counts = o.total_counts;
  const double T_all = static_cast<double>(o.total_tokens > 0 ? o.total_tokens : T);
  AuxLosses out;
  out.dlogits = Tensor({T, E}, DType::f32);
  if (T == 0) return out;
  const float* z = logits.data_as<const float>();
  const std::int32_t* id = ids.data_as<const std::int32_t>();
  float* dz = out.dlogits.data_as<float>();
  Normalised norm{cfg.score_func, {}, {}, 1};
  std::vector<double> dp(static_cast<std::size_t>(E));

  // Switch / GShard: α E/(K T²) Σ_i P_i c_i, P_i = Σ_t p_i(t).
  if (o.switch_coef > 0) {
    const double c =
        o.switch_coef * static_cast<double>(E) / (static_cast<double>(K) * T_all * T_all);
    for (std::int64_t t = 0; t < T; ++t) {
      norm.eval(z + t * E, E);
      for (std::int64_t e = 0; e < E; ++e) {
        out.switch_loss += c * norm.p[e] * static_cast<double>(counts[e]);
        dp[e] = c * static_cast<double>(counts[e]);
      }
      norm.backward(z + t * E, dp.data(), E, dz + t * E);
    }
  }
  // DeepSeek-V3 sequence-wise: per sequence α Σ_i f_i P_i, averaged over the sequences.
  if (o.seq_coef > 0) {
    const double n_seq = static_cast<double>(
        o.total_sequences > 0 ? o.total_sequences : static_cast<std::int64_t>(starts.size()));
    for (std::size_t si = 0; si < starts.size(); ++si) {
      const std::int64_t a = starts[si], b = si + 1 < starts.size() ? starts[si + 1] : T, Ts = b - a;
      std::vector<double> f(static_cast<std::size_t>(E), 0.0), P(static_cast<std::size_t>(E), 0.0);
      for (std::int64_t t = a; t < b; ++t)
        for (std::int64_t k = 0; k < K; ++k) f[id[t * K + k]] += static_cast<double>(E) / (static_cast<double>(K) * Ts);
      for (std::int64_t t = a; t < b; ++t) {
        norm.eval(z + t * E, E);
        for (std::int64_t e = 0; e < E; ++e) {
          P[e] += norm.p[e] / static_cast<double>(Ts);
          dp[e] = o.seq_coef * f[e] / (static_cast<double>(Ts) * n_seq);
        }
        norm.backward(z + t * E, dp.data(), E, dz + t * E);
      }
      for (std::int64_t e = 0; e < E; ++e) out.seq_loss += o.seq_coef * f[e] * P[e] / n_seq;
    }
  }
  // z-loss: c_z / T Σ_t LSE_t², dz = c_z · 2/T · LSE_t · softmax(z_t).
  if (o.z_coef > 0) {
    for (std::int64_t t = 0; t < T; ++t) {
      const float* zt = z + t * E;
      double mx = zt[0];
      for (std::int64_t e = 1; e < E; ++e) mx = std::max<double>(mx, zt[e]);
      double sum = 0;
      for (std::int64_t e = 0; e < E; ++e) sum += std::exp(zt[e] - mx);
      const double lse = mx + std::log(sum);
      out.z_loss += o.z_coef * lse * lse / T_all;
      const double c = o.z_coef * 2.0 / T_all * lse;
      for (std::int64_t e = 0; e < E; ++e) dz[t * E + e] += static_cast<float>(c * std::exp(zt[e] - mx) / sum);
    }
  }
  return out;
}

}  // namespace moekit
