// LmTrainer (moekit/lm_train.hpp): the training loop of the language model, one step at a time.
#include "moekit/lm_train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "util/error.hpp"
#include "util/splitmix.hpp"

namespace moekit {

namespace {

constexpr std::pair<BalanceMode, const char*> kModes[] = {
    {BalanceMode::none, "none"},
    {BalanceMode::loss_free_sign, "loss_free_sign"},
    {BalanceMode::loss_free_proportional, "loss_free_proportional"},
    {BalanceMode::aux, "aux"},
    {BalanceMode::seq_aux, "seq_aux"},
};

bool loss_free(BalanceMode m) { return m == BalanceMode::loss_free_sign || m == BalanceMode::loss_free_proportional; }

std::int64_t seq_len_of(const LmTrainOptions& o) { return std::min(o.seq_len, o.batch_tokens); }

const LmTrainOptions& checked(const LmTrainOptions& o) {
  o.validate();
  return o;
}

Optimizer make_optimizer(const LmTrainOptions& o) {
  return o.optimizer == Optimizer::Kind::adamw ? Optimizer::adamw(o.adamw) : Optimizer::sgd(o.sgd);
}

// The first `count` sequences of `text` laid end to end (evaluation and the collapse probe).
std::vector<std::int64_t> consecutive_starts(std::size_t text_size, std::int64_t S, std::int64_t max_tokens) {
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s + S < static_cast<std::int64_t>(text_size) && (static_cast<std::int64_t>(starts.size()) + 1) * S <= max_tokens;
       s += S)
    starts.push_back(s);
  return starts;
}

LayerLoad layer_load(const std::vector<std::int64_t>& counts, const LoadMetrics& load) {
  LayerLoad out;
  out.load = load;
  const double mean = static_cast<double>(load.tokens) / static_cast<double>(counts.size());
  for (const std::int64_t c : counts) out.relative.push_back(mean > 0 ? static_cast<double>(c) / mean : 0.0);
  return out;
}

}  // namespace

const char* balance_mode_name(BalanceMode mode) noexcept {
  for (const auto& [m, name] : kModes)
    if (m == mode) return name;
  return "?";
}

BalanceMode parse_balance_mode(const std::string& name) {
  std::string all;
  for (const auto& [m, n] : kModes) {
    if (name == n) return m;
    all += (all.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument("[moekit] unknown balance mode '" + name + "' (known: " + all + ")");
}

void LmTrainOptions::validate() const {
  const auto positive = [](const char* what, std::int64_t v) {
    if (v < 1) throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainOptions] " << what << " (" << v << ") must be >= 1"));
  };
  positive("steps", steps);
  positive("batch_tokens", batch_tokens);
  positive("seq_len", seq_len);
  positive("micro_batches", micro_batches);
  positive("eval_tokens", eval_tokens);
  if (eval_every < 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainOptions] eval_every (" << eval_every << ") must be >= 0"));
  const std::int64_t S = seq_len_of(*this);
  if (batch_tokens % S != 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainOptions] batch_tokens (" << batch_tokens
                                                                                     << ") must be a multiple of the "
                                                                                        "sequence length ("
                                                                                     << S << ")"));
  if ((batch_tokens / S) % micro_batches != 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainOptions] the " << batch_tokens / S << " sequences of "
                                                                           << S << " tokens in a batch of "
                                                                           << batch_tokens
                                                                           << " cannot be split into micro_batches = "
                                                                           << micro_batches << " equal parts"));
  lr.validate();
  bias_rate.validate();
  // (No structured bindings here: clang 14 cannot capture them in MOEKIT_MSG's lambda.)
  for (const auto& item : {std::pair{"clip", clip}, std::pair{"aux_coef", aux_coef}, std::pair{"z_coef", z_coef}})
    if (!std::isfinite(item.second) || item.second < 0)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainOptions] " << item.first << " (" << item.second
                                                                         << ") must be finite and >= 0"));
  make_optimizer(*this);  // validates the optimizer's options
}

