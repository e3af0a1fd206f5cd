// The byte-level language model around the MoE blocks (moekit/lm.hpp): embedding, context
// mixing, RMSNorm, residual MoE blocks, output projection and softmax cross-entropy, forward
// and backward. Products go through the kernel layer; per-row work is split over rows and every
// reduction over rows runs in row order, so results are the same bits for any thread count.
#include "moekit/lm.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "kernels/gemm.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"
#include "util/splitmix.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

using kernels::Output;
using kernels::RowSource;
using kernels::WeightMatrix;

WeightMatrix weight(const Tensor& w) { return WeightMatrix{w.data(), DType::f32, w.dim(1), kernels::WeightLayout::rows, {}}; }
RowSource rows(const Tensor& t) { return RowSource{t.data_as<const float>(), t.dim(-1), nullptr, nullptr}; }

void ensure(Tensor& t, const Shape& shape) {
  if (t.shape() != shape || t.dtype() != DType::f32) t = Tensor::uninitialized(shape, DType::f32);
}

// out = x · r · g per row, r = 1 / sqrt(mean(x²) + eps) (the mean summed in double, in order).
void rms_norm(const Tensor& x, const Tensor& g, float eps, Tensor& inv_rms, Tensor& out) {
  const std::int64_t T = x.dim(0), D = x.dim(1);
  ensure(inv_rms, {T});
  ensure(out, {T, D});
  const float* px = x.data_as<const float>();
  const float* pg = g.data_as<const float>();
  float* pr = inv_rms.data_as<float>();
  float* po = out.data_as<float>();
  detail::parallel_for(T, 64, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* row = px + t * D;
      double ss = 0;
      for (std::int64_t d = 0; d < D; ++d) ss += static_cast<double>(row[d]) * row[d];
      const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
      pr[t] = r;
      for (std::int64_t d = 0; d < D; ++d) po[t * D + d] = row[d] * r * pg[d];
    }
  });
}

// The backward of rms_norm: dx (+)= r·g·dy − r³·x·(Σ_d dy·g·x)/D per row; dg (+)= Σ_t dy·x·r.
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& inv_rms, const Tensor& g, Tensor& dx,
                       bool add_dx, Tensor& dg, bool add_dg) {
  const std::int64_t T = x.dim(0), D = x.dim(1);
  const float* pdy = dy.data_as<const float>();
  const float* px = x.data_as<const float>();
  const float* pr = inv_rms.data_as<const float>();
  const float* pg = g.data_as<const float>();
  float* pdx = dx.data_as<float>();
  detail::parallel_for(T, 64, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* a = pdy + t * D;
      const float* b = px + t * D;
      double s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += static_cast<double>(a[d]) * pg[d] * b[d];
      const float r = pr[t];
      const float c = static_cast<float>(s * r * r * r / static_cast<double>(D));
      float* o = pdx + t * D;
      for (std::int64_t d = 0; d < D; ++d) {
        const float v = r * pg[d] * a[d] - c * b[d];
        o[d] = add_dx ? o[d] + v : v;
      }
    }
  });
  float* pdg = dg.data_as<float>();
  detail::parallel_for(D, 16, [&](std::int64_t d0, std::int64_t d1) {
    for (std::int64_t d = d0; d < d1; ++d) {
      float acc = add_dg ? pdg[d] : 0.0f;
      for (std::int64_t t = 0; t < T; ++t) acc += pdy[t * D + d] * px[t * D + d] * pr[t];
      pdg[d] = acc;
    }
  });
}

void check_shape(const Tensor& t, const Shape& want, const std::string& name) {
  detail::expect_tensor("LanguageModel", name, t, {DType::f32}, want);
}

// Throws std::invalid_argument unless `batch` has T·N window entries and T targets, all in
// [0, V) (window entries −1 before the text's start), with T >= 1 for a training forward (zero
// tokens only for the inference forward: a rank of a parallel evaluation with no rows).
void check_batch(const LmBatch& batch, std::int64_t N, std::int64_t V, bool training) {
  const std::int64_t T = batch.tokens;
  if (T < (training ? 1 : 0) || static_cast<std::int64_t>(batch.window.size()) != T * N ||
      static_cast<std::int64_t>(batch.targets.size()) != T)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] a batch of " << T << " tokens needs " << T * N
                                                                                 << " window entries and " << T
                                                                                 << " targets, got "
                                                                                 << batch.window.size() << " and "
                                                                                 << batch.targets.size()));
  for (std::size_t i = 0; i < batch.window.size(); ++i)
    if (batch.window[i] < -1 || batch.window[i] >= V)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] token " << batch.window[i] << " at window entry "
                                                                              << i << " is outside [0, " << V << ")"));
  for (std::size_t i = 0; i < batch.targets.size(); ++i)
    if (batch.targets[i] < 0 || batch.targets[i] >= V)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] target " << batch.targets[i] << " of row " << i
                                                                               << " is outside [0, " << V << ")"));
}

