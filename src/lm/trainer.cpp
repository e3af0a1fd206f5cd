// LmTrainer (moekit/lm_train.hpp): the training loop of the language model, one step at a time
// (its parts below, "One step") and evaluation. The whole-model state of a data + expert
// parallel run (gathered for checkpoints, split again on restore): trainer_state.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <utility>

#include "lm/routed.hpp"
#include "moekit/lm_train.hpp"
#include "util/error.hpp"
#include "util/splitmix.hpp"

namespace moekit {

using namespace lm_detail;  // NOLINT(google-build-using-namespace): the trainer's own parts

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

// The first `count` sequences of `text` laid end to end (evaluation and the collapse probe).
std::vector<std::int64_t> consecutive_starts(std::size_t text_size, std::int64_t S, std::int64_t max_tokens) {
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s + S < static_cast<std::int64_t>(text_size) && (static_cast<std::int64_t>(starts.size()) + 1) * S <= max_tokens;
       s += S)
    starts.push_back(s);
  return starts;
}

// The block tensors whose gradients the expert-parallel blocks' backward already sums over the
// ranks (ExpertParallelBlocks: the router and the shared experts). Together with the routed
// matrices, which stay with their owners, these are the only tensors LmTrainer does not sum
// itself: every other tensor is held whole on every rank with a partial gradient on each.
constexpr Tensor MoeTensors::*kSummedInBlocks[] = {
    &MoeTensors::router,           &MoeTensors::router_bias,    &MoeTensors::shared_gate_proj,
    &MoeTensors::shared_up_proj,   &MoeTensors::shared_down_proj, &MoeTensors::shared_gate};

// Whether LmTrainer sums this tensor's gradient over the ranks (`in_block` as
// LmParams::for_each_member passes it).
bool summed_by_trainer(const MoeTensorMember* in_block) {
  if (!in_block) return true;
  if (is_routed(in_block->member)) return false;
  for (Tensor MoeTensors::*m : kSummedInBlocks)
    if (m == in_block->member) return false;
  return true;
}

double sum_squares_of(const Tensor& t) {
  return t.numel() > 0 ? grad_sum_squares({{std::string(), t}}) : 0.0;
}

