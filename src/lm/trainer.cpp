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

// Rows `ids` of t's first dimension (a copy): one rank's experts of a stacked [E, ...] tensor.
Tensor take_experts(const Tensor& t, const std::vector<std::int64_t>& ids) {
  Shape shape = t.shape();
  shape[0] = static_cast<std::int64_t>(ids.size());
  Tensor out(shape, DType::f32);
  const std::size_t row =
      static_cast<std::size_t>(t.numel() / std::max<std::int64_t>(t.dim(0), 1)) * sizeof(float);
  for (std::size_t i = 0; i < ids.size(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + i * row,
                static_cast<const char*>(t.data()) + static_cast<std::size_t>(ids[i]) * row, row);
  return out;
}

// The routed experts' matrices of a block (the tensors expert parallelism splits by owner): the
// entries of kMoeTensorMembers (their members and their names in LmParams::named()) that hold one
// matrix per expert.
constexpr MoeTensorMember kRoutedMatrices[] = {kMoeTensorMembers[2], kMoeTensorMembers[3], kMoeTensorMembers[4]};
static_assert(kRoutedMatrices[0].member == &MoeTensors::gate && kRoutedMatrices[1].member == &MoeTensors::up &&
                  kRoutedMatrices[2].member == &MoeTensors::down,
              "kRoutedMatrices: the gate, up and down entries of kMoeTensorMembers");

constexpr bool is_routed(Tensor MoeTensors::*m) {
  for (const MoeTensorMember& r : kRoutedMatrices)
    if (r.member == m) return true;
  return false;
}

// Whether a named tensor (a parameter's or its optimizer state's: "layers.3.experts.up",
// "m.layers.3.experts.up") is a routed matrix.
bool is_routed_matrix(const std::string& name) {
  for (const MoeTensorMember& r : kRoutedMatrices) {
    const std::size_t n = std::strlen(r.name);
    if (name.size() >= n && name.compare(name.size() - n, n, r.name) == 0 &&
        (name.size() == n || name[name.size() - n - 1] == '.'))
      return true;
  }
  return false;
}

// `p` with every block's routed matrices cut to the experts `ids` (nullptr: unchanged).
LmParams local_part(LmParams p, const std::vector<std::int64_t>* ids) {
  if (ids)
    for (MoeTensors& b : p.blocks)
      for (const MoeTensorMember& r : kRoutedMatrices)
        if ((b.*r.member).numel() > 0) b.*r.member = take_experts(b.*r.member, *ids);
  return p;
}

double sum_squares_of(const Tensor& t) {
  return t.numel() > 0 ? grad_sum_squares({{std::string(), t}}) : 0.0;
}

// grad_norm's sum over every gradient in LmParams::named()'s order with each routed matrix's
// Σ x² summed over its owners first: the same bits on every rank (a rank may hold no experts),
// and grad_norm's at one rank. Collective.
double parallel_sum_squares(const LmParams& g, LmParallel& par) {
  std::vector<double> part;
  for (const MoeTensors& b : g.blocks)
    for (const MoeTensorMember& r : kRoutedMatrices)
      if ((b.*r.member).rank() == 3) part.push_back(sum_squares_of(b.*r.member));
  par.sum(part.data(), static_cast<std::int64_t>(part.size()));
  double sum = 0;
  std::size_t i = 0;
  sum += sum_squares_of(g.embed);
  sum += sum_squares_of(g.context_proj);
  for (std::size_t l = 0; l < g.blocks.size(); ++l) {
    if (l < g.norms.size()) sum += sum_squares_of(g.norms[l]);
    for (const MoeTensorMember& m : kMoeTensorMembers) {
      const Tensor& t = g.blocks[l].*m.member;
      const bool routed = is_routed(m.member);
      if (routed && t.rank() == 3)
        sum += part[i++];
      else if (!routed)
        sum += sum_squares_of(t);
    }
  }
  sum += sum_squares_of(g.final_norm);
  sum += sum_squares_of(g.head);
  return sum;
}

// The sequences of a micro-batch this rank trains on: a contiguous share, the first `B % P`
// ranks one more.
std::pair<std::int64_t, std::int64_t> share(std::int64_t count, int rank, int ranks) {
  const std::int64_t q = count / ranks, r = count % ranks;
  const std::int64_t begin = rank * q + std::min<std::int64_t>(rank, r);
  return {begin, begin + q + (rank < r ? 1 : 0)};
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
                     std::vector<std::uint8_t> eval_text, std::shared_ptr<LmParallel> parallel)
    : config_(std::move(config)),
      options_(checked(options)),
      parallel_(std::move(parallel)),
      local_(parallel_ ? parallel_->local_experts() : std::vector<std::int64_t>{}),
      train_(std::move(train_text)),
      eval_(std::move(eval_text)),
      params_(
          local_part(init_lm_parameters(config_, options_.seed), parallel_ ? &local_ : nullptr)),
      model_(parallel_ ? LanguageModel(config_, params_, {}, local_)
                       : LanguageModel(config_, params_)),
      optimizer_(make_optimizer(options_)) {
  const std::int64_t S = seq_len_of(options_), T = options_.batch_tokens;
  if (parallel_) {
    if ((T / S) / options_.micro_batches < parallel_->size())
      throw std::invalid_argument(
          MOEKIT_MSG("[moekit::LmTrainer] a micro-batch of "
                     << (T / S) / options_.micro_batches << " sequences cannot be shared by "
                     << parallel_->size()
                     << " ranks (each needs at least one: raise batch_tokens or lower "
                        "micro_batches or seq_len)"));
    model_.set_block_runner(parallel_->make_runner(model_));
  }
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
  const int rank = parallel_ ? parallel_->rank() : 0, ranks = parallel_ ? parallel_->size() : 1;
  const auto fail = [&](const std::string& what) {
    return std::runtime_error(MOEKIT_MSG("[moekit train] step " << step_no << ": " << what
                                                                << "; nothing of this step was applied"));
  };
  // Runs `fn`; an error of the model (bad input, a non-finite loss) becomes the step's failure
  // — on every rank at once when parallel (errors inside the expert-parallel blocks are agreed
  // on there and arrive here on every rank).
  const auto guarded = [&](const auto& fn) {
    std::exception_ptr err;
    try {
      fn();
    } catch (const std::invalid_argument&) {
      err = std::current_exception();
    } catch (const std::runtime_error&) {
      if (!parallel_) throw;
      err = std::current_exception();
    }
    try {
      if (parallel_) parallel_->agree(err);
      if (err) std::rethrow_exception(err);
    } catch (const std::exception& e) {
      throw fail(e.what());
    }
  };
  std::uint64_t rng = rng_;
  std::vector<std::int64_t> starts(static_cast<std::size_t>(B));
  const auto span = static_cast<std::uint64_t>(train_.size()) - static_cast<std::uint64_t>(S);
  for (auto& s : starts) s = static_cast<std::int64_t>(detail::uniform_below(rng, span));

  StepResult out;
  out.step = step_no;
  out.lr = options_.lr.at(step_);
  // counts: this rank's tokens, per layer; summed over the ranks (exactly) before the balancer.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(L * E), 0);
  const auto layer_counts = [&](std::int64_t l) {
    return std::vector<std::int64_t>(counts.begin() + l * E, counts.begin() + (l + 1) * E);
  };
  const bool aux = options_.balance == BalanceMode::aux || options_.balance == BalanceMode::seq_aux || options_.z_coef > 0;
  double losses[3] = {0, 0, 0};  // this rank's train-loss, aux-loss and z-loss shares
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int64_t Bm = B / M;
    const auto [first, last] = share(Bm, rank, ranks);
    const std::vector<std::int64_t> part(starts.begin() + m * Bm + first,
                                         starts.begin() + m * Bm + last);
    const LmBatch batch = make_lm_batch(train_, part, S, config_.context);
    double loss_sum = 0;
    guarded([&] {
      model_.forward_train(batch, saved_, options_.keep_pre_activations);
      loss_sum = saved_.loss_sum;
    });
    // The micro-batch's loss (mean CE over its Bm·S tokens), as one process computes it.
    if (parallel_) parallel_->sum(&loss_sum, 1);
    const double loss = loss_sum / static_cast<double>(Bm * S);
    if (!std::isfinite(loss)) throw fail(MOEKIT_MSG("the training loss is " << loss));
    out.moe_seconds += saved_.moe_seconds;
    losses[0] += loss * static_cast<double>(Bm * S) / static_cast<double>(T);
    std::vector<std::int64_t> micro(static_cast<std::size_t>(L * E), 0);
    for (std::int64_t l = 0; l < L; ++l) {
      const auto c = expert_counts(saved_.blocks[static_cast<std::size_t>(l)].routing.ids, E);
      std::copy(c.begin(), c.end(), micro.begin() + l * E);
    }
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += micro[i];
    // The switch loss weighs every token by the whole micro-batch's counts.
    if (parallel_ && options_.balance == BalanceMode::aux) parallel_->sum(micro.data(), L * E);
    std::vector<Tensor> dlogits;
    if (aux)
      for (std::int64_t l = 0; l < L; ++l) {
        const SavedForward& sf = saved_.blocks[static_cast<std::size_t>(l)];
        AuxLossOptions o;
        const double share_m = 1.0 / static_cast<double>(M);
        if (options_.balance == BalanceMode::aux) o.switch_coef = options_.aux_coef * share_m;
        if (options_.balance == BalanceMode::seq_aux) {
          o.seq_coef = options_.aux_coef * share_m;
          o.sequence_starts = batch.sequence_starts;
        }
        o.z_coef = options_.z_coef * share_m;
        if (parallel_) {
          o.total_tokens = Bm * S;
          o.total_sequences = Bm;
          if (options_.balance == BalanceMode::aux)
            o.total_counts.assign(micro.begin() + l * E, micro.begin() + (l + 1) * E);
        }
        AuxLosses a = aux_losses(config_.block.router, sf.logits, sf.routing.ids, o);
        losses[1] += a.switch_loss + a.seq_loss;
        losses[2] += a.z_loss;
        dlogits.push_back(std::move(a.dlogits));
      }
    guarded([&] {
      out.moe_seconds +=
          model_.backward(saved_, 1.0 / static_cast<double>(T), grads_, m > 0, dlogits);
    });
  }
  if (parallel_) {
    // What every rank holds whole has a partial gradient per rank (the router and shared experts
    // were summed in the blocks' backward): the sum in rank order makes it the same bits on
    // every rank. The routed experts' gradients stay with their owners.
    const auto sum_tensor = [&](Tensor& t) {
      if (t.numel() > 0) parallel_->sum(t.data_as<float>(), t.numel());
    };
    sum_tensor(grads_.embed);
    sum_tensor(grads_.context_proj);
    for (Tensor& n : grads_.norms) sum_tensor(n);
    sum_tensor(grads_.final_norm);
    sum_tensor(grads_.head);
    for (MoeTensors& b : grads_.blocks)
      for (Tensor* t : {&b.gate_bias, &b.up_bias, &b.down_bias}) sum_tensor(*t);
    parallel_->sum(losses + 1, 2);
    parallel_->sum(counts.data(), L * E);
  }
  out.train_loss = losses[0];
  out.aux_loss = losses[1];
  out.z_loss = losses[2];
  const NamedTensors gn = grads_.named();
  out.grad_norm = parallel_ ? std::sqrt(parallel_sum_squares(grads_, *parallel_)) : grad_norm(gn);
  if (!std::isfinite(out.grad_norm)) throw fail(MOEKIT_MSG("the gradient norm is " << out.grad_norm));
  // Clipping folded into the update (the same bits as clip_grad_norm, one pass fewer).
  optimizer_.step(params_.named(), gn, out.lr, options_.clip > 0 ? clip_factor(out.grad_norm, options_.clip) : 1.0f);
  for (std::int64_t l = 0; l < L; ++l) {
    const std::vector<std::int64_t> c = layer_counts(l);
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
    std::vector<std::int64_t> chunk(
        starts.begin() + static_cast<std::ptrdiff_t>(i),
        starts.begin() +
            static_cast<std::ptrdiff_t>(std::min(starts.size(), i + static_cast<std::size_t>(B))));
    if (parallel_) {  // this rank's share of the chunk (possibly none: the blocks still run, on no
                      // rows)
      const auto [first, last] =
          share(static_cast<std::int64_t>(chunk.size()), parallel_->rank(), parallel_->size());
      chunk = std::vector<std::int64_t>(chunk.begin() + first, chunk.begin() + last);
    }
    const LmBatch batch = make_lm_batch(eval_, chunk, S, config_.context);
    std::exception_ptr err;
    try {
      sum += model_.loss_sum(batch, &counts);
    } catch (const std::invalid_argument&) {
      if (!parallel_) throw;
      err = std::current_exception();
    }
    if (parallel_) parallel_->agree(err);
    r.tokens += batch.tokens;
  }
  if (parallel_) {
    const std::int64_t L = config_.layers(), E = config_.block.router.num_experts;
    if (counts.empty())
      counts.assign(static_cast<std::size_t>(L),
                    std::vector<std::int64_t>(static_cast<std::size_t>(E), 0));
    std::vector<std::int64_t> all;
    for (const auto& c : counts) all.insert(all.end(), c.begin(), c.end());
    all.push_back(r.tokens);
    parallel_->sum(all.data(), static_cast<std::int64_t>(all.size()));
    for (std::int64_t l = 0; l < L; ++l)
      std::copy(all.begin() + l * E, all.begin() + (l + 1) * E,
                counts[static_cast<std::size_t>(l)].begin());
    r.tokens = all.back();
    parallel_->sum(&sum, 1);
  }
  r.loss = sum / static_cast<double>(r.tokens);
  r.ppl = std::exp(r.loss);
  r.bpb = r.loss / std::log(2.0);
  for (const auto& c : counts) r.layers.push_back(layer_load(c, load_metrics(c)));
  return r;
}