LmTrainer::LmTrainer(LmConfig config, LmTrainOptions options, std::vector<std::uint8_t> train_text,
                     std::vector<std::uint8_t> eval_text)
    : config_(std::move(config)),
      options_(checked(options)),
      train_(std::move(train_text)),
      eval_(std::move(eval_text)),
      params_(init_lm_parameters(config_, options_.seed)),
      model_(config_, params_),
      optimizer_(make_optimizer(options_)) {
  const std::int64_t S = seq_len_of(options_), T = options_.batch_tokens;
  if (static_cast<std::int64_t>(train_.size()) < T + 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer] the training text has " << train_.size()
                                                                                        << " tokens, less than one batch ("
                                                                                        << T << " + 1)"));
  if (static_cast<std::int64_t>(eval_.size()) < S + 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer] the held-out text has " << eval_.size()
                                                                                        << " tokens, less than one "
                                                                                           "sequence ("
                                                                                        << S << " + 1)"));
  for (const std::uint8_t b : train_)
    if (b >= config_.vocab)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer] token " << int{b} << " is outside the vocabulary of "
                                                                          << config_.vocab));
  if (loss_free(options_.balance)) {
    if (!config_.block.router.has_selection_bias)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer] " << balance_mode_name(options_.balance)
                                                                    << " needs a router with a selection bias ("
                                                                    << config_.block.model_type
                                                                    << " has none: build the config with one)"));
    const BalanceRule rule =
        options_.balance == BalanceMode::loss_free_sign ? BalanceRule::sign : BalanceRule::proportional;
    for (std::int64_t l = 0; l < config_.layers(); ++l)
      balancers_.emplace_back(config_.block.router.num_experts, rule, options_.bias_rate);
  }
  biases_ = model_.selection_biases();  // the model's own tensors (shared storage)
  grads_ = LmParams::zeros_like(params_);
  rng_ = options_.seed ^ 0xD1B54A32D192ED03ull;

  if (options_.init_collapsed) {
    // Every token's block input gets one shared direction (an offset on all embeddings), and
    // each router's first K rows are turned towards it: the K experts win for every token by
    // about kBoost logits. Layer by layer, each measured after the layers below are collapsed.
    constexpr double kBoost = 3.0;
    std::uint64_t st = options_.seed ^ 0x8CB92BA72F3D8DD7ull;
    const std::int64_t D = config_.dim(), V = config_.vocab, K = config_.block.router.top_k;
    Tensor offset({D}, DType::f32);
    detail::fill_normal(offset, 1.0, st);
    float* emb = params_.embed.data_as<float>();
    for (std::int64_t v = 0; v < V; ++v)
      for (std::int64_t d = 0; d < D; ++d) emb[v * D + d] += offset.data_as<float>()[d];
    const LmBatch probe = make_lm_batch(train_, consecutive_starts(train_.size(), S, T), S, config_.context);
    for (std::int64_t l = 0; l < config_.layers(); ++l) {
      const auto li = static_cast<std::size_t>(l);
      LmSaved s;
      model_.forward_train(probe, s, false);
      std::vector<double> m(static_cast<std::size_t>(D), 0.0);
      const float* h = s.h[li].data_as<const float>();
      const float* r = s.inv_rms[li].data_as<const float>();
      const float* g = params_.norms[li].data_as<const float>();
      for (std::int64_t t = 0; t < probe.tokens; ++t)
        for (std::int64_t d = 0; d < D; ++d) m[static_cast<std::size_t>(d)] += h[t * D + d] * r[t] * g[d];
      double norm2 = 0;
      for (double& v : m) {
        v /= static_cast<double>(probe.tokens);
        norm2 += v * v;
      }
      float* w = params_.blocks[li].router.data_as<float>();
      for (std::int64_t e = 0; e < K; ++e)
        for (std::int64_t d = 0; d < D; ++d)
          w[e * D + d] += static_cast<float>(kBoost * m[static_cast<std::size_t>(d)] / std::max(norm2, 1e-12));
    }
  }
}