// grad_norm's sum over every gradient in LmParams::named()'s order with each routed matrix's
// Σ x² summed over its owners first: the same bits on every rank (a rank may hold no experts),
// and grad_norm's at one rank. Collective.
double parallel_sum_squares(const LmParams& g, LmParallel& par) {
  const auto routed = [](const MoeTensorMember* in_block) { return in_block && is_routed(in_block->member); };
  std::vector<double> part;
  g.for_each_member([&](const std::string&, const Tensor& t, const MoeTensorMember* in_block) {
    if (routed(in_block) && t.rank() == 3) part.push_back(sum_squares_of(t));
  });
  par.sum(part.data(), static_cast<std::int64_t>(part.size()));
  double sum = 0;
  std::size_t i = 0;
  g.for_each_member([&](const std::string&, const Tensor& t, const MoeTensorMember* in_block) {
    if (!routed(in_block))
      sum += sum_squares_of(t);
    else if (t.rank() == 3)
      sum += part[i++];
  });
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

// init_collapsed: every token's block input gets one shared direction (an offset on all
// embeddings), and each router's first K rows are turned towards it: the K experts win for every
// token by about kBoost logits. Layer by layer, each measured after the layers below are
// collapsed. `params` is the storage `model` computes with.
void collapse_routers(const LmConfig& config, const LmTrainOptions& o, const std::vector<std::uint8_t>& text,
                      const LanguageModel& model, LmParams& params) {
  constexpr double kBoost = 3.0;
  std::uint64_t st = o.seed ^ 0x8CB92BA72F3D8DD7ull;
  const std::int64_t D = config.dim(), V = config.vocab, K = config.block.router.top_k;
  const std::int64_t S = seq_len_of(o), T = o.batch_tokens;
  Tensor offset({D}, DType::f32);
  detail::fill_normal(offset, 1.0, st);
  float* emb = params.embed.data_as<float>();
  for (std::int64_t v = 0; v < V; ++v)
    for (std::int64_t d = 0; d < D; ++d) emb[v * D + d] += offset.data_as<float>()[d];
  const LmBatch probe = make_lm_batch(text, consecutive_starts(text.size(), S, T), S, config.context);
  for (std::int64_t l = 0; l < config.layers(); ++l) {
    const auto li = static_cast<std::size_t>(l);
    LmSaved s;
    model.forward_train(probe, s, false);
    std::vector<double> m(static_cast<std::size_t>(D), 0.0);
    const float* h = s.h[li].data_as<const float>();
    const float* r = s.inv_rms[li].data_as<const float>();
    const float* g = params.norms[li].data_as<const float>();
    for (std::int64_t t = 0; t < probe.tokens; ++t)
      for (std::int64_t d = 0; d < D; ++d) m[static_cast<std::size_t>(d)] += h[t * D + d] * r[t] * g[d];
    double norm2 = 0;
    for (double& v : m) {
      v /= static_cast<double>(probe.tokens);
      norm2 += v * v;
    }
    float* w = params.blocks[li].router.data_as<float>();
    for (std::int64_t e = 0; e < K; ++e)
      for (std::int64_t d = 0; d < D; ++d)
        w[e * D + d] += static_cast<float>(kBoost * m[static_cast<std::size_t>(d)] / std::max(norm2, 1e-12));
  }
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

  if (options_.init_collapsed) collapse_routers(config_, options_, train_, model_, params_);
}

// ---------------------------------------------------------------------------------------------
// One step: sample() draws its sequences, micro_batch() runs each micro-batch's forward and
// backward (gradients accumulated), reduce() sums what the ranks computed apart, update() clips
// and steps the optimizer, balance() moves the selection biases. The parameters, optimizer,
// biases, step count and RNG change only after the last check that can fail the step (the
// gradient norm's, in update()), so a failed step leaves them as they were.

struct LmTrainer::Step {
  // The parts of the step's loss: the training loss (each micro-batch's summed over the ranks
  // as it is computed), and the aux and z losses (this rank's shares until reduce()).
  struct Losses {
    double train = 0;  ///< mean CE of the step's tokens
    double aux = 0;    ///< switch + sequence-wise aux losses, summed over layers
    double z = 0;      ///< router z-loss, summed over layers
  };

  std::int64_t number = 0;           ///< 1-based: steps done after this one
  std::uint64_t rng = 0;             ///< the RNG after the step's draws (kept if the step succeeds)
  std::vector<std::int64_t> starts;  ///< [B] the first position of each sequence
  std::vector<std::int64_t> counts;  ///< [L, E] tokens per expert; this rank's until reduce()
  Losses losses;
  StepResult out;
};

namespace {

// A step's failure, naming it: nothing of the step was applied.
std::runtime_error step_failure(std::int64_t step, const std::string& what) {
  return std::runtime_error(
      MOEKIT_MSG("[moekit train] step " << step << ": " << what << "; nothing of this step was applied"));
}

// Runs `fn`; an error of the model (bad input, a non-finite loss) becomes the step's failure
// — on every rank at once when parallel (errors inside the expert-parallel blocks are agreed
// on there and arrive here on every rank).
template <class Fn>
void guarded(LmParallel* parallel, std::int64_t step, const Fn& fn) {
  std::exception_ptr err;
  try {
    fn();
  } catch (const std::invalid_argument&) {
    err = std::current_exception();
  } catch (const std::runtime_error&) {
    if (!parallel) throw;
    err = std::current_exception();
  }
  try {
    if (parallel) parallel->agree(err);
    if (err) std::rethrow_exception(err);
  } catch (const std::exception& e) {
    throw step_failure(step, e.what());
  }
}

}  // namespace

StepResult LmTrainer::step() {
  if (done())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer] all " << options_.steps << " steps are done"));
  const auto t_start = std::chrono::steady_clock::now();
  Step s = sample();
  for (std::int64_t m = 0; m < options_.micro_batches; ++m) micro_batch(s, m);
  reduce(s);
  update(s);
  balance(s);
  step_ = s.number;
  rng_ = s.rng;
  StepResult& out = s.out;
  out.tokens = step_ * options_.batch_tokens;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if ((options_.eval_every > 0 && step_ % options_.eval_every == 0) || done()) {
    out.evaluated = true;
    out.eval = evaluate();
  }
  return std::move(out);
}