// Softmax cross-entropy of each row of `probs` ([T, V] logits, replaced by their
// probabilities, which the backward needs) against `targets`: returns Σ_t CE_t, summed in row
// order. Throws std::invalid_argument for a non-finite sum.
double softmax_cross_entropy(Tensor& probs, const std::vector<std::int32_t>& targets) {
  const std::int64_t T = probs.dim(0), V = probs.dim(1);
  std::vector<double> ce(static_cast<std::size_t>(T));
  float* pp = probs.data_as<float>();
  detail::parallel_for(T, 32, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      float* z = pp + t * V;
      float m = z[0];
      for (std::int64_t v = 1; v < V; ++v) m = std::max(m, z[v]);
      double sum = 0;
      for (std::int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - m);
      const double lse = m + std::log(sum);
      ce[static_cast<std::size_t>(t)] = lse - z[targets[static_cast<std::size_t>(t)]];
      for (std::int64_t v = 0; v < V; ++v) z[v] = static_cast<float>(std::exp(static_cast<double>(z[v]) - lse));
    }
  });
  double total = 0;
  for (const double c : ce) total += c;
  if (!std::isfinite(total))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] the loss is " << total
                                                                                  << " (non-finite logits)"));
  return total;
}

}  // namespace

void LmConfig::validate() const {
  const auto positive = [](const char* what, std::int64_t v) {
    if (v < 1) throw std::invalid_argument(MOEKIT_MSG("[moekit::LmConfig] " << what << " (" << v << ") must be >= 1"));
  };
  positive("vocab", vocab);
  positive("context", context);
  positive("layers", block.num_layers);
  positive("hidden_size", block.hidden_size);
  if (vocab > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument("[moekit::LmConfig] vocab must fit int32");
  if (!(norm_eps > 0) || !std::isfinite(norm_eps))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmConfig] norm_eps (" << norm_eps << ") must be finite and > 0"));
  const auto moe = block.moe_layer_indices();
  if (static_cast<std::int64_t>(moe.size()) != block.num_layers)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmConfig] every layer must be an MoE block; the config makes "
                                           << block.num_layers - static_cast<std::int64_t>(moe.size()) << " of "
                                           << block.num_layers << " dense"));
  moekit::validate(block.router);
  check_trainable(block);
}

NamedTensors LmParams::named() const {
  NamedTensors out;
  for_each_member([&](const std::string& name, const Tensor& t, const MoeTensorMember* in_block) {
    if (!in_block || t.numel() > 0) out.emplace_back(name, t);
  });
  return out;
}

LmParams LmParams::zeros_like(const LmParams& like) {
  LmParams p = like;  // the same members; each is replaced, none keeps like's storage
  p.for_each_member([](const std::string&, Tensor& t, const MoeTensorMember* in_block) {
    t = !in_block || t.numel() > 0 ? Tensor(t.shape(), DType::f32) : Tensor();
  });
  return p;
}

LmParams init_lm_parameters(const LmConfig& config, std::uint64_t seed) {
  config.validate();
  const std::int64_t V = config.vocab, D = config.dim(), N = config.context, L = config.layers();
  std::uint64_t state = seed;
  const auto draw = [&](Shape shape, double std_dev) {
    Tensor t(std::move(shape), DType::f32);
    detail::fill_normal(t, std_dev, state);
    return t;
  };
  LmParams p;
  p.embed = draw({V, D}, 1.0);
  p.context_proj = draw({D, N * D}, 1.0 / std::sqrt(static_cast<double>(N * D)));
  p.head = draw({V, D}, 1.0 / std::sqrt(static_cast<double>(D)));
  const auto ones = [&] {
    Tensor t({D}, DType::f32);
    std::fill_n(t.data_as<float>(), D, 1.0f);
    return t;
  };
  p.final_norm = ones();
  for (std::int64_t l = 0; l < L; ++l) {
    p.norms.push_back(ones());
    p.blocks.push_back(init_parameters(config.block, detail::splitmix(state)));
  }
  return p;
}

