// Training the language model of lm.hpp: batches drawn from a text, micro-batches, the
// loss-free balancer or an auxiliary loss, clipping, the optimizer, evaluation on held-out text,
// and the metrics of every step (docs/training.md, "moekit train"). `moekit train` is this class
// plus flags, files and plots; checkpoints are in checkpoint.hpp (save_lm_checkpoint).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "moekit/lm.hpp"
#include "moekit/train.hpp"

namespace moekit {

/// How the experts' load is kept even.
enum class BalanceMode : std::uint8_t {
  none,                    ///< nothing
  loss_free_sign,          ///< the selection bias, sign rule (Wang et al. 2024, DeepSeek-V3)
  loss_free_proportional,  ///< the selection bias, proportional rule
  aux,                     ///< the Switch/GShard auxiliary loss, coefficient aux_coef
  seq_aux,                 ///< DeepSeek-V3's sequence-wise auxiliary loss, coefficient aux_coef
};
/// "none", "loss_free_sign", ... and back; parse throws std::invalid_argument listing the names.
const char* balance_mode_name(BalanceMode mode) noexcept;
BalanceMode parse_balance_mode(const std::string& name);

struct LmTrainOptions {
  std::int64_t steps = 600;
  std::int64_t batch_tokens = 4096;   ///< T per step
  std::int64_t seq_len = 256;         ///< positions per sequence (min with batch_tokens)
  std::int64_t micro_batches = 1;     ///< M: the step's sequences split into M forwards/backwards
  LrSchedule lr{3e-3, 30, 600, LrSchedule::Decay::cosine, 3e-4};
  Optimizer::Kind optimizer = Optimizer::Kind::adamw;
  AdamWOptions adamw{0.9, 0.95, 1e-8, 0.01};
  SgdOptions sgd{0.9, 0.0, false};
  double clip = 1.0;                  ///< global gradient-norm clip (0: none)
  BalanceMode balance = BalanceMode::loss_free_sign;
  RateSchedule bias_rate{1e-3, -1, -1, 0.0, {}, -1};
  double aux_coef = 1e-3;             ///< α of aux / seq_aux
  double z_coef = 0;                  ///< router z-loss coefficient (any balance mode)
  bool init_collapsed = false;        ///< start every router collapsed onto its first K experts
  std::int64_t eval_every = 50;       ///< 0: only at the end
  std::int64_t eval_tokens = 16384;   ///< held-out positions per evaluation (at most)
  std::uint64_t seed = 1;
  bool keep_pre_activations = true;   ///< false: recompute them in the backward (less memory)

  /// Throws std::invalid_argument naming the option.
  void validate() const;
};

/// One layer's load in one step (training forwards only) or one evaluation.
struct LayerLoad {
  LoadMetrics load;
  std::vector<double> relative;  ///< c_i / mean(c), per expert
  std::vector<float> bias;       ///< the selection bias after the step's update (empty without one)
};

struct EvalResult {
  std::int64_t tokens = 0;
  double loss = 0;   ///< nats per token
  double ppl = 0;    ///< exp(loss)
  double bpb = 0;    ///< bits per byte (= loss / ln 2 for byte tokens)
  std::vector<LayerLoad> layers;  ///< MaxVio_global per layer: layers[l].load.max_violation
};

struct StepResult {
  std::int64_t step = 0;     ///< 1-based: steps done after this one
  std::int64_t tokens = 0;   ///< tokens trained on so far
  double train_loss = 0;     ///< mean CE of the step's tokens
  double aux_loss = 0, z_loss = 0;  ///< summed over layers
  double lr = 0, bias_rate = 0, grad_norm = 0;
  std::vector<LayerLoad> layers;  ///< MaxVio_batch per layer
  double seconds = 0, moe_seconds = 0;  ///< the step's wall time and the part in the MoE blocks
  bool evaluated = false;
  EvalResult eval;
};

/// What LmTrainer needs from a data + expert parallel job (docs/distributed.md, "Training"):
/// every rank trains on its share of each micro-batch's sequences, holds the routed experts
/// local_experts() of every block (their gradients and optimizer state too) and the rest of the
/// model whole. The MPI implementation is dist::MpiLmParallel (moekit/dist.hpp).
class LmParallel {
 public:
  virtual ~LmParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The routed experts this rank holds in every block, ascending (possibly none).
  virtual std::vector<std::int64_t> local_experts() const = 0;
  /// The runner of `model`'s MoE blocks (called once, when the model is built; collective).
  virtual std::shared_ptr<MoeBlockRunner> make_runner(const LanguageModel& model) = 0;
  /// Collective, in place: Σ over the ranks added in rank order (0, 1, ...) — the same bits on
  /// every rank, and the data unchanged at one rank.
  virtual void sum(float* data, std::int64_t n) = 0;
  virtual void sum(double* data, std::int64_t n) = 0;
  /// Collective, in place, exact.
  virtual void sum(std::int64_t* data, std::int64_t n) = 0;
  /// Collective: if `error` is set on any rank, every rank throws that (lowest) rank's error.
  virtual void agree(const std::exception_ptr& error) = 0;
  /// Collective: the whole [E, ...] tensor on rank 0 from every rank's [E_local, ...] part
  /// (local_experts() order); an empty tensor on the other ranks.
  virtual Tensor gather_experts(const Tensor& local, std::int64_t num_experts) = 0;
};

class LmTrainer {
 public:
  /// A fresh model from options.seed, or (resume) the given model state. `train_text` must
  /// hold at least one batch (batch_tokens + 1 bytes), `eval_text` at least one sequence.
  /// Throws std::invalid_argument naming what is wrong (options, sizes, a loss-free mode on a
  /// router without a selection bias) before anything is computed.
  ///
  /// `parallel` (collective then, every rank passing the same arguments): data + expert parallel
  /// training. Each micro-batch's sequences are split over the ranks in order (every rank needs
  /// at least one: B / micro_batches >= ranks), the MoE blocks run expert-parallel, the other
  /// gradients are summed over the ranks in rank order, the expert counts exactly, so every
  /// rank applies the same update to what it holds and the balancer's bias is the same bits on
  /// every rank. At one rank the run is bit-identical to the single-process one; at more, the
  /// losses equal it to fp32 rounding (docs/distributed.md says why).
  LmTrainer(LmConfig config, LmTrainOptions options, std::vector<std::uint8_t> train_text,
            std::vector<std::uint8_t> eval_text, std::shared_ptr<LmParallel> parallel = nullptr);
  LmTrainer(const LmTrainer&) = delete;  // the model's block runner points into it
  LmTrainer& operator=(const LmTrainer&) = delete;