LmTrainer::Step LmTrainer::sample() const {
  const std::int64_t S = seq_len_of(options_), B = options_.batch_tokens / S;
  const std::int64_t L = config_.layers(), E = config_.block.router.num_experts;
  Step s;
  s.number = step_ + 1;
  s.rng = rng_;
  s.starts.resize(static_cast<std::size_t>(B));
  const auto span = static_cast<std::uint64_t>(train_.size()) - static_cast<std::uint64_t>(S);
  for (auto& start : s.starts) start = static_cast<std::int64_t>(detail::uniform_below(s.rng, span));
  s.counts.assign(static_cast<std::size_t>(L * E), 0);
  s.out.step = s.number;
  s.out.lr = options_.lr.at(step_);
  return s;
}

void LmTrainer::micro_batch(Step& s, std::int64_t m) {
  const std::int64_t T = options_.batch_tokens, S = seq_len_of(options_);
  const std::int64_t Bm = (T / S) / options_.micro_batches;
  const std::int64_t L = config_.layers(), E = config_.block.router.num_experts;
  const int rank = parallel_ ? parallel_->rank() : 0, ranks = parallel_ ? parallel_->size() : 1;
  const auto [first, last] = share(Bm, rank, ranks);
  const std::vector<std::int64_t> part(s.starts.begin() + m * Bm + first, s.starts.begin() + m * Bm + last);
  const LmBatch batch = make_lm_batch(train_, part, S, config_.context);
  double loss_sum = 0;
  guarded(parallel_.get(), s.number, [&] {
    model_.forward_train(batch, saved_, options_.keep_pre_activations);
    loss_sum = saved_.loss_sum;
  });
  // The micro-batch's loss (mean CE over its Bm·S tokens), as one process computes it.
  if (parallel_) parallel_->sum(&loss_sum, 1);
  const double loss = loss_sum / static_cast<double>(Bm * S);
  if (!std::isfinite(loss)) throw step_failure(s.number, MOEKIT_MSG("the training loss is " << loss));
  s.out.moe_seconds += saved_.moe_seconds;
  s.losses.train += loss * static_cast<double>(Bm * S) / static_cast<double>(T);
  std::vector<std::int64_t> micro(static_cast<std::size_t>(L * E), 0);  // [L, E]
  for (std::int64_t l = 0; l < L; ++l) {
    const auto c = expert_counts(saved_.blocks[static_cast<std::size_t>(l)].routing.ids, E);
    std::copy(c.begin(), c.end(), micro.begin() + l * E);
  }
  for (std::size_t i = 0; i < s.counts.size(); ++i) s.counts[i] += micro[i];
  // The switch loss weighs every token by the whole micro-batch's counts.
  if (parallel_ && options_.balance == BalanceMode::aux) parallel_->sum(micro.data(), L * E);
  const std::vector<Tensor> dlogits = aux_dlogits(s, batch, micro);
  guarded(parallel_.get(), s.number, [&] {
    s.out.moe_seconds += model_.backward(saved_, 1.0 / static_cast<double>(T), grads_, m > 0, dlogits);
  });
}

