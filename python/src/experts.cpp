// A framework's expert parameters run by moekit in place: the routed experts alone on the caller's
// routing (moekit.transformers, the experts backend for transformers' ExpertsInterface), forward
// and backward. The projections come in as strided 3-D views [E, out, in] of the framework's own
// tensors (a concatenated or interleaved gate/up half is a view with a row step), read without a
// copy; biases are small and copied to f32 on each call, so an optimizer's in-place update of any
// parameter is what the next call computes with.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
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

BodyKind parse_body(const std::string& name) {
  static const std::pair<const char*, BodyKind> kinds[] = {
      {"swiglu", BodyKind::swiglu},     {"swiglu_clamped", BodyKind::swiglu_clamped},
      {"geglu", BodyKind::geglu},       {"geglu_tanh", BodyKind::geglu_tanh},
      {"mlp_relu", BodyKind::mlp_relu}, {"mlp_relu2", BodyKind::mlp_relu2},
      {"mlp_silu", BodyKind::mlp_silu},
  };
  std::string known;
  for (const auto& [n, k] : kinds) {
    if (name == n) return k;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument("[moekit.Experts] unknown body '" + name + "' (known: " + known + ")");
}

/// The routed experts of a framework's module, viewed in place. Holds the imported arrays.
struct Experts {
  ExpertWeights w;
  ExpertBody body;
  ComputeMode mode = ComputeMode::exact;  // bf16 with bf16_compute
  std::vector<nb::ndarray<nb::ro>> held;

  // One projection: a 3-D [E, rows, cols] array whose rows are contiguous (last stride 1), any
  // row and expert strides (a half or an interleaved part of a fused tensor).
  ExpertMatrix matrix(nb::handle obj, const char* what) {
    DType dtype = DType::f32;
    Framework framework;
    const nb::ndarray<nb::ro> a = checked_array(obj, what, dtype, framework);
    if (dtype == DType::i32)
      throw std::invalid_argument(std::string("[moekit.Experts] ") + what + " must be float32, bfloat16 or float16");
    if (a.ndim() != 3)
      throw std::invalid_argument(std::string("[moekit.Experts] ") + what + " must be 3-D [E, out, in], got " +
                                  std::to_string(a.ndim()) + "-D");
    const std::int64_t E = static_cast<std::int64_t>(a.shape(0)), rows = static_cast<std::int64_t>(a.shape(1)),
                       cols = static_cast<std::int64_t>(a.shape(2));
    const std::int64_t* st = a.stride_ptr();
    const std::int64_t s0 = st ? st[0] : rows * cols, s1 = st ? st[1] : cols, s2 = st ? st[2] : 1;
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(dtype));
    if (s2 != 1 || s1 < cols || s0 < 0 ||
        reinterpret_cast<std::uintptr_t>(a.data()) % static_cast<std::uintptr_t>(elem) != 0)
      throw std::invalid_argument(std::string("[moekit.Experts] ") + what +
                                  " must have contiguous rows (last stride 1, row stride >= columns)");
    ExpertMatrix m;
    m.dtype = dtype;
    m.rows = rows;
    m.cols = cols;
    m.row_stride = s1;
    const auto* base = static_cast<const unsigned char*>(a.data());
    for (std::int64_t e = 0; e < E; ++e) m.experts.push_back(base + e * s0 * elem);
    held.push_back(a);
    return m;
  }

  static Tensor bias(nb::handle obj, const char* what) {
    if (obj.is_none()) return {};
    const InputArray in = import_array(obj, what);
    return to_dtype(in.view, DType::f32);
  }
};

/// What forward_train keeps for backward: x (f32), the routing and the experts' trace.
struct ExpertsSaved {
  Tensor x, ids, weights;
  ExpertTrace trace;
  bool weight_on_input = false;
  const Experts* owner = nullptr;
};