  /// One optimizer step. Throws std::runtime_error naming the step if the loss or the gradient
  /// is not finite: the parameters, optimizer, biases and RNG are then those before the step.
  StepResult step();
  /// The loss and load of the held-out text (evaluation forwards are never counted by the
  /// balancer).
  EvalResult evaluate() const;
  bool done() const noexcept { return step_ >= options_.steps; }

  const LmConfig& config() const noexcept { return config_; }
  const LmTrainOptions& options() const noexcept { return options_; }
  const LanguageModel& model() const noexcept { return model_; }
  const LmParams& params() const noexcept { return params_; }
  const std::vector<Tensor>& selection_biases() const noexcept { return biases_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  std::int64_t steps_done() const noexcept { return step_; }
  std::uint64_t rng_state() const noexcept { return rng_; }

  /// Expert parallel: the routed experts this rank holds (ascending), empty without `parallel`.
  const std::vector<std::int64_t>& local_experts() const noexcept { return local_; }
  const std::shared_ptr<LmParallel>& parallel() const noexcept { return parallel_; }
  /// The whole model's parameters and optimizer (what a checkpoint holds): params() and
  /// optimizer() in one process; with `parallel` a collective whose result is whole on rank 0
  /// only (the other ranks get empty LmParams and a stateless Optimizer). whole_optimizer takes
  /// whole_params()'s result (its shapes, on rank 0), so the experts are gathered once.
  LmParams whole_params() const;
  Optimizer whole_optimizer(const LmParams& whole_params) const;

  /// Replaces the state with a checkpoint's (load_lm_checkpoint): parameters copied into the
  /// model's own tensors, biases, optimizer state, step and RNG. Throws std::invalid_argument
  /// for shapes that do not match, changing nothing. With `parallel`, every rank passes the
  /// whole checkpoint and keeps its own experts' part.
  void restore(const LmParams& params, const std::vector<Tensor>& biases, const Optimizer& optimizer,
               std::int64_t step, std::uint64_t rng_state);

 private:
  // step()'s parts in its order: draw the sequences; each micro-batch's forward and backward
  // (with the router gradients of its aux losses); the sums over ranks; clipping and the
  // optimizer; the balancer.
  struct Step;
  Step sample() const;
  void micro_batch(Step& s, std::int64_t m);
  std::vector<Tensor> aux_dlogits(Step& s, const LmBatch& batch, const std::vector<std::int64_t>& micro_counts);
  void reduce(Step& s);
  void update(Step& s);
  void balance(Step& s);

  LmConfig config_;
  LmTrainOptions options_;
  std::shared_ptr<LmParallel> parallel_;
  std::vector<std::int64_t> local_;
  std::vector<std::uint8_t> train_, eval_;
  LmParams params_, grads_;
  std::vector<Tensor> biases_;
  LanguageModel model_;
  Optimizer optimizer_;
  std::vector<LoadBalancer> balancers_;
  LmSaved saved_;
  std::int64_t step_ = 0;
  std::uint64_t rng_ = 0;
};

}  // namespace moekit