std::vector<Tensor> LmTrainer::aux_dlogits(Step& s, const LmBatch& batch,
                                           const std::vector<std::int64_t>& micro_counts) {
  const bool aux = options_.balance == BalanceMode::aux || options_.balance == BalanceMode::seq_aux;
  if (!aux && !(options_.z_coef > 0)) return {};
  const std::int64_t S = seq_len_of(options_), Bm = (options_.batch_tokens / S) / options_.micro_batches;
  const std::int64_t L = config_.layers(), E = config_.block.router.num_experts;
  // Each micro-batch's losses count 1/M of the step's.
  const double share_m = 1.0 / static_cast<double>(options_.micro_batches);
  std::vector<Tensor> dlogits;
  for (std::int64_t l = 0; l < L; ++l) {
    const SavedForward& sf = saved_.blocks[static_cast<std::size_t>(l)];
    AuxLossOptions o;
    if (options_.balance == BalanceMode::aux) o.switch_coef = options_.aux_coef * share_m;
    if (options_.balance == BalanceMode::seq_aux) {
      o.seq_coef = options_.aux_coef * share_m;
      o.sequence_starts = batch.sequence_starts;
    }
    o.z_coef = options_.z_coef * share_m;
    if (parallel_) {  // the losses of the whole micro-batch, of which this rank holds a share
      o.total_tokens = Bm * S;
      o.total_sequences = Bm;
      if (options_.balance == BalanceMode::aux)
        o.total_counts.assign(micro_counts.begin() + l * E, micro_counts.begin() + (l + 1) * E);
    }
    AuxLosses a = aux_losses(config_.block.router, sf.logits, sf.routing.ids, o);
    s.losses.aux += a.switch_loss + a.seq_loss;
    s.losses.z += a.z_loss;
    dlogits.push_back(std::move(a.dlogits));
  }
  return dlogits;
}

void LmTrainer::reduce(Step& s) {
  if (parallel_) {
    // What every rank holds whole has a partial gradient per rank: the sum in rank order makes
    // it the same bits on every rank. The routed experts' gradients stay with their owners, and
    // the blocks' backward summed the router's and the shared experts' (summed_by_trainer).
    grads_.for_each_member([&](const std::string&, Tensor& g, const MoeTensorMember* in_block) {
      if (g.numel() > 0 && summed_by_trainer(in_block)) parallel_->sum(g.data_as<float>(), g.numel());
    });
    double aux_z[2] = {s.losses.aux, s.losses.z};
    parallel_->sum(aux_z, 2);
    s.losses.aux = aux_z[0];
    s.losses.z = aux_z[1];
    parallel_->sum(s.counts.data(), static_cast<std::int64_t>(s.counts.size()));
  }
  s.out.train_loss = s.losses.train;
  s.out.aux_loss = s.losses.aux;
  s.out.z_loss = s.losses.z;
}

void LmTrainer::update(Step& s) {
  StepResult& out = s.out;
  const NamedTensors gn = grads_.named();
  out.grad_norm = parallel_ ? std::sqrt(parallel_sum_squares(grads_, *parallel_)) : grad_norm(gn);
  if (!std::isfinite(out.grad_norm)) throw step_failure(s.number, MOEKIT_MSG("the gradient norm is " << out.grad_norm));
  // Clipping folded into the update (the same bits as clip_grad_norm, one pass fewer).
  optimizer_.step(params_.named(), gn, out.lr, options_.clip > 0 ? clip_factor(out.grad_norm, options_.clip) : 1.0f);
}

void LmTrainer::balance(Step& s) {
  const std::int64_t L = config_.layers(), E = config_.block.router.num_experts;
  for (std::int64_t l = 0; l < L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const std::vector<std::int64_t> c(s.counts.begin() + l * E, s.counts.begin() + (l + 1) * E);
    if (!balancers_.empty()) {
      LoadBalancer& b = balancers_[li];
      b.add_counts(c);
      const BalanceUpdate u = b.update(biases_[li], step_);
      s.out.bias_rate = u.rate;
      s.out.layers.push_back(layer_load(c, u.load));
    } else {
      s.out.layers.push_back(layer_load(c, load_metrics(c)));
    }
    const Tensor& bias = biases_[li];
    s.out.layers.back().bias.assign(bias.data_as<const float>(), bias.data_as<const float>() + bias.numel());
  }
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

}  // namespace moekit
