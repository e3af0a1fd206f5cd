// moekit._moekit: the C++ library's API for Python (nanobind). Names as in C++; arrays in and
// out without copies (arrays.hpp); the GIL released around every computation; moekit's
// exceptions become ValueError (std::invalid_argument), IndexError (std::out_of_range) and
// RuntimeError (std::runtime_error) with the same messages (nanobind's standard translation).
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "moekit/moekit.hpp"

namespace moekit::py {

std::shared_mutex& compute_mutex() {
  static std::shared_mutex mu;
  return mu;
}

namespace {

using namespace nb::literals;

// ---- RouterConfig from keyword arguments -------------------------------------------------

template <class T>
void set_field(RouterConfig& c, T RouterConfig::*member, nb::handle value, const char* key) {
  T v{};
  if (!nb::try_cast(value, v))
    throw nb::type_error((std::string("[moekit::RouterConfig] ") + key + " cannot be set to a " +
                          nb::cast<std::string>(nb::str(value.type().attr("__name__"))))
                             .c_str());
  c.*member = v;
}

using FieldSetter = std::function<void(RouterConfig&, nb::handle)>;

const std::map<std::string, FieldSetter>& router_fields() {
#define MOEKIT_FIELD(name) \
  {#name, [](RouterConfig& c, nb::handle v) { set_field(c, &RouterConfig::name, v, #name); }}
  static const std::map<std::string, FieldSetter> fields = {
      MOEKIT_FIELD(num_experts),      MOEKIT_FIELD(top_k),
      MOEKIT_FIELD(score_func),       MOEKIT_FIELD(has_router_bias),
      MOEKIT_FIELD(has_selection_bias), MOEKIT_FIELD(group_mode),
      MOEKIT_FIELD(n_group),          MOEKIT_FIELD(topk_group),
      MOEKIT_FIELD(mask_fill),        MOEKIT_FIELD(weights_from),
      MOEKIT_FIELD(renorm),           MOEKIT_FIELD(renorm_only_if_k_gt_1),
      MOEKIT_FIELD(guard_zero_sum),   MOEKIT_FIELD(renorm_eps),
      MOEKIT_FIELD(routed_scaling_factor), MOEKIT_FIELD(scale_only_without_renorm),
      MOEKIT_FIELD(weight_on_input),
  };
#undef MOEKIT_FIELD
  return fields;
}

void init_router_config(RouterConfig* self, const nb::kwargs& kwargs) {
  RouterConfig c;
  const auto& fields = router_fields();
  for (auto [key, value] : kwargs) {
    const std::string k = nb::cast<std::string>(key);
    const auto it = fields.find(k);
    if (it == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += (known.empty() ? "" : ", ") + f.first;
      throw nb::type_error(("[moekit::RouterConfig] unknown field '" + k + "' (fields: " + known + ")").c_str());
    }
    it->second(c, value);
  }
  new (self) RouterConfig(c);
}

// ---- routing functions --------------------------------------------------------------------

nb::object py_route(const RouterConfig& cfg, nb::handle logits, nb::handle selection_bias) {
  const InputArray l = import_array(logits, "logits");
  InputArray b;
  if (!selection_bias.is_none()) b = import_array(selection_bias, "selection_bias");
  Routing r;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    r = route(cfg, l.view, b.view);
  }
  return nb::make_tuple(export_tensor(r.ids, l.framework), export_tensor(r.weights, l.framework));
}

nb::object py_router_logits(nb::handle x, nb::handle w, nb::handle bias) {
  const InputArray xi = import_array(x, "x");
  const InputArray wi = import_array(w, "w_router");
  InputArray bi;
  if (!bias.is_none()) bi = import_array(bias, "bias");
  Tensor out;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    out = router_logits(xi.view, wi.view, bi.view);
  }
  return export_tensor(std::move(out), xi.framework);
}

std::vector<std::int64_t> py_expert_counts(nb::handle ids, std::int64_t num_experts) {
  const InputArray in = import_array(ids, "ids");
  return expert_counts(in.view, num_experts);
}

// ---- the layer ------------------------------------------------------------------------------

// Every stored matrix of one projection as arrays: one [E, rows, cols] (or [rows, cols] for a
// single matrix) strided view where the experts sit at evenly spaced addresses, else a list of
// E [rows, cols] views. Packed panels are [E, panels, cols, 16], AMX tiles [E, rows / 16,
// cols / 32, 16, 32] (both rounded up); MLX-quantized projections give
// their uint32 codes plus ".scales" and ".biases".
void add_matrix(nb::dict& out, const std::string& name, const ExpertMatrix& m, nb::handle owner, bool single) {
  if (!m.defined()) return;
  const std::int64_t E = m.num_experts();
  auto add = [&](const std::string& key, const std::vector<const void*>& ptrs, DType dtype, Shape inner,
                 std::vector<std::int64_t> inner_strides) {
    const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
    bool even = E >= 1;
    std::int64_t step = 0;
    if (E > 1) {
      const std::ptrdiff_t d = static_cast<const char*>(ptrs[1]) - static_cast<const char*>(ptrs[0]);
      even = d > 0 && d % elem == 0;
      step = d / elem;
      for (std::int64_t e = 2; even && e < E; ++e)
        even = static_cast<const char*>(ptrs[e]) - static_cast<const char*>(ptrs[e - 1]) == d;
    }
    if (single && E == 1) {
      out[key.c_str()] = export_view(ptrs[0], dtype, inner, inner_strides, owner, Framework::numpy, false);
    } else if (even) {
      Shape shape{E};
      shape.insert(shape.end(), inner.begin(), inner.end());
      std::vector<std::int64_t> strides{E > 1 ? step : 0};
      strides.insert(strides.end(), inner_strides.begin(), inner_strides.end());
      out[key.c_str()] = export_view(ptrs[0], dtype, shape, strides, owner, Framework::numpy, false);
    } else {
      nb::list items;
      for (std::int64_t e = 0; e < E; ++e)
        items.append(export_view(ptrs[e], dtype, inner, inner_strides, owner, Framework::numpy, false));
      out[key.c_str()] = items;
    }
  };
  if (m.quantized()) {
    // The container as stored (MLX affine: U32 words; MXFP4: bytes), and the scales (and biases).
    const std::int64_t srows = m.scale_rows(), groups = m.scale_cols();
    add(name, m.experts, m.dtype, {m.rows, m.row_elements()}, {m.row_stride, 1});
    add(name + ".scales", m.scales, m.format.scale_dtype, {srows, groups}, {m.scale_stride, 1});
    if (m.format.has_bias) add(name + ".biases", m.biases, m.format.scale_dtype, {srows, groups}, {m.scale_stride, 1});
  } else if (m.layout == MatrixLayout::panels) {
    add(name, m.experts, m.dtype, {(m.rows + 15) / 16, m.cols, 16}, {m.cols * 16, 16, 1});
  } else if (m.layout == MatrixLayout::amx_tiles) {
    const std::int64_t chunks = (m.cols + 31) / 32;
    add(name, m.experts, m.dtype, {(m.rows + 15) / 16, chunks, 16, 32}, {chunks * 512, 512, 32, 1});
  } else {
    add(name, m.experts, m.dtype, {m.rows, m.cols}, {m.row_stride, 1});
  }
}

void add_tensor(nb::dict& out, const char* name, const TensorView& t, nb::handle owner) {
  if (!t.defined() || t.numel() == 0) return;
  out[name] = export_view(t.data(), t.dtype(), t.shape(), {}, owner, Framework::numpy, false);
}

// A copy of the layer's weights description, taken while no pack_weights() runs.
MoeWeights weights_snapshot(const MoeLayer& layer) {
  nb::gil_scoped_release release;
  std::shared_lock lock(compute_mutex());
  return layer.weights();
}

nb::dict layer_weights(const MoeLayer& layer) {
  // The arrays keep a copy of the weights' description alive: its keep_alive holds the mapped
  // file or the owned tensors, even after pack_weights() replaces the layer's own.
  auto held = std::make_unique<MoeWeights>(weights_snapshot(layer));
  const MoeWeights& w = *held;
  nb::capsule owner(held.get(), [](void* p) noexcept { delete static_cast<MoeWeights*>(p); });
  held.release();
  nb::dict out;
  add_tensor(out, "router", w.router, owner);
  add_matrix(out, "router", w.router_quantized, owner, true);
  add_tensor(out, "router_bias", w.router_bias, owner);
  add_tensor(out, "selection_bias", w.selection_bias, owner);
  add_matrix(out, "experts.gate", w.experts.gate, owner, false);
  add_matrix(out, "experts.up", w.experts.up, owner, false);
  add_matrix(out, "experts.down", w.experts.down, owner, false);
  add_tensor(out, "experts.gate_bias", w.experts.gate_bias, owner);
  add_tensor(out, "experts.up_bias", w.experts.up_bias, owner);
  add_tensor(out, "experts.down_bias", w.experts.down_bias, owner);
  if (w.shared.num_experts() > 0) {
    add_matrix(out, "shared.gate_proj", w.shared.gate, owner, true);
    add_matrix(out, "shared.up_proj", w.shared.up, owner, true);
    add_matrix(out, "shared.down_proj", w.shared.down, owner, true);
  }
  add_tensor(out, "shared_gate", w.shared_gate, owner);
  add_matrix(out, "shared_gate", w.shared_gate_quantized, owner, true);
  return out;
}

}  // namespace