StepResult LmTrainer::step() {
  if (done())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer] all " << options_.steps << " steps are done"));
  const auto t_start = std::chrono::steady_clock::now();
  const std::int64_t T = options_.batch_tokens, S = seq_len_of(options_), B = T / S;
  const std::int64_t M = options_.micro_batches, L = config_.layers(), E = config_.block.router.num_experts;
  const std::int64_t step_no = step_ + 1;
  const auto fail = [&](const std::string& what) {
    return std::runtime_error(MOEKIT_MSG("[moekit train] step " << step_no << ": " << what
                                                                << "; nothing of this step was applied"));
  };
  std::uint64_t rng = rng_;
  std::vector<std::int64_t> starts(static_cast<std::size_t>(B));
  const auto span = static_cast<std::uint64_t>(train_.size()) - static_cast<std::uint64_t>(S);
  for (auto& s : starts) s = static_cast<std::int64_t>(detail::uniform_below(rng, span));

  StepResult out;
  out.step = step_no;
  out.lr = options_.lr.at(step_);
  std::vector<std::vector<std::int64_t>> counts(static_cast<std::size_t>(L),
                                                std::vector<std::int64_t>(static_cast<std::size_t>(E), 0));
  const bool aux = options_.balance == BalanceMode::aux || options_.balance == BalanceMode::seq_aux || options_.z_coef > 0;
  for (std::int64_t m = 0; m < M; ++m) {
    const std::vector<std::int64_t> part(starts.begin() + m * (B / M), starts.begin() + (m + 1) * (B / M));
    const LmBatch batch = make_lm_batch(train_, part, S, config_.context);
    double loss = 0;
    try {
      loss = model_.forward_train(batch, saved_, options_.keep_pre_activations);
    } catch (const std::invalid_argument& e) {
      throw fail(e.what());
    }
    if (!std::isfinite(loss)) throw fail(MOEKIT_MSG("the training loss is " << loss));
    out.moe_seconds += saved_.moe_seconds;
    out.train_loss += loss * static_cast<double>(batch.tokens) / static_cast<double>(T);
    std::vector<Tensor> dlogits;
    for (std::int64_t l = 0; l < L; ++l) {
      const SavedForward& sf = saved_.blocks[static_cast<std::size_t>(l)];
      const auto c = expert_counts(sf.routing.ids, E);
      for (std::int64_t e = 0; e < E; ++e) counts[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)] += c[static_cast<std::size_t>(e)];
      if (aux) {
        AuxLossOptions o;
        const double share = 1.0 / static_cast<double>(M);
        if (options_.balance == BalanceMode::aux) o.switch_coef = options_.aux_coef * share;
        if (options_.balance == BalanceMode::seq_aux) {
          o.seq_coef = options_.aux_coef * share;
          o.sequence_starts = batch.sequence_starts;
        }
        o.z_coef = options_.z_coef * share;
        AuxLosses a = aux_losses(config_.block.router, sf.logits, sf.routing.ids, o);
        out.aux_loss += a.switch_loss + a.seq_loss;
        out.z_loss += a.z_loss;
        dlogits.push_back(std::move(a.dlogits));
      }
    }
    out.moe_seconds += model_.backward(saved_, 1.0 / static_cast<double>(T), grads_, m > 0, dlogits);
  }
  const NamedTensors gn = grads_.named();
  out.grad_norm = grad_norm(gn);
  if (!std::isfinite(out.grad_norm)) throw fail(MOEKIT_MSG("the gradient norm is " << out.grad_norm));
  // Clipping folded into the update (the same bits as clip_grad_norm, one pass fewer).
  optimizer_.step(params_.named(), gn, out.lr, options_.clip > 0 ? clip_factor(out.grad_norm, options_.clip) : 1.0f);
  for (std::int64_t l = 0; l < L; ++l) {
    const auto& c = counts[static_cast<std::size_t>(l)];
    if (!balancers_.empty()) {
      LoadBalancer& b = balancers_[static_cast<std::size_t>(l)];
      b.add_counts(c);
      const BalanceUpdate u = b.update(biases_[static_cast<std::size_t>(l)], step_);
      out.bias_rate = u.rate;
      out.layers.push_back(layer_load(c, u.load));
    } else {
      out.layers.push_back(layer_load(c, load_metrics(c)));
    }
    const Tensor& bias = biases_[static_cast<std::size_t>(l)];
    out.layers.back().bias.assign(bias.data_as<const float>(), bias.data_as<const float>() + bias.numel());
  }
  step_ = step_no;
  rng_ = rng;
  out.tokens = step_ * T;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if ((options_.eval_every > 0 && step_ % options_.eval_every == 0) || done()) {
    out.evaluated = true;
    out.eval = evaluate();
  }
  return out;
}

