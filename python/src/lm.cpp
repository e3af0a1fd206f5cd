// `moekit train` for Python: the byte-level language model with MoE blocks and its trainer
// (lm_train.hpp), with the command's defaults and its mapping of options.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "moekit/moekit.hpp"

namespace moekit::py {

namespace {

using namespace nb::literals;

struct PyLmTrainer {
  std::string config_json;
  TextCorpus corpus;
  std::unique_ptr<LmTrainer> trainer;
};

nb::list layer_loads(const std::vector<LayerLoad>& layers) {
  nb::list out;
  for (const LayerLoad& l : layers) {
    nb::dict d = load_dict(l.load);
    d["relative_load"] = l.relative;
    d["bias"] = l.bias;
    out.append(d);
  }
  return out;
}

double max_vio(const std::vector<LayerLoad>& layers) {
  double m = 0;
  for (const LayerLoad& l : layers) m = std::max(m, l.load.max_violation);
  return m;
}

nb::dict eval_dict(const EvalResult& e) {
  nb::dict d;
  d["tokens"] = e.tokens;
  d["loss"] = e.loss;
  d["ppl"] = e.ppl;
  d["bits_per_byte"] = e.bpb;
  d["maxvio_global"] = max_vio(e.layers);
  d["layers"] = layer_loads(e.layers);
  return d;
}

nb::dict step_dict(const StepResult& r) {
  nb::dict d;
  d["step"] = r.step;
  d["tokens"] = r.tokens;
  d["train_loss"] = r.train_loss;
  d["aux_loss"] = r.aux_loss;
  d["z_loss"] = r.z_loss;
  d["lr"] = r.lr;
  d["bias_rate"] = r.bias_rate;
  d["grad_norm"] = r.grad_norm;
  d["maxvio_batch"] = max_vio(r.layers);
  d["layers"] = layer_loads(r.layers);
  d["seconds"] = r.seconds;
  d["moe_seconds"] = r.moe_seconds;
  d["tokens_per_s"] = r.seconds > 0 ? static_cast<double>(r.tokens) / static_cast<double>(r.step) / r.seconds : 0.0;
  d["eval"] = r.evaluated ? nb::object(eval_dict(r.eval)) : nb::none();
  return d;
}

void init_trainer(PyLmTrainer* self, const std::string& family, std::int64_t layers, std::int64_t dim,
                  std::int64_t experts, std::int64_t top_k, std::int64_t expert_width, std::int64_t shared,
                  std::int64_t context, const std::optional<std::vector<std::string>>& data, std::int64_t steps,
                  std::int64_t batch_tokens, std::int64_t seq_len, std::int64_t micro_batches, double lr,
                  std::int64_t warmup, const std::string& optimizer, double clip, const std::string& balance,
                  double bias_rate, std::int64_t bias_freeze_step, double aux_coef, double z_coef,
                  bool init_collapsed, std::int64_t eval_every, std::int64_t eval_tokens, std::uint64_t seed,
                  bool recompute) {
  LmTrainOptions o;
  o.steps = steps;
  o.batch_tokens = batch_tokens;
  o.seq_len = seq_len;
  o.micro_batches = micro_batches;
  o.lr.lr = lr;  // the command's schedule: warm-up, then cosine to lr / 10 at the last step
  o.lr.warmup = warmup;
  o.lr.total_steps = steps;
  o.lr.min_lr = lr / 10;
  o.lr.decay = steps > warmup ? LrSchedule::Decay::cosine : LrSchedule::Decay::constant;
  if (optimizer == "adamw")
    o.optimizer = Optimizer::Kind::adamw;
  else if (optimizer == "sgd")
    o.optimizer = Optimizer::Kind::sgd;
  else
    throw std::invalid_argument("[moekit.LmTrainer] optimizer '" + optimizer + "' is not one of adamw, sgd");
  o.balance = parse_balance_mode(balance);
  o.bias_rate.rate = bias_rate;
  o.bias_rate.freeze_step = bias_freeze_step;
  o.aux_coef = aux_coef;
  o.z_coef = z_coef;
  o.clip = clip;
  o.init_collapsed = init_collapsed;
  o.keep_pre_activations = !recompute;
  o.eval_every = eval_every;
  o.eval_tokens = eval_tokens;
  o.seed = seed;
  o.validate();

  BlockShape s;
  s.hidden_size = dim;
  s.num_experts = experts;
  s.top_k = top_k;
  s.expert_width = expert_width;
  s.shared_experts = shared;
  s.num_layers = layers;
  s.selection_bias = o.balance == BalanceMode::loss_free_sign || o.balance == BalanceMode::loss_free_proportional;
  const std::string block_json = preset_config_json(family, s);
  LmConfig config;
  config.block = parse_hf_config(block_json);
  config.context = context;
  config.validate();

  auto t = std::make_unique<PyLmTrainer>();
  t->config_json = lm_config_json(config, block_json);
  {
    nb::gil_scoped_release release;
    t->corpus = load_text_corpus(data ? *data : std::vector<std::string>{kDefaultCorpus});
    t->trainer = std::make_unique<LmTrainer>(config, o, t->corpus.train, t->corpus.held_out);
  }
  new (self) PyLmTrainer(std::move(*t));
}

}  // namespace

void bind_lm(nb::module_& m) {
  nb::class_<PyLmTrainer>(m, "LmTrainer",
                          "`moekit train` from Python: a byte-level language model whose feed-forward blocks are\n"
                          "`family`'s MoE blocks, trained on text files or folders (default: the Debian text\n"
                          "/usr/share/common-licenses, every 10th 4 KiB block held out). Options and defaults as\n"
                          "the command's flags (docs/training.md). step() trains one optimizer step.")
      .def("__init__", &init_trainer, "family"_a = "deepseek_v3", nb::kw_only(), "layers"_a = 2, "dim"_a = 128,
           "experts"_a = 16, "top_k"_a = 4, "expert_width"_a = 64, "shared"_a = -1, "context"_a = 8,
           "data"_a = nb::none(), "steps"_a = 600, "batch_tokens"_a = 4096, "seq_len"_a = 256,
           "micro_batches"_a = 1, "lr"_a = 3e-3, "warmup"_a = 30, "optimizer"_a = "adamw", "clip"_a = 1.0,
           "balance"_a = "loss_free_sign", "bias_rate"_a = 1e-3, "bias_freeze_step"_a = -1, "aux_coef"_a = 1e-3,
           "z_coef"_a = 0.0, "init_collapsed"_a = false, "eval_every"_a = 50, "eval_tokens"_a = 16384,
           "seed"_a = 1, "recompute"_a = false)
      .def(
          "step",
          [](PyLmTrainer& t) {
            StepResult r;
            {
              nb::gil_scoped_release release;
              std::shared_lock lock(compute_mutex());
              r = t.trainer->step();
            }
            return step_dict(r);
          },
          "One optimizer step: {'step', 'tokens', 'train_loss', 'maxvio_batch', 'layers', 'lr', ...,\n"
          "'eval': {...} on evaluation steps else None}. RuntimeError naming the step for a non-finite loss.")
      .def(
          "evaluate",
          [](const PyLmTrainer& t) {
            EvalResult e;
            {
              nb::gil_scoped_release release;
              std::shared_lock lock(compute_mutex());
              e = t.trainer->evaluate();
            }
            return eval_dict(e);
          },
          "{'loss' (nats/token), 'ppl', 'bits_per_byte', 'maxvio_global', 'layers'} on the held-out text.")
      .def_prop_ro("done", [](const PyLmTrainer& t) { return t.trainer->done(); })
      .def_prop_ro("steps_done", [](const PyLmTrainer& t) { return t.trainer->steps_done(); })
      .def_prop_ro("data_files", [](const PyLmTrainer& t) { return t.corpus.files; })
      .def_prop_ro("data_bytes", [](const PyLmTrainer& t) { return t.corpus.bytes; })
      .def(
          "save",
          [](const PyLmTrainer& t, const std::string& dir) {
            TrainingState st;
            st.step = t.trainer->steps_done();
            st.rng_state = t.trainer->rng_state();
            nb::gil_scoped_release release;
            const LmTrainer& tr = *t.trainer;
            save_lm_checkpoint(dir, t.config_json, tr.config(), tr.params(), tr.selection_biases(), tr.optimizer(),
                               st);
          },
          "dir"_a,
          "Writes the model as a checkpoint folder (config.json + model.safetensors + training state)\n"
          "that load_moe_layer, `moekit inspect` and `moekit forward` read.");
}

}  // namespace moekit::py