LmParams LmTrainer::whole_params() const {
  if (!parallel_) return params_;
  LmParams out = params_;  // shares the storage of what every rank holds whole
  const std::int64_t E = config_.block.router.num_experts;
  for (MoeTensors& b : out.blocks)
    for (const MoeTensorMember& r : kRoutedMatrices)
      if ((b.*r.member).rank() == 3) b.*r.member = parallel_->gather_experts(b.*r.member, E);
  return parallel_->rank() == 0 ? out : LmParams{};
}

Optimizer LmTrainer::whole_optimizer(const LmParams& whole) const {
  if (!parallel_) return optimizer_;
  const std::int64_t E = config_.block.router.num_experts;
  // Every rank gathers the same list: the routed matrices' state by name from the config's
  // blocks (a rank holding no experts has no state for them: it sends none).
  NamedTensors state = optimizer_.state();
  const bool stepped = optimizer_.steps() > 0;
  NamedTensors whole_state;
  for (auto& [name, t] : state)
    if (!is_routed_matrix(name)) whole_state.emplace_back(name, t);
  if (stepped)
    for (const char* prefix : optimizer_.kind() == Optimizer::Kind::adamw
                                  ? std::vector<const char*>{"m.", "v."}
                                  : std::vector<const char*>{"momentum."})
      for (std::size_t l = 0; l < params_.blocks.size(); ++l)
        for (const MoeTensorMember& r : kRoutedMatrices) {
          const Tensor& p = params_.blocks[l].*r.member;
          if (p.rank() != 3) continue;
          const std::string name = prefix + ("layers." + std::to_string(l) + "." + r.name);
          Tensor local = p;  // shape [0, ...] when this rank holds no experts (no state then)
          for (const auto& [n, t] : state)
            if (n == name) local = t;
          whole_state.emplace_back(name, parallel_->gather_experts(local, E));
        }
  Optimizer out = make_optimizer(options_);
  if (parallel_->rank() == 0 && stepped)
    out.load_state(whole_state, optimizer_.steps(), whole.named());
  return out;
}

