// A plain double-precision MoE block with its analytic backward, written independently of
// src/train: loops per token and selected expert, the gradient formulas of docs/training.md, "The gradients moekit computes" in
// their textbook form, derivatives of the bodies worked out here. The selection (ids) is an
// input: frozen, as every reference treats it. Its own correctness is checked by central finite
// differences of forward() (backward_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "moekit/config.hpp"
#include "moekit/train.hpp"

namespace moekit::testing {

using Vec = std::vector<double>;

/// The parameters in double, shaped as MoeTensors (flattened row-major; empty where absent).
struct RefParams {
  Vec router, router_bias, gate, up, down, gate_bias, up_bias, down_bias, sg, su, sd, shared_gate;

  static Vec of(const Tensor& t) {
    Vec v(static_cast<std::size_t>(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i) v[i] = t.data_as<const float>()[i];
    return v;
  }
  static RefParams from(const MoeTensors& p) {
    return {of(p.router),    of(p.router_bias), of(p.gate),   of(p.up),
            of(p.down),      of(p.gate_bias),   of(p.up_bias), of(p.down_bias),
            of(p.shared_gate_proj), of(p.shared_up_proj), of(p.shared_down_proj), of(p.shared_gate)};
  }
  std::vector<Vec*> all() {
    return {&router, &router_bias, &gate, &up, &down, &gate_bias, &up_bias, &down_bias, &sg, &su, &sd, &shared_gate};
  }
};

inline double sig(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// h = body(a, b) and its partial derivatives dh/da, dh/db.
inline void body_eval(const MoeConfig& c, BodyKind kind, double a, double b, double& h, double& ha, double& hb) {
  const double L = c.swiglu_limit, al = c.swiglu_alpha;
  switch (kind) {
    case BodyKind::swiglu: {
      const double s = sig(a);
      h = a * s * b;
      ha = (s + a * s * (1 - s)) * b;
      hb = a * s;
      return;
    }
    case BodyKind::swiglu_clamped: {
      const double g = std::min(a, L), u = std::max(-L, std::min(b, L));
      const double s = sig(al * g);
      h = g * s * (u + 1);
      ha = a <= L ? (s + g * al * s * (1 - s)) * (u + 1) : 0.0;
      hb = (b >= -L && b <= L) ? g * s : 0.0;
      return;
    }
    case BodyKind::geglu: {
      const double cdf = 0.5 * (1 + std::erf(a / std::sqrt(2.0)));
      const double pdf = std::exp(-0.5 * a * a) / std::sqrt(2 * M_PI);
      h = a * cdf * b;
      ha = (cdf + a * pdf) * b;
      hb = a * cdf;
      return;
    }
    case BodyKind::geglu_tanh: {
      const double k = std::sqrt(2.0 / M_PI), u = k * (a + 0.044715 * a * a * a), t = std::tanh(u);
      const double gl = 0.5 * a * (1 + t);
      h = gl * b;
      ha = (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)) * b;
      hb = gl;
      return;
    }
    case BodyKind::mlp_relu:
      h = std::max(b, 0.0);
      ha = 0;
      hb = b > 0 ? 1 : 0;
      return;
    case BodyKind::mlp_relu2:
      h = b > 0 ? b * b : 0;
      ha = 0;
      hb = b > 0 ? 2 * b : 0;
      return;
    case BodyKind::mlp_silu: {
      const double s = sig(b);
      h = b * s;
      ha = 0;
      hb = s + b * s * (1 - s);
      return;
    }
  }
}

// The K gate weights of one token from its logits z (ids frozen), and dw/dz as a [K, E]
// Jacobian, in double. `renorm_taken` is the forward's decision (route()'s guard).
inline void gate_weights(const RouterConfig& r, const double* z, const std::int32_t* ids, const float* bias,
                         bool renorm_taken, double* w, double* jac) {
  const std::int64_t E = r.num_experts, K = r.top_k;
  Vec s(E), ds(E);  // scores and their derivative ds_e/dz_e (diagonal, except softmax)
  Vec p(E);
  if (r.score_func == ScoreFunc::softmax) {
    double mx = z[0], sum = 0;
    for (std::int64_t e = 1; e < E; ++e) mx = std::max(mx, z[e]);
    for (std::int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
    for (std::int64_t e = 0; e < E; ++e) s[e] = p[e] / sum;
  } else {
    for (std::int64_t e = 0; e < E; ++e) {
      if (r.score_func == ScoreFunc::sigmoid || r.score_func == ScoreFunc::sigmoid_selected) {
        s[e] = sig(z[e]);
        ds[e] = s[e] * (1 - s[e]);
      } else if (r.score_func == ScoreFunc::sqrt_softplus) {
        const double sp = std::log1p(std::exp(z[e]));
        s[e] = std::sqrt(sp);
        ds[e] = sig(z[e]) / (2 * s[e]);
      }
    }
  }
  // v_k and dv_k/dz_j.
  Vec v(K), dv(K * E, 0.0);
  if (r.score_func == ScoreFunc::softmax_selected) {
    double mx = z[ids[0]], sum = 0;
    for (std::int64_t k = 1; k < K; ++k) mx = std::max(mx, z[ids[k]]);
    for (std::int64_t k = 0; k < K; ++k) sum += (v[k] = std::exp(z[ids[k]] - mx));
    for (std::int64_t k = 0; k < K; ++k) v[k] /= sum;
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t j = 0; j < K; ++j) dv[k * E + ids[j]] = v[k] * ((k == j) - v[j]);
  } else {
    const bool biased = r.weights_from == WeightsFrom::selection_scores && bias;
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t e = ids[k];
      v[k] = s[e] + (biased ? bias[e] : 0.0);
      if (r.score_func == ScoreFunc::softmax) {
        for (std::int64_t j = 0; j < E; ++j) dv[k * E + j] = s[e] * ((e == j) - s[j]);
      } else {
        dv[k * E + e] = ds[e];
      }
    }
  }
  // renormalise: w_k = c · v_k / (Σ v + eps), or w_k = c · v_k.
  const bool scaled = !(r.scale_only_without_renorm && renorm_taken);
  const double c = scaled ? r.routed_scaling_factor : 1.0;
  double sum = 0;
  for (std::int64_t k = 0; k < K; ++k) sum += v[k];
  // sum_floor (llama.cpp): max(Σ v, eps); below the floor the denominator is a constant.
  const bool floored = r.renorm == Renorm::sum_floor && sum < r.renorm_eps;
  const double den = floored ? r.renorm_eps : sum + (r.renorm == Renorm::sum_eps ? r.renorm_eps : 0.0);
  for (std::int64_t k = 0; k < K; ++k) {
    w[k] = renorm_taken ? c * v[k] / den : c * v[k];
    for (std::int64_t j = 0; j < E; ++j) {
      double d = dv[k * E + j];
      if (renorm_taken && floored) {
        d = dv[k * E + j] / den;
      } else if (renorm_taken) {
        double dsum = 0;
        for (std::int64_t i = 0; i < K; ++i) dsum += dv[i * E + j];
        d = (dv[k * E + j] * den - v[k] * dsum) / (den * den);
      }
      jac[k * E + j] = c * d;
    }
  }
}

struct RefBlock {
  MoeConfig c;
  std::vector<std::int32_t> ids;  ///< [T, K] frozen
  std::vector<char> renorm_taken; ///< [T]
  const float* selection_bias = nullptr;