LmBatch make_lm_batch(const std::vector<std::uint8_t>& text, const std::vector<std::int64_t>& starts,
                      std::int64_t seq_len, std::int64_t context) {
  if (seq_len < 1 || context < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::make_lm_batch] seq_len (" << seq_len << ") and context ("
                                                                              << context << ") must be >= 1"));
  const std::int64_t n = static_cast<std::int64_t>(text.size());
  LmBatch b;
  b.tokens = seq_len * static_cast<std::int64_t>(starts.size());
  b.window.resize(static_cast<std::size_t>(b.tokens * context));
  b.targets.resize(static_cast<std::size_t>(b.tokens));
  std::int64_t row = 0;
  for (const std::int64_t s : starts) {
    if (s < 0 || s + seq_len >= n)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::make_lm_batch] a sequence at " << s << " of " << seq_len
                                                                                      << " positions does not fit a text of "
                                                                                      << n << " tokens"));
    b.sequence_starts.push_back(row);
    for (std::int64_t i = 0; i < seq_len; ++i, ++row) {
      const std::int64_t p = s + i;
      for (std::int64_t j = 0; j < context; ++j)
        b.window[static_cast<std::size_t>(row * context + j)] = p - j >= 0 ? text[static_cast<std::size_t>(p - j)] : -1;
      b.targets[static_cast<std::size_t>(row)] = text[static_cast<std::size_t>(p + 1)];
    }
  }
  return b;
}

LanguageModel::LanguageModel(LmConfig config, LmParams params, std::vector<Tensor> selection_biases)
    : LanguageModel(std::move(config), std::move(params), std::move(selection_biases),
                    std::nullopt) {}

LanguageModel::LanguageModel(LmConfig config, LmParams params, std::vector<Tensor> selection_biases,
                             std::vector<std::int64_t> local_experts)
    : LanguageModel(std::move(config), std::move(params), std::move(selection_biases),
                    std::optional<std::vector<std::int64_t>>(std::move(local_experts))) {}

LanguageModel::LanguageModel(LmConfig config, LmParams params, std::vector<Tensor> selection_biases,
                             std::optional<std::vector<std::int64_t>> local)
    : config_(std::move(config)),
      params_(std::move(params)),
      biases_(std::move(selection_biases)),
      partial_(local.has_value()) {
  config_.validate();
  const std::int64_t V = config_.vocab, D = config_.dim(), N = config_.context, L = config_.layers();
  const std::int64_t E = config_.block.router.num_experts;
  check_shape(params_.embed, {V, D}, "embed");
  check_shape(params_.context_proj, {D, N * D}, "context_proj");
  check_shape(params_.final_norm, {D}, "final_norm");
  check_shape(params_.head, {V, D}, "head");
  if (static_cast<std::int64_t>(params_.norms.size()) != L || static_cast<std::int64_t>(params_.blocks.size()) != L)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] " << params_.norms.size() << " norms and "
                                                                      << params_.blocks.size() << " blocks for " << L
                                                                      << " layers"));
  if (biases_.empty()) biases_.resize(static_cast<std::size_t>(L));
  if (static_cast<std::int64_t>(biases_.size()) != L)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] " << biases_.size() << " selection biases for " << L
                                                                      << " layers"));
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string name = "layers." + std::to_string(l);
    check_shape(params_.norms[static_cast<std::size_t>(l)], {D}, name + ".norm");
    Tensor& bias = biases_[static_cast<std::size_t>(l)];
    if (config_.block.router.has_selection_bias) {
      if (bias.numel() == 0) bias = Tensor({E}, DType::f32);
      check_shape(bias, {E}, name + " selection bias");
    } else if (bias.numel() != 0) {
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] " << name
                                                                        << ": a selection bias for a router without one"));
    }
    const MoeTensors& block = params_.blocks[static_cast<std::size_t>(l)];
    layers_.push_back(local ? make_trainable_layer(config_.block, block, bias, *local)
                            : make_trainable_layer(config_.block, block, bias));
  }
}