void LmTrainer::restore(const LmParams& whole, const std::vector<Tensor>& biases,
                        const Optimizer& whole_optimizer, std::int64_t step,
                        std::uint64_t rng_state) {
  // Expert parallel: this rank's part of the checkpoint's experts and their optimizer state.
  if (parallel_)
    for (std::size_t l = 0; l < whole.blocks.size(); ++l)
      for (const MoeTensorMember& r : kRoutedMatrices) {
        const Tensor& t = whole.blocks[l].*r.member;
        if (t.numel() > 0 && (t.rank() != 3 || t.dim(0) != config_.block.router.num_experts ||
                              t.dtype() != DType::f32))
          throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] layer "
                                                 << l << "'s routed experts are "
                                                 << shape_str(t.shape()) << ", not f32 ["
                                                 << config_.block.router.num_experts << ", ...]"));
      }
  const LmParams params = local_part(whole, parallel_ ? &local_ : nullptr);
  Optimizer optimizer = whole_optimizer;
  if (parallel_) {
    NamedTensors state = whole_optimizer.state();
    for (auto& [name, t] : state)
      if (is_routed_matrix(name) && t.rank() == 3 && t.dim(0) == config_.block.router.num_experts)
        t = take_experts(t, local_);
    // A rank holding no experts holds no state for them (named() lists no empty tensor).
    state.erase(std::remove_if(state.begin(), state.end(),
                               [](const auto& e) { return e.second.numel() == 0; }),
                state.end());
    if (!state.empty()) optimizer.load_state(state, whole_optimizer.steps(), params.named());
  }
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