  bool gated() const { return c.body != BodyKind::mlp_relu && c.body != BodyKind::mlp_relu2 && c.body != BodyKind::mlp_silu; }
  BodyKind shared_kind() const { return c.body == BodyKind::swiglu_clamped ? BodyKind::swiglu : c.body; }

  // One FFN (expert e of stacked weights, or the shared one) on xin: fills a, b, h, o; with
  // dout given, also accumulates its gradients and returns dL/dxin in dxin.
  void ffn(const RefParams& P, RefParams* G, bool shared, std::int64_t e, const Vec& xin, Vec& o, const Vec* dout,
           Vec* dxin) const {
    const std::int64_t D = c.hidden_size, F = shared ? c.shared_width : c.expert_width;
    const Vec& Wg = shared ? P.sg : P.gate;
    const Vec& Wu = shared ? P.su : P.up;
    const Vec& Wd = shared ? P.sd : P.down;
    const bool bias = !shared && c.expert_bias;
    const bool gt = gated();
    const BodyKind kind = shared ? shared_kind() : c.body;
    const std::int64_t mo = shared ? 0 : e * F * D, fo = shared ? 0 : e * F, dofs = shared ? 0 : e * D;
    Vec a(F), b(F), h(F), ha(F), hb(F);
    for (std::int64_t f = 0; f < F; ++f) {
      double sa = 0, sb = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        if (gt) sa += Wg[mo + f * D + d] * xin[d];
        sb += Wu[mo + f * D + d] * xin[d];
      }
      if (bias) {
        if (gt) sa += P.gate_bias[fo + f];
        sb += P.up_bias[fo + f];
      }
      a[f] = sa;
      b[f] = sb;
      body_eval(c, kind, sa, sb, h[f], ha[f], hb[f]);
    }
    o.assign(D, 0.0);
    for (std::int64_t d = 0; d < D; ++d) {
      for (std::int64_t f = 0; f < F; ++f) o[d] += Wd[mo + d * F + f] * h[f];
      if (bias) o[d] += P.down_bias[dofs + d];
    }
    if (!dout) return;
    Vec& dWg = shared ? G->sg : G->gate;
    Vec& dWu = shared ? G->su : G->up;
    Vec& dWd = shared ? G->sd : G->down;
    Vec dh(F, 0.0);
    for (std::int64_t d = 0; d < D; ++d) {
      const double g = (*dout)[d];
      for (std::int64_t f = 0; f < F; ++f) {
        dWd[mo + d * F + f] += g * h[f];
        dh[f] += Wd[mo + d * F + f] * g;
      }
      if (bias) G->down_bias[dofs + d] += g;
    }
    dxin->assign(D, 0.0);
    for (std::int64_t f = 0; f < F; ++f) {
      const double da = dh[f] * ha[f], db = dh[f] * hb[f];
      for (std::int64_t d = 0; d < D; ++d) {
        if (gt) {
          dWg[mo + f * D + d] += da * xin[d];
          (*dxin)[d] += Wg[mo + f * D + d] * da;
        }
        dWu[mo + f * D + d] += db * xin[d];
        (*dxin)[d] += Wu[mo + f * D + d] * db;
      }
      if (bias) {
        if (gt) G->gate_bias[fo + f] += da;
        G->up_bias[fo + f] += db;
      }
    }
  }