Tensor f32_rows(const InputArray& in, const char* what, std::int64_t D) {
  if (in.view.rank() != 2 || in.view.dim(1) != D)
    throw std::invalid_argument(std::string("[moekit.Experts] ") + what + " must be [T, " + std::to_string(D) +
                                "], got " + shape_str(in.view.shape()));
  return in.view.dtype() == DType::f32 ? Tensor() : to_dtype(in.view, DType::f32);
}

// Runs the experts; with `saved`, keeps what backward needs. Returns y [T, D] f32.
Tensor run(const Experts& ex, nb::handle x_obj, nb::handle ids_obj, nb::handle w_obj, bool weight_on_input,
           ExpertsSaved* saved, Framework& fw) {
  const std::int64_t D = ex.w.hidden_size();
  const InputArray x = import_array(x_obj, "x");
  const InputArray ids = import_array(ids_obj, "ids");
  const InputArray wts = import_array(w_obj, "weights");
  fw = x.framework;
  Tensor x_own = f32_rows(x, "x", D);
  const TensorView xv = x_own.numel() > 0 ? x_own.view() : x.view;
  Tensor w_own;
  TensorView wv = wts.view;
  if (wv.dtype() != DType::f32) {
    w_own = to_dtype(wv, DType::f32);
    wv = w_own.view();
  }
  const std::int64_t T = xv.dim(0);
  Tensor y = Tensor::uninitialized({T, D}, DType::f32);
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    if (saved) {
      saved->trace = ExpertTrace{};
      run_experts(ex.w, ex.body, xv, ids.view, wv, weight_on_input, y.view(), false, &saved->trace, ex.mode);
      saved->x = x_own.numel() > 0 ? std::move(x_own) : to_dtype(xv, DType::f32);
      saved->ids = to_dtype(ids.view, DType::i32);
      saved->weights = w_own.numel() > 0 ? std::move(w_own) : to_dtype(wv, DType::f32);
      saved->weight_on_input = weight_on_input;
      saved->owner = &ex;
    } else {
      run_experts(ex.w, ex.body, xv, ids.view, wv, weight_on_input, y.view(), false, nullptr, ex.mode);
    }
  }
  return y;
}

}  // namespace