double LanguageModel::forward_impl(const LmBatch& batch, LmSaved& s, bool training, bool keep,
                                   std::vector<std::vector<std::int64_t>>* counts) const {
  const std::int64_t T = batch.tokens, D = config_.dim(), N = config_.context, V = config_.vocab;
  const std::int64_t L = config_.layers(), E = config_.block.router.num_experts;
  if (partial_ && !runner_)
    throw std::invalid_argument(
        "[moekit::LanguageModel] this model holds only some routed experts: it runs through "
        "a block runner (set_block_runner)");
  check_batch(batch, N, V, training);
  if (counts && (static_cast<std::int64_t>(counts->size()) != L))
    counts->assign(static_cast<std::size_t>(L), std::vector<std::int64_t>(static_cast<std::size_t>(E), 0));
  s.tokens = T;
  s.moe_seconds = 0;
  s.window = batch.window;
  s.targets = batch.targets;
  // The context projection through per-offset tables: h0_t = Σ_j [E(x_{t-j})] · P_jᵀ =
  // Σ_j Q_j[x_{t-j}] with Q_j = E · P_jᵀ [V, D] (P_j: columns j·D.. of P). V·N·D² multiply-adds
  // instead of T·N·D² (V = 256 bytes, T thousands of tokens); the sum over j runs in j order.
  ensure(s.tables, {N, V, D});
  for (std::int64_t j = 0; j < N; ++j)
    kernels::gemm_nt(rows(params_.embed),
                     WeightMatrix{params_.context_proj.data_as<const float>() + j * D, DType::f32, N * D,
                                  kernels::WeightLayout::rows, {}},
                     Output{s.tables.data_as<float>() + j * V * D, D, nullptr, false}, V, D, D);
  s.h.resize(static_cast<std::size_t>(L + 1));
  s.inv_rms.resize(static_cast<std::size_t>(L + 1));
  if (training) s.blocks.resize(static_cast<std::size_t>(L));
  ensure(s.h[0], {T, D});
  const float* q = s.tables.data_as<const float>();
  float* h0 = s.h[0].data_as<float>();
  detail::parallel_for(T, 64, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      float* dst = h0 + t * D;
      std::fill_n(dst, D, 0.0f);
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int32_t tok = batch.window[static_cast<std::size_t>(t * N + j)];
        if (tok < 0) continue;  // before the text's start: a zero embedding
        const float* src = q + (j * V + tok) * D;
        for (std::int64_t d = 0; d < D; ++d) dst[d] += src[d];
      }
    }
  });
  Tensor normed;
  for (std::int64_t l = 0; l < L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    rms_norm(s.h[li], params_.norms[li], config_.norm_eps, s.inv_rms[li], normed);
    Tensor y;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (training) {
        y = runner_ ? runner_->forward_train(l, normed, s.blocks[li], keep)
                    : layers_[li].forward_train(normed, s.blocks[li], keep);
      } else {
        ForwardInfo info;
        y = runner_ ? runner_->forward(l, normed, counts ? &info : nullptr)
                    : layers_[li].forward(normed, counts ? &info : nullptr);
        if (counts) {
          const auto c = expert_counts(info.routing.ids, E);
          for (std::int64_t e = 0; e < E; ++e) (*counts)[li][static_cast<std::size_t>(e)] += c[static_cast<std::size_t>(e)];
        }
      }
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel] layer " << l << ": " << e.what()));
    }
    s.moe_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ensure(s.h[li + 1], {T, D});
    const float* a = s.h[li].data_as<const float>();
    const float* b = y.data_as<const float>();
    float* o = s.h[li + 1].data_as<float>();
    for (std::int64_t i = 0; i < T * D; ++i) o[i] = a[i] + b[i];
  }
  rms_norm(s.h[static_cast<std::size_t>(L)], params_.final_norm, config_.norm_eps,
           s.inv_rms[static_cast<std::size_t>(L)], s.f);
  ensure(s.probs, {T, V});
  kernels::gemm_nt(rows(s.f), weight(params_.head), Output{s.probs.data_as<float>(), V, nullptr, false}, T, V, D);
  const double total = softmax_cross_entropy(s.probs, batch.targets);
  s.loss_sum = total;
  return total;
}

double LanguageModel::forward_train(const LmBatch& batch, LmSaved& saved, bool keep_pre_activations) const {
  return forward_impl(batch, saved, true, keep_pre_activations, nullptr) / static_cast<double>(batch.tokens);
}

double LanguageModel::loss_sum(const LmBatch& batch, std::vector<std::vector<std::int64_t>>* counts) const {
  LmSaved s;
  return forward_impl(batch, s, false, false, counts);
}