  /// L = Σ y·dy for x [T, D]; with G set, also the gradients into G (zeroed here) and dx.
  double run(const RefParams& P, const Vec& x, const Vec& dy, RefParams* G, Vec* dx) const {
    const std::int64_t D = c.hidden_size, E = c.router.num_experts, K = c.router.top_k;
    const std::int64_t T = static_cast<std::int64_t>(x.size()) / D;
    if (G) {
      RefParams& g = *G;
      g = P;
      for (Vec* v : g.all()) std::fill(v->begin(), v->end(), 0.0);
      dx->assign(x.size(), 0.0);
    }
    double loss = 0;
    Vec z(E), w(K), jac(K * E), xt(D), xin(D), o(D), dout(D), dxin(D);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t d = 0; d < D; ++d) xt[d] = x[t * D + d];
      for (std::int64_t e = 0; e < E; ++e) {
        double acc = P.router_bias.empty() ? 0.0 : P.router_bias[e];
        for (std::int64_t d = 0; d < D; ++d) acc += P.router[e * D + d] * xt[d];
        z[e] = acc;
      }
      gate_weights(c.router, z.data(), ids.data() + t * K, selection_bias, renorm_taken[t], w.data(), jac.data());
      const double* dyt = dy.data() + t * D;
      Vec dw(K, 0.0);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int32_t e = ids[t * K + k];
        const bool woi = c.router.weight_on_input;
        for (std::int64_t d = 0; d < D; ++d) xin[d] = woi ? w[k] * xt[d] : xt[d];
        ffn(P, nullptr, false, e, xin, o, nullptr, nullptr);
        for (std::int64_t d = 0; d < D; ++d) loss += (woi ? 1.0 : w[k]) * o[d] * dyt[d];
        if (!G) continue;
        for (std::int64_t d = 0; d < D; ++d) dout[d] = (woi ? 1.0 : w[k]) * dyt[d];
        ffn(P, G, false, e, xin, o, &dout, &dxin);
        for (std::int64_t d = 0; d < D; ++d) {
          if (woi) {
            dw[k] += dxin[d] * xt[d];
            (*dx)[t * D + d] += w[k] * dxin[d];
          } else {
            dw[k] += o[d] * dyt[d];
            (*dx)[t * D + d] += dxin[d];
          }
        }
      }
      if (c.shared_width > 0) {
        double q = 0, sgv = 1;
        if (c.shared_gated) {
          for (std::int64_t d = 0; d < D; ++d) q += P.shared_gate[d] * xt[d];
          sgv = sig(q);
        }
        ffn(P, nullptr, true, 0, xt, o, nullptr, nullptr);
        double dots = 0;
        for (std::int64_t d = 0; d < D; ++d) {
          loss += sgv * o[d] * dyt[d];
          dots += o[d] * dyt[d];
        }
        if (G) {
          for (std::int64_t d = 0; d < D; ++d) dout[d] = sgv * dyt[d];
          ffn(P, G, true, 0, xt, o, &dout, &dxin);
          for (std::int64_t d = 0; d < D; ++d) (*dx)[t * D + d] += dxin[d];
          if (c.shared_gated) {
            const double dq = dots * sgv * (1 - sgv);
            for (std::int64_t d = 0; d < D; ++d) {
              G->shared_gate[d] += dq * xt[d];
              (*dx)[t * D + d] += dq * P.shared_gate[d];
            }
          }
        }
      }
      if (!G) continue;
      for (std::int64_t e = 0; e < E; ++e) {
        double dz = 0;
        for (std::int64_t k = 0; k < K; ++k) dz += dw[k] * jac[k * E + e];
        if (!G->router_bias.empty()) G->router_bias[e] += dz;
        for (std::int64_t d = 0; d < D; ++d) {
          G->router[e * D + d] += dz * xt[d];
          (*dx)[t * D + d] += dz * P.router[e * D + d];
        }
      }
    }
    return loss;
  }
};

}  // namespace moekit::testing