nb::object layer_forward(const MoeLayer& layer, nb::handle x, bool return_routing) {
  const InputArray in = import_array(x, "x");
  Tensor y;
  ForwardInfo info;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    y = layer.forward(in.view, return_routing ? &info : nullptr);
  }
  nb::object yo = export_tensor(std::move(y), in.framework);
  if (!return_routing) return yo;
  return nb::make_tuple(yo, export_tensor(info.routing.ids, in.framework),
                        export_tensor(info.routing.weights, in.framework), export_tensor(info.logits, in.framework));
}

namespace {

// The routing and expert-body enums.
void bind_enums(nb::module_& m) {
  nb::enum_<ScoreFunc>(m, "ScoreFunc", "How router logits become scores (docs/routing.md, 'The pipeline').")
      .value("softmax", ScoreFunc::softmax)
      .value("sigmoid", ScoreFunc::sigmoid)
      .value("sqrt_softplus", ScoreFunc::sqrt_softplus)
      .value("softmax_selected", ScoreFunc::softmax_selected)
      .value("sigmoid_selected", ScoreFunc::sigmoid_selected);
  nb::enum_<GroupMode>(m, "GroupMode", "Group-limited selection.")
      .value("none", GroupMode::none)
      .value("max", GroupMode::max)
      .value("top2_sum", GroupMode::top2_sum);
  nb::enum_<MaskFill>(m, "MaskFill", "What dropped groups' experts are set to before top-K.")
      .value("neg_inf", MaskFill::neg_inf)
      .value("legacy_zero", MaskFill::legacy_zero);
  nb::enum_<WeightsFrom>(m, "WeightsFrom", "Which scores the gate weights are gathered from.")
      .value("scores", WeightsFrom::scores)
      .value("selection_scores", WeightsFrom::selection_scores);
  nb::enum_<Renorm>(m, "Renorm", "Renormalisation of the K weights.")
      .value("none", Renorm::none)
      .value("sum", Renorm::sum)
      .value("sum_eps", Renorm::sum_eps)
      .value("sum_floor", Renorm::sum_floor);
  nb::enum_<BodyKind>(m, "BodyKind", "The expert body.")
      .value("swiglu", BodyKind::swiglu)
      .value("swiglu_clamped", BodyKind::swiglu_clamped)
      .value("geglu", BodyKind::geglu)
      .value("geglu_tanh", BodyKind::geglu_tanh)
      .value("mlp_relu", BodyKind::mlp_relu)
      .value("mlp_relu2", BodyKind::mlp_relu2)
      .value("mlp_silu", BodyKind::mlp_silu);
}

// RouterConfig, MoeConfig and the functions that read or make a MoeConfig.
void bind_configs(nb::module_& m) {
  nb::class_<RouterConfig>(m, "RouterConfig",
                           "Every routing knob of docs/routing.md, 'The pipeline' as data; defaults are plain softmax top-K.\n\n"
                           "RouterConfig(num_experts=8, top_k=2, score_func=ScoreFunc.sigmoid, ...) sets any field\n"
                           "by keyword.")
      .def("__init__", &init_router_config, "kwargs"_a)
      .def_rw("num_experts", &RouterConfig::num_experts, "E")
      .def_rw("top_k", &RouterConfig::top_k, "K, in [1, E]")
      .def_rw("score_func", &RouterConfig::score_func)
      .def_rw("has_router_bias", &RouterConfig::has_router_bias, "The router linear has a bias [E] (GPT-OSS).")
      .def_rw("has_selection_bias", &RouterConfig::has_selection_bias,
              "A selection bias [E] is added to the scores used for selection only.")
      .def_rw("group_mode", &RouterConfig::group_mode)
      .def_rw("n_group", &RouterConfig::n_group)
      .def_rw("topk_group", &RouterConfig::topk_group)
      .def_rw("mask_fill", &RouterConfig::mask_fill)
      .def_rw("weights_from", &RouterConfig::weights_from)
      .def_rw("renorm", &RouterConfig::renorm)
      .def_rw("renorm_only_if_k_gt_1", &RouterConfig::renorm_only_if_k_gt_1)
      .def_rw("guard_zero_sum", &RouterConfig::guard_zero_sum)
      .def_rw("renorm_eps", &RouterConfig::renorm_eps)
      .def_rw("routed_scaling_factor", &RouterConfig::routed_scaling_factor)
      .def_rw("scale_only_without_renorm", &RouterConfig::scale_only_without_renorm)
      .def_rw("weight_on_input", &RouterConfig::weight_on_input)
      .def("validate", [](const RouterConfig& c) { validate(c); },
           "Raises ValueError naming the field and values if the config is inconsistent.")
      .def("set_knob", &set_router_knob, "key"_a, "value"_a,
           "Sets one knob by name and text value, as the command line's --set does.")
      .def("__repr__", [](const RouterConfig& c) { return "RouterConfig(" + describe(c) + ")"; });

  nb::class_<MoeConfig>(m, "MoeConfig", "One MoE block's configuration, as parse_hf_config reads it.")
      .def_rw("model_type", &MoeConfig::model_type)
      .def_rw("hidden_size", &MoeConfig::hidden_size, "D")
      .def_rw("expert_width", &MoeConfig::expert_width, "F of one routed expert")
      .def_rw("router", &MoeConfig::router)
      .def_rw("body", &MoeConfig::body)
      .def_rw("expert_bias", &MoeConfig::expert_bias)
      .def_rw("swiglu_limit", &MoeConfig::swiglu_limit)
      .def_rw("swiglu_alpha", &MoeConfig::swiglu_alpha)
      .def_rw("shared_width", &MoeConfig::shared_width, "Total width of the shared expert(s); 0 = none")
      .def_rw("shared_gated", &MoeConfig::shared_gated)
      .def_rw("num_layers", &MoeConfig::num_layers)
      .def("is_moe_layer", &MoeConfig::is_moe_layer, "layer"_a)
      .def("moe_layer_indices", &MoeConfig::moe_layer_indices)
      .def("__repr__", [](const MoeConfig& c) {
        return "MoeConfig(" + c.model_type + ", D=" + std::to_string(c.hidden_size) + ", F=" +
               std::to_string(c.expert_width) + ", shared_width=" + std::to_string(c.shared_width) + ", " +
               body_name(c.body) + ", " + describe(c.router) + ")";
      });

  m.def("parse_hf_config", [](const std::string& text) { return parse_hf_config(text); }, "json_text"_a,
        "A MoeConfig from the text of a Hugging Face / mlx-lm config.json.");
  m.def("load_hf_config", &load_hf_config, "path"_a, "A MoeConfig from a checkpoint folder's config.json.");
  m.def("load_config", &load_config, "path"_a,
        "A MoeConfig from a checkpoint folder's config.json, or from a GGUF file's metadata (a path\n"
        "ending in .gguf; llama.cpp's architectures, docs/formats.md).");
  m.def("supported_model_types", &supported_model_types);
  m.def(
      "preset_config",
      [](const std::string& family, std::int64_t hidden_size, std::int64_t num_experts, std::int64_t top_k,
         std::int64_t expert_width, std::int64_t shared_experts, bool selection_bias) {
        BlockShape s;
        s.hidden_size = hidden_size;
        s.num_experts = num_experts;
        s.top_k = top_k;
        s.expert_width = expert_width;
        s.shared_experts = shared_experts;
        s.selection_bias = selection_bias;
        return parse_hf_config(preset_config_json(family, s));
      },
      "family"_a, "hidden_size"_a, "num_experts"_a, "top_k"_a, "expert_width"_a, "shared_experts"_a = -1,
      "selection_bias"_a = false,
      "The config of a from-scratch block of `family` (its routing, body and shared experts) at these\n"
      "sizes; shared_experts -1 keeps the family's own count. selection_bias adds one to families\n"
      "without (loss-free balancing).");
}

// The routing functions: route, router_logits, expert_counts, max_violation.
void bind_routing(nb::module_& m) {
  m.def("route", &py_route, "config"_a, "logits"_a, "selection_bias"_a = nb::none(),
        "(ids [..., K] int32, weights [..., K] float32) for router logits [..., E] float32 under config.");
  m.def("router_logits", &py_router_logits, "x"_a, "w_router"_a, "bias"_a = nb::none(),
        "logits = x · w_routerᵀ (+ bias), fp32 accumulation, [..., E] float32.");
  m.def("expert_counts", &py_expert_counts, "ids"_a, "num_experts"_a,
        "Per-expert counts of (token, slot) pairs of a routing's ids.");
  m.def("max_violation", &max_violation, "counts"_a, "MaxVio = (max c - mean c) / mean c.");
}

// The worker threads, and the zero-copy tests' probe.
void bind_runtime(nb::module_& m) {
  m.def(
      "set_num_threads",
      [](int n) {
        nb::gil_scoped_release release;
        std::unique_lock lock(compute_mutex());  // waits for running computations
        set_num_threads(n);
      },
      "n"_a, "Worker threads for every moekit operation from now on (0: all hardware threads).");
  m.def("num_threads", &num_threads);
  m.def(
      "_input_address",
      [](nb::handle x) {
        const InputArray in = import_array(x, "x");
        return nb::make_tuple(reinterpret_cast<std::uintptr_t>(in.view.data()), in.copy.data() != nullptr);
      },
      "x"_a, "(address moekit reads x at, whether x was copied): the zero-copy tests' probe.");
}

// MoeLayer: forward, its weights, the compute modes, forward_train and backward.
void bind_layer(nb::module_& m) {
  nb::class_<MoeLayer>(m, "MoeLayer",
                       "The whole MoE block: router, routed experts, shared experts. Load one with\n"
                       "load_moe_layer(path, layer); forward is safe from several Python threads at once.")
      .def("forward", &layer_forward, "x"_a, nb::kw_only(), "return_routing"_a = false,
           "y = MoE(x) for x [..., D] float32 or bfloat16: a numpy array (y is numpy) or a DLPack\n"
           "tensor such as a torch.Tensor (y is a torch.Tensor), read in place when C-contiguous\n"
           "(otherwise copied once). y has x's shape and dtype and owns its memory (no copy is made\n"
           "to hand it back). With return_routing=True: (y, ids [..., K] int32, weights [..., K]\n"
           "float32, logits [..., E] float32). Raises ValueError for a wrong shape or dtype or\n"
           "non-finite logits. The GIL is released while it computes.")
      .def_prop_ro(
          "config", [](const MoeLayer& l) { return l.config(); }, "A copy of the layer's MoeConfig.")
      .def_prop_ro("weights", &layer_weights,
                   "The stored tensors as read-only numpy views, no copy: 'router', 'router_bias',\n"
                   "'selection_bias', 'experts.gate' / 'experts.up' / 'experts.down' ([E, out, in]\n"
                   "strided views, or a list of E matrices where the experts are not evenly spaced),\n"
                   "expert biases, 'shared.gate_proj' / 'shared.up_proj' / 'shared.down_proj',\n"
                   "'shared_gate'. bfloat16 tensors show their raw bits as uint16 (moekit.weights_as_bf16\n"
                   "reinterprets them where ml_dtypes is installed).")
      .def_prop_ro("layout", [](const MoeLayer& l) { return weights_snapshot(l).layout; })
      .def_prop_ro(
          "mapped", [](const MoeLayer& l) { return weights_snapshot(l).mapped; },
          "True when the experts are used in place from the memory-mapped file.")
      .def_prop_ro("block", [](const MoeLayer& l) { return l.weights().block; })
      .def(
          "pack_weights",
          [](MoeLayer& l) {
            nb::gil_scoped_release release;
            std::unique_lock lock(compute_mutex());
            l.pack_weights();
          },
          "Repacks the experts into the forward kernel's packed layout (faster prefill; the weights'\n"
          "bytes become resident): panels, or in the bf16 compute mode on a CPU with AMX, AMX tiles\n"
          "(the same results as unpacked; ValueError on the mode's other paths). Waits for forwards in\n"
          "flight.")
      .def(
          "set_int8_activations",
          [](MoeLayer& l, bool on) {
            nb::gil_scoped_release release;
            std::unique_lock lock(compute_mutex());
            l.set_int8_activations(on);
          },
          "on"_a, "The fast int8-activation mode for MLX-quantized experts (docs/numerics.md bounds it).")
      .def(
          "set_bf16_activations",
          [](MoeLayer& l, bool on) {
            nb::gil_scoped_release release;
            std::unique_lock lock(compute_mutex());
            l.set_bf16_activations(on);
          },
          "on"_a,
          "The bf16 compute mode for bf16 weights, as torch and MLX run bf16 models: the experts' input\n"
          "rows and intermediate rounded to bf16, bf16 x bf16 products summed in fp32 (AVX512-BF16 where\n"
          "the CPU has it); the router stays fp32. ValueError for weights that are not bf16 rows, and for\n"
          "turning it off once pack_weights() packed AMX tiles.")
      .def_prop_ro("bf16_activations", &MoeLayer::bf16_activations, "Whether the bf16 compute mode is on.")
      .def(
          "set_compute_mode",
          [](MoeLayer& l, const std::string& mode) {
            const std::optional<ComputeMode> m = compute_mode_from_name(mode);
            if (!m)
              throw std::invalid_argument("[moekit.MoeLayer.set_compute_mode] mode '" + mode +
                                          "' is not one of exact, int8, bf16");
            nb::gil_scoped_release release;
            std::unique_lock lock(compute_mutex());
            l.set_compute_mode(*m);
          },
          "mode"_a,
          "The arithmetic of the experts' projections: 'exact' (the default), 'int8' (as\n"
          "set_int8_activations(True)) or 'bf16' (as set_bf16_activations(True), and its ValueErrors).\n"
          "The router stays exact. Waits for forwards in flight.")
      .def_prop_ro(
          "compute_mode", [](const MoeLayer& l) { return std::string(compute_mode_name(l.compute_mode())); },
          "'exact', 'int8' or 'bf16' (set_compute_mode).")
      .def(
          "forward_train",
          [](const MoeLayer& l, nb::handle x, bool keep) { return forward_train_tagged(l, owner_tag(l), x, keep); },
          "x"_a, "keep_pre_activations"_a = true,
          "(y, saved): y exactly as forward computes it, and what backward needs (float weights).")
      .def(
          "backward",
          [](const MoeLayer& l, const Saved& s, nb::handle dy, nb::handle extra) {
            return backward_tagged(l, owner_tag(l), s, dy, extra);
          },
          "saved"_a, "dy"_a, "extra_dlogits"_a = nb::none(),
          "(dx float32, {name: gradient}) of this layer's parameters ('router', 'experts.gate', ...,\n"
          "stacked [E, out, in]; moekit.stored_tensors maps them to the checkpoint's names) for\n"
          "dL/dy = dy. Raises ValueError for a quantized layer.");
}

// Loading a MoeLayer from a checkpoint folder, and its report.
void bind_loading(nb::module_& m) {
  m.def(
      "load_moe_layer",
      [](const std::string& path, std::int64_t layer, const MoeConfig* config) {
        nb::gil_scoped_release release;
        return config ? load_moe_layer(path, *config, layer) : load_moe_layer(path, layer);
      },
      "path"_a, "layer"_a, "config"_a = nb::none(),
      "Loads the MoE block of decoder layer `layer` from a checkpoint folder or a GGUF file\n"
      "(memory-mapped; experts used in place where the layout allows). `config` overrides the\n"
      "parsed config (load_config; say, after changing router knobs). Raises IndexError for a layer outside the\n"
      "model, ValueError for a dense layer, RuntimeError naming the file and tensor otherwise.");
  m.def(
      "inspect",
      [](const std::string& path, std::int64_t layer) {
        nb::gil_scoped_release release;
        return inspect_report(path, layer);
      },
      "path"_a, "layer"_a = -1, "The report `moekit inspect` prints for a checkpoint folder (-1: first MoE layer).");
}

}  // namespace

void bind_core(nb::module_& m) {
  bind_enums(m);
  bind_configs(m);
  bind_routing(m);
  bind_runtime(m);
  bind_layer(m);
  bind_loading(m);
}

}  // namespace moekit::py

NB_MODULE(_moekit, m) {
  m.doc() = "moekit's C++ core: exact MoE blocks of every family (see the moekit package).";
  // Objects still referenced when the interpreter exits (a torch autograd graph held by a global
  // keeps its moekit block alive) are not leaks of a running program; nanobind's report of them
  // at exit only confuses. MOEKIT_LEAK_WARNINGS=1 turns it back on.
  nanobind::set_leak_warnings(std::getenv("MOEKIT_LEAK_WARNINGS") != nullptr);
  moekit::py::bind_core(m);
  moekit::py::bind_training(m);
  moekit::py::bind_lm(m);
  moekit::py::bind_experts(m);
  moekit::py::bind_serving(m);
  moekit::py::bind_model(m);
}