double LanguageModel::backward(const LmSaved& s, double loss_scale, LmParams& g, bool accumulate,
                               const std::vector<Tensor>& router_dlogits) const {
  const std::int64_t T = s.tokens, D = config_.dim(), N = config_.context, V = config_.vocab;
  const std::int64_t L = config_.layers();
  if (T < 1 || static_cast<std::int64_t>(s.blocks.size()) != L)
    throw std::invalid_argument("[moekit::LanguageModel::backward] `saved` is not from a training forward of this model");
  if (!router_dlogits.empty() && static_cast<std::int64_t>(router_dlogits.size()) != L)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LanguageModel::backward] " << router_dlogits.size()
                                                                                << " router gradients for " << L
                                                                                << " layers"));
  if (g.blocks.size() != params_.blocks.size()) g = LmParams::zeros_like(params_);
  double moe_seconds = 0;
  // dL/dlogits = scale · (p − onehot(target)).
  Tensor dz = Tensor::uninitialized({T, V}, DType::f32);
  const float scale = static_cast<float>(loss_scale);
  const float* pp = s.probs.data_as<const float>();
  float* pz = dz.data_as<float>();
  detail::parallel_for(T, 64, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      for (std::int64_t v = 0; v < V; ++v) pz[t * V + v] = scale * pp[t * V + v];
      pz[t * V + s.targets[static_cast<std::size_t>(t)]] -= scale;
    }
  });
  kernels::gemm_tn(rows(dz), rows(s.f), Output{g.head.data_as<float>(), D, nullptr, accumulate}, V, D, T);
  Tensor df = Tensor::uninitialized({T, D}, DType::f32);
  kernels::gemm_nn(rows(dz), weight(params_.head), Output{df.data_as<float>(), D, nullptr, false}, T, D, V);
  Tensor dh = Tensor::uninitialized({T, D}, DType::f32);
  const auto Ls = static_cast<std::size_t>(L);
  rms_norm_backward(df, s.h[Ls], s.inv_rms[Ls], params_.final_norm, dh, false, g.final_norm, accumulate);
  for (std::int64_t l = L - 1; l >= 0; --l) {
    const auto li = static_cast<std::size_t>(l);
    BackwardOptions opts;
    opts.accumulate = accumulate;
    if (!router_dlogits.empty() && router_dlogits[li].numel() > 0) opts.extra_dlogits = router_dlogits[li];
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor dx = runner_ ? runner_->backward(l, s.blocks[li], dh, g.blocks[li], opts)
                              : moekit::backward(layers_[li], s.blocks[li], dh, g.blocks[li], opts);
    moe_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rms_norm_backward(dx, s.h[li], s.inv_rms[li], params_.norms[li], dh, true, g.norms[li], accumulate);
  }
  // dQ_j[v] = Σ_{t : x_{t-j} = v} dh0_t (column chunks in parallel, rows in order), then
  // dE (+)= Σ_j dQ_j · P_j and dP_j (+)= dQ_jᵀ · E.
  Tensor dq = Tensor::uninitialized({N, V, D}, DType::f32);
  float* pdq = dq.data_as<float>();
  std::fill_n(pdq, N * V * D, 0.0f);
  const float* pdh = dh.data_as<const float>();
  detail::parallel_for(D, 16, [&](std::int64_t d0, std::int64_t d1) {
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int32_t tok = s.window[static_cast<std::size_t>(t * N + j)];
        if (tok < 0) continue;
        const float* src = pdh + t * D;
        float* dst = pdq + (j * V + tok) * D;
        for (std::int64_t d = d0; d < d1; ++d) dst[d] += src[d];
      }
  });
  for (std::int64_t j = 0; j < N; ++j) {
    const RowSource dqj{pdq + j * V * D, D, nullptr, nullptr};
    kernels::gemm_nn(dqj,
                     WeightMatrix{params_.context_proj.data_as<const float>() + j * D, DType::f32, N * D,
                                  kernels::WeightLayout::rows, {}},
                     Output{g.embed.data_as<float>(), D, nullptr, accumulate || j > 0}, V, D, D);
    kernels::gemm_tn(dqj, rows(params_.embed), Output{g.context_proj.data_as<float>() + j * D, N * D, nullptr, accumulate},
                     D, D, V);
  }
  return moe_seconds;
}

}  // namespace moekit
