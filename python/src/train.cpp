// The training core for Python: a trainable MoE block whose parameters are numpy or torch
// arrays sharing memory with what moekit computes with, its training forward and backward,
// the loss-free balancer and the auxiliary losses (train.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "moekit/moekit.hpp"

namespace moekit::py {

namespace {

using namespace nb::literals;

Framework parse_framework(const std::string& name) {
  if (name == "numpy") return Framework::numpy;
  if (name == "torch") return Framework::torch;
  throw std::invalid_argument("[moekit] framework must be 'numpy' or 'torch', got '" + name + "'");
}

// An array sharing `t`'s storage (writable); the array keeps the storage alive.
nb::object share(const Tensor& t, Framework fw) { return export_tensor(t, fw); }

std::uint64_t next_id() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

/// A block whose parameters live in owned f32 tensors that Python shares (trainable_parameters /
/// init_parameters), computed with in place by `layer` (make_trainable_layer).
struct TrainableMoe {
  std::uint64_t id = next_id();  // which block a SavedForward came from
  MoeConfig config;
  MoeTensors params;
  Tensor selection_bias;  // [E] f32 when the router has one
  std::unique_ptr<MoeLayer> layer;

  void build() { layer = std::make_unique<MoeLayer>(make_trainable_layer(config, params, selection_bias)); }
};


std::unique_ptr<TrainableMoe> fresh(const MoeConfig& config, std::uint64_t seed) {
  auto t = std::make_unique<TrainableMoe>();
  t->config = config;
  t->params = init_parameters(config, seed);
  if (config.router.has_selection_bias) t->selection_bias = Tensor({config.router.num_experts}, DType::f32);
  t->build();
  return t;
}

std::unique_ptr<TrainableMoe> from_layer(const MoeLayer& layer) {
  auto t = std::make_unique<TrainableMoe>();
  t->config = layer.config();
  t->params = trainable_parameters(layer);
  if (t->config.router.has_selection_bias) t->selection_bias = layer.weights().selection_bias.clone();
  t->build();
  return t;
}

nb::dict parameters(const TrainableMoe& t, const std::string& framework) {
  const Framework fw = parse_framework(framework);
  nb::dict out;
  t.params.for_each([&](const std::string& name, const Tensor& p) { out[name.c_str()] = share(p, fw); });
  return out;
}

nb::tuple forward_train(const TrainableMoe& t, nb::handle x, bool keep_pre_activations) {
  return forward_train_tagged(*t.layer, t.id, x, keep_pre_activations);
}

nb::tuple backward(const TrainableMoe& t, const Saved& s, nb::handle dy, nb::handle extra_dlogits) {
  return backward_tagged(*t.layer, t.id, s, dy, extra_dlogits);
}

nb::dict update_dict(const BalanceUpdate& u) {
  nb::dict d = load_dict(u.load);
  d["rate"] = u.rate;
  d["bias_min"] = u.bias_min;
  d["bias_mean"] = u.bias_mean;
  d["bias_max"] = u.bias_max;
  return d;
}

// MoeTensors from {name: array} (kMoeTensorMembers' names), each copied into an owned f32 tensor.
MoeTensors tensors_from_dict(const nb::dict& d) {
  MoeTensors t;
  for (auto [key, value] : d) {
    const std::string name = nb::cast<std::string>(key);
    const MoeTensorMember* member = nullptr;
    for (const MoeTensorMember& m : kMoeTensorMembers)
      if (name == m.name) member = &m;
    if (member == nullptr) {
      std::string known;
      for (const MoeTensorMember& m : kMoeTensorMembers) known += (known.empty() ? "" : ", ") + std::string(m.name);
      throw std::invalid_argument("[moekit::stored_tensors] unknown tensor '" + name + "' (names: " + known + ")");
    }
    const InputArray in = import_array(value, member->name);
    t.*(member->member) = to_dtype(in.view, DType::f32);
  }
  return t;
}

}  // namespace

nb::tuple forward_train_tagged(const MoeLayer& layer, std::uint64_t tag, nb::handle x, bool keep_pre_activations) {
  const InputArray in = import_array(x, "x");
  auto s = std::make_unique<Saved>();
  s->owner = tag;
  s->num_experts = layer.config().router.num_experts;
  Tensor y;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    y = layer.forward_train(in.view, s->saved, keep_pre_activations);
  }
  return nb::make_tuple(export_tensor(std::move(y), in.framework), nb::cast(s.release(), nb::rv_policy::take_ownership));
}