EvalResult LmTrainer::evaluate() const {
  const std::int64_t S = seq_len_of(options_), B = options_.batch_tokens / S;
  const std::vector<std::int64_t> starts = consecutive_starts(eval_.size(), S, options_.eval_tokens);
  std::vector<std::vector<std::int64_t>> counts;
  EvalResult r;
  double sum = 0;
  for (std::size_t i = 0; i < starts.size(); i += static_cast<std::size_t>(B)) {
    const std::vector<std::int64_t> chunk(starts.begin() + static_cast<std::ptrdiff_t>(i),
                                          starts.begin() + static_cast<std::ptrdiff_t>(std::min(starts.size(), i + static_cast<std::size_t>(B))));
    const LmBatch batch = make_lm_batch(eval_, chunk, S, config_.context);
    sum += model_.loss_sum(batch, &counts);
    r.tokens += batch.tokens;
  }
  r.loss = sum / static_cast<double>(r.tokens);
  r.ppl = std::exp(r.loss);
  r.bpb = r.loss / std::log(2.0);
  for (const auto& c : counts) r.layers.push_back(layer_load(c, load_metrics(c)));
  return r;
}

void LmTrainer::restore(const LmParams& params, const std::vector<Tensor>& biases, const Optimizer& optimizer,
                        std::int64_t step, std::uint64_t rng_state) {
  const NamedTensors mine = params_.named(), given = params.named();
  if (mine.size() != given.size())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] " << given.size() << " tensors, the model has "
                                                                           << mine.size()));
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i].first != given[i].first || mine[i].second.shape() != given[i].second.shape() ||
        given[i].second.dtype() != DType::f32)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] " << given[i].first << " "
                                                                             << shape_str(given[i].second.shape())
                                                                             << " does not match the model's "
                                                                             << mine[i].first << " "
                                                                             << shape_str(mine[i].second.shape())));
  if (biases.size() != biases_.size())
    throw std::invalid_argument("[moekit::LmTrainer::restore] wrong number of selection biases");
  for (std::size_t l = 0; l < biases.size(); ++l)
    if (biases[l].shape() != biases_[l].shape() || (biases[l].numel() > 0 && biases[l].dtype() != DType::f32))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] layer " << l << "'s selection bias is "
                                                                                   << shape_str(biases[l].shape())
                                                                                   << ", the model's "
                                                                                   << shape_str(biases_[l].shape())));
  if (optimizer.kind() != optimizer_.kind())
    throw std::invalid_argument("[moekit::LmTrainer::restore] the checkpoint's optimizer is not the run's");
  if (step < 0 || step > options_.steps)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] the checkpoint is at step "
                                           << step << ", outside this run's 0.." << options_.steps));
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i].second.nbytes() > 0) std::memcpy(mine[i].second.data(), given[i].second.data(), mine[i].second.nbytes());
  for (std::size_t l = 0; l < biases.size(); ++l)
    if (biases_[l].nbytes() > 0) std::memcpy(biases_[l].data(), biases[l].data(), biases_[l].nbytes());
  optimizer_ = optimizer;
  step_ = step;
  rng_ = rng_state;
}

}  // namespace moekit