void bind_experts(nb::module_& m) {
  nb::class_<ExpertsSaved>(m, "ExpertsSaved", "What Experts.forward_train keeps for Experts.backward (opaque).");

  nb::class_<Experts>(m, "Experts",
                      "The routed experts of a framework's module, read in place (moekit.transformers):\n"
                      "projections as strided [E, out, in] views, run on the caller's routing.")
      .def(
          "__init__",
          [](Experts* self, const std::string& body, nb::handle gate, nb::handle up, nb::handle down,
             nb::handle gate_bias, nb::handle up_bias, nb::handle down_bias, float swiglu_limit, float swiglu_alpha,
             bool bf16_compute) {
            auto* ex = new (self) Experts();
            ex->body = {parse_body(body), swiglu_limit, swiglu_alpha};
            if (is_gated(ex->body.kind)) {
              if (gate.is_none())
                throw std::invalid_argument("[moekit.Experts] body '" + body + "' needs a gate projection");
              ex->w.gate = ex->matrix(gate, "gate");
            } else if (!gate.is_none()) {
              throw std::invalid_argument("[moekit.Experts] body '" + body + "' has no gate projection");
            }
            ex->w.up = ex->matrix(up, "up");
            ex->w.down = ex->matrix(down, "down");
            ex->w.gate_bias = Experts::bias(gate_bias, "gate_bias");
            ex->w.up_bias = Experts::bias(up_bias, "up_bias");
            ex->w.down_bias = Experts::bias(down_bias, "down_bias");
            const ExpertWeights& w = ex->w;
            validate_experts(w, ex->body, w.hidden_size(), "experts");
            if (bf16_compute) {
              validate_bf16_activations(ex->w, "experts");
              ex->mode = ComputeMode::bf16;
            }
          },
          "body"_a, "gate"_a.none(), "up"_a, "down"_a, "gate_bias"_a.none() = nb::none(),
          "up_bias"_a.none() = nb::none(), "down_bias"_a.none() = nb::none(), "swiglu_limit"_a = 7.0f,
          "swiglu_alpha"_a = 1.702f, "bf16_compute"_a = false,
          "body: swiglu, swiglu_clamped, geglu, geglu_tanh, mlp_relu, mlp_relu2 or mlp_silu. gate/up [E, F, D]\n"
          "(gate None for the plain-MLP bodies) and down [E, D, F]: float32, bfloat16 or float16 arrays with\n"
          "contiguous rows, read in place; biases [E, F] / [E, D] copied to f32. bf16_compute: the bf16\n"
          "compute mode (bf16 weights; MoeLayer.set_bf16_activations).")
      .def_prop_ro("num_experts", [](const Experts& e) { return e.w.num_experts(); })
      .def_prop_ro("hidden_size", [](const Experts& e) { return e.w.hidden_size(); })
      .def_prop_ro("width", [](const Experts& e) { return e.w.width(); })
      .def(
          "forward",
          [](const Experts& ex, nb::handle x, nb::handle ids, nb::handle weights, bool weight_on_input) {
            Framework fw;
            Tensor y = run(ex, x, ids, weights, weight_on_input, nullptr, fw);
            return export_tensor(std::move(y), fw);
          },
          "x"_a, "ids"_a, "weights"_a, "weight_on_input"_a = false,
          "y [T, D] f32 = Σ_k weights[t, k] · expert_{ids[t, k]}(x[t]). x [T, D] float32 or bfloat16, ids [T, K]\n"
          "int32, weights [T, K] float32 (or bfloat16).")
      .def(
          "forward_train",
          [](const Experts& ex, nb::handle x, nb::handle ids, nb::handle weights, bool weight_on_input) {
            Framework fw;
            auto saved = std::make_unique<ExpertsSaved>();
            Tensor y = run(ex, x, ids, weights, weight_on_input, saved.get(), fw);
            return nb::make_tuple(export_tensor(std::move(y), fw),
                                  nb::cast(saved.release(), nb::rv_policy::take_ownership));
          },
          "x"_a, "ids"_a, "weights"_a, "weight_on_input"_a = false,
          "forward() keeping what backward() needs: (y, saved).")
      .def(
          "backward",
          [](const Experts& ex, const ExpertsSaved& s, nb::handle dy, bool fuse_gate_up) {
            if (s.owner != &ex)
              throw std::invalid_argument("[moekit.Experts] saved comes from another Experts' forward_train");
            const InputArray d = import_array(dy, "dy");
            MoeTensors grads;
            Tensor dweights, dx;
            {
              nb::gil_scoped_release release;
              std::shared_lock lock(compute_mutex());
              ExpertGradOptions options;
              options.fuse_gate_up = fuse_gate_up;
              options.mode = ex.mode;
              dx = experts_backward(ex.w, ex.body, s.x.view(), s.ids.view(), s.weights.view(), s.weight_on_input,
                                    s.trace, d.view, grads, dweights, options);
            }
            nb::dict g;
            grads.for_each(
                [&](const std::string& name, const Tensor& v) { g[name.c_str()] = export_tensor(v, d.framework); });
            return nb::make_tuple(export_tensor(std::move(dx), d.framework),
                                  export_tensor(std::move(dweights), d.framework), g);
          },
          "saved"_a, "dy"_a, "fuse_gate_up"_a = false,
          "(dx [T, D] f32, dweights [T, K] f32, {'experts.gate': [E, F, D], 'experts.up', 'experts.down',\n"
          "biases}) for dL/dy = dy (float32 or bfloat16 [T, D]). fuse_gate_up: 'experts.gate' is the fused\n"
          "gate‖up gradient [E, 2F, D] (gate rows, then up rows; 'experts.gate_bias' [E, 2F]), no 'experts.up'.");
}

}  // namespace moekit::py