nb::tuple backward_tagged(const MoeLayer& layer, std::uint64_t tag, const Saved& s, nb::handle dy,
                          nb::handle extra_dlogits) {
  if (s.owner != tag)
    throw std::invalid_argument("[moekit::backward] saved comes from another layer's forward_train");
  const InputArray d = import_array(dy, "dy");
  InputArray extra;
  if (!extra_dlogits.is_none()) extra = import_array(extra_dlogits, "extra_dlogits");
  MoeTensors grads;
  Tensor dx;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    BackwardOptions opt;
    opt.extra_dlogits = extra.view;
    dx = moekit::backward(layer, s.saved, d.view, grads, opt);
  }
  nb::dict g;
  grads.for_each([&](const std::string& name, const Tensor& v) { g[name.c_str()] = share(v, d.framework); });
  return nb::make_tuple(export_tensor(std::move(dx), d.framework), g);
}

namespace {

// SavedForward and TrainableMoe: the trainable block, its training forward and backward.
void bind_trainable(nb::module_& m) {
  nb::class_<Saved>(m, "SavedForward",
                    "What a training forward keeps for the backward (opaque), with its routing.")
      .def_prop_ro("ids", [](const Saved& s) { return export_tensor(s.saved.routing.ids, Framework::numpy); },
                   "[T, K] int32 expert ids (numpy, shared)")
      .def_prop_ro("weights",
                   [](const Saved& s) { return export_tensor(s.saved.routing.weights, Framework::numpy); },
                   "[T, K] float32 gate weights (numpy, shared)")
      .def_prop_ro("logits", [](const Saved& s) { return export_tensor(s.saved.logits, Framework::numpy); },
                   "[T, E] float32 router logits, router bias included (numpy, shared)")
      .def_prop_ro("counts",
                   [](const Saved& s) {
                     return expert_counts(s.saved.routing.ids, s.num_experts);
                   },
                   "Per-expert counts of the routing")
      .def_prop_ro("nbytes", [](const Saved& s) { return s.saved.nbytes(); });

  nb::class_<TrainableMoe>(m, "TrainableMoe",
                           "An MoE block to train: f32 parameters that numpy/torch arrays share (no copies: an\n"
                           "optimizer updating them changes what moekit computes), forward_train and backward.")
      .def("__init__",
           [](TrainableMoe* self, const MoeConfig& config, std::uint64_t seed) {
             auto t = fresh(config, seed);
             new (self) TrainableMoe(std::move(*t));  // the tensors' storage moves with it
           },
           "config"_a, "seed"_a = 0,
           "Fresh parameters for `config`: every weight N(0, 1/fan_in) from `seed`, biases and the\n"
           "selection bias zero.")
      .def_static(
          "from_layer",
          [](const MoeLayer& layer) {
            nb::gil_scoped_release release;
            return from_layer(layer).release();
          },
          "layer"_a, nb::rv_policy::take_ownership,
          "An f32 copy of a loaded layer's float weights (any dtype or layout), with its selection bias.")
      .def_prop_ro("config", [](const TrainableMoe& t) { return t.config; })
      .def("parameters", &parameters, "framework"_a = "numpy",
           "{name: array} of every parameter ('router', 'experts.gate', ..., kMoeTensorMembers' names),\n"
           "writable and sharing memory with the block.")
      .def(
          "selection_bias",
          [](const TrainableMoe& t, const std::string& framework) -> nb::object {
            if (t.selection_bias.numel() == 0) return nb::none();
            return share(t.selection_bias, parse_framework(framework));
          },
          "framework"_a = "numpy", "The [E] float32 selection bias (shared), or None when the router has none.")
      .def("forward",
           [](const TrainableMoe& t, nb::handle x, bool return_routing) {
             return layer_forward(*t.layer, x, return_routing);
           },
           "x"_a, nb::kw_only(), "return_routing"_a = false, "As MoeLayer.forward.")
      .def("forward_train", &forward_train, "x"_a, "keep_pre_activations"_a = true,
           "(y, saved): y exactly as forward computes it, and what backward needs.")
      .def("backward", &backward, "saved"_a, "dy"_a, "extra_dlogits"_a = nb::none(),
           "(dx float32, {name: gradient}) for dL/dy = dy; extra_dlogits [T, E] float32 is added to\n"
           "dL/dlogits first (auxiliary losses). Bit-identical for any thread count.");
}

// The loss-free balancer: BalanceRule, LoadBalancer, BalanceUpdate.
void bind_balancer(nb::module_& m) {
  nb::enum_<BalanceRule>(m, "BalanceRule", "Loss-free balancing rule.")
      .value("sign", BalanceRule::sign)
      .value("proportional", BalanceRule::proportional);

  nb::class_<LoadBalancer>(m, "LoadBalancer",
                           "The loss-free balancer of one block: counts of a step's training forwards, then one\n"
                           "update of the selection bias.")
      .def(
          "__init__",
          [](LoadBalancer* self, std::int64_t num_experts, BalanceRule rule, double rate, std::int64_t freeze_step) {
            RateSchedule s;
            s.rate = rate;
            s.freeze_step = freeze_step;
            new (self) LoadBalancer(num_experts, rule, s);
          },
          "num_experts"_a, "rule"_a = BalanceRule::sign, "rate"_a = 1e-3, "freeze_step"_a = -1)
      .def("count", [](LoadBalancer& b, const Saved& s) { b.count(s.saved); }, "saved"_a)
      .def("add_counts", &LoadBalancer::add_counts, "counts"_a)
      .def_prop_ro("counts", [](const LoadBalancer& b) { return b.counts(); })
      .def(
          "update",
          [](LoadBalancer& b, TrainableMoe& t, std::int64_t step) {
            if (t.selection_bias.numel() == 0)
              throw std::invalid_argument("[moekit::LoadBalancer.update] the block has no selection bias");
            nb::gil_scoped_release release;
            std::unique_lock lock(compute_mutex());
            return b.update(t.selection_bias, step);
          },
          "block"_a, "step"_a,
          "Applies the rule to block's selection bias in place, resets the counts; returns what it did.")
      .def_prop_ro("num_experts", &LoadBalancer::num_experts);

  nb::class_<BalanceUpdate>(m, "BalanceUpdate")
      .def_prop_ro("max_violation", [](const BalanceUpdate& u) { return u.load.max_violation; })
      .def_prop_ro("dead_experts", [](const BalanceUpdate& u) { return u.load.dead_experts; })
      .def_prop_ro("entropy", [](const BalanceUpdate& u) { return u.load.entropy; })
      .def_ro("rate", &BalanceUpdate::rate)
      .def_ro("bias_min", &BalanceUpdate::bias_min)
      .def_ro("bias_mean", &BalanceUpdate::bias_mean)
      .def_ro("bias_max", &BalanceUpdate::bias_max)
      .def("as_dict", &update_dict);
}

// The auxiliary losses.
void bind_aux_losses(nb::module_& m) {
  m.def(
      "aux_losses",
      [](const RouterConfig& cfg, nb::handle logits, nb::handle ids, double switch_coef, double seq_coef,
         std::vector<std::int64_t> sequence_starts, double z_coef) {
        const InputArray l = import_array(logits, "logits");
        const InputArray i = import_array(ids, "ids");
        AuxLossOptions o;
        o.switch_coef = switch_coef;
        o.seq_coef = seq_coef;
        o.sequence_starts = std::move(sequence_starts);
        o.z_coef = z_coef;
        AuxLosses a;
        {
          nb::gil_scoped_release release;
          a = aux_losses(cfg, l.view, i.view, o);
        }
        nb::dict d;
        d["switch_loss"] = a.switch_loss;
        d["seq_loss"] = a.seq_loss;
        d["z_loss"] = a.z_loss;
        d["total"] = a.total();
        return nb::make_tuple(d, export_tensor(a.dlogits, l.framework));
      },
      "config"_a, "logits"_a, "ids"_a, nb::kw_only(), "switch_coef"_a = 0.0, "seq_coef"_a = 0.0,
      "sequence_starts"_a = std::vector<std::int64_t>{}, "z_coef"_a = 0.0,
      "({'switch_loss', 'seq_loss', 'z_loss', 'total'}, dL/dlogits [T, E] float32) of one forward's\n"
      "logits [T, E] and ids [T, K] (docs/training.md, 'Auxiliary losses').");
}

// A block's tensors under a checkpoint's names, and writing a quantized checkpoint.
void bind_checkpoints(nb::module_& m) {
  m.def(
      "stored_tensors",
      [](const MoeLayer& layer, const nb::dict& tensors) {
        const MoeTensors t = tensors_from_dict(tensors);
        nb::dict out;
        for (auto& [name, tensor] : stored_tensors(layer.config(), stored_layout(layer), t))
          out[name.c_str()] = export_tensor(tensor, Framework::numpy);
        return out;
      },
      "layer"_a, "tensors"_a,
      "A block's parameters or gradients ({name: array} as TrainableMoe.parameters names them) under\n"
      "the checkpoint's own tensor names and stored shapes, for the layout `layer` was loaded from\n"
      "(per-expert, fused, transposed, mlx switch_mlp), as float32 numpy arrays.");
  m.def(
      "quantize_checkpoint",
      [](const std::string& model_dir, const std::string& out_dir, std::optional<int> bits,
         std::optional<int> group_size, int router_bits, const std::string& recipe, const std::string& dtype,
         const std::string& mode) {
        QuantizeOptions o;
        // Unset: the mode's (quantize_mode_defaults).
        const auto [mode_bits, mode_group] = quantize_mode_defaults(mode);
        o.mode = mode;
        o.bits = bits.value_or(mode_bits);
        o.group_size = group_size.value_or(mode_group);
        o.router_bits = router_bits;
        o.recipe = recipe;
        o.dtype = dtype;
        QuantizeReport r;
        {
          nb::gil_scoped_release release;
          r = quantize_checkpoint(model_dir, out_dir, o);
        }
        nb::dict d;
        d["model_type"] = r.model_type;
        d["tensors_written"] = r.tensors_written;
        d["tensors_kept_float"] = r.tensors_kept_float;
        d["tensors_dropped"] = r.tensors_dropped;
        d["shards"] = r.shards;
        d["bytes_in"] = r.bytes_in;
        d["bytes_out"] = r.bytes_out;
        nb::list q;
        for (const QuantizedTensorReport& t : r.quantized) {
          nb::dict e;
          e["name"] = t.name;
          e["shape"] = t.shape;
          e["bits"] = t.bits;
          e["group_size"] = t.group_size;
          e["max_abs_error"] = t.max_abs_error;
          e["rms_error"] = t.rms_error;
          e["rms_weight"] = t.rms_weight;
          q.append(e);
        }
        d["quantized"] = q;
        return d;
      },
      "model_dir"_a, "out_dir"_a, nb::kw_only(), "bits"_a = nb::none(), "group_size"_a = nb::none(),
      "router_bits"_a = -1, "recipe"_a = "", "dtype"_a = "", "mode"_a = "affine",
      "`moekit quantize`: writes out_dir (mlx-lm's quantized folder, byte for byte what\n"
      "mlx_lm.convert -q [--q-mode mode] writes) from the float checkpoint model_dir; returns the\n"
      "report (per tensor errors). recipe: '', 'mixed_2_6', 'mixed_3_4', 'mixed_3_6', 'mixed_4_6';\n"
      "mode: 'affine', 'mxfp4', 'nvfp4', 'mxfp8' (bits and group_size default to the mode's).");
}

// The load metrics of per-expert counts.
void bind_load_metrics(nb::module_& m) {
  m.def(
      "load_metrics",
      [](const std::vector<std::int64_t>& counts) {
        return load_dict(load_metrics(counts));
      },
      "counts"_a, "MaxVio, dead experts, entropy and tokens of per-expert counts.");
}

}  // namespace

void bind_training(nb::module_& m) {
  bind_trainable(m);
  bind_balancer(m);
  bind_aux_losses(m);
  bind_checkpoints(m);
  bind_load_metrics(m);
}

}  // namespace moekit::py
