// The parts of the Python module (module.cpp, train.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <shared_mutex>

#include <cstdint>

#include "moekit/layer.hpp"
#include "moekit/train.hpp"

namespace moekit::py {

namespace nb = nanobind;

/// Computations hold it shared (with the GIL released); set_num_threads and the layer's
/// non-thread-safe mutators (pack_weights, set_int8_activations) hold it exclusively, so a
/// Python thread can never run them under another's forward.
std::shared_mutex& compute_mutex();

/// MoeLayer.forward (also used by the trainable layer).
nb::object layer_forward(const MoeLayer& layer, nb::handle x, bool return_routing);

/// What a training forward keeps (Python's SavedForward), tagged with the block it came from.
struct Saved {
  SavedForward saved;
  std::uint64_t owner = 0;  ///< owner_tag of the block that made it
  std::int64_t num_experts = 0;
};

/// The tag of a loaded MoeLayer (its address, high bit set: never a TrainableMoe's counter id).
inline std::uint64_t owner_tag(const MoeLayer& layer) {
  return reinterpret_cast<std::uintptr_t>(&layer) | (std::uint64_t{1} << 63);
}

/// MoeLayer.forward_train / MoeLayer.backward (train.cpp): `layer` computes, `tag` names it.
nb::tuple forward_train_tagged(const MoeLayer& layer, std::uint64_t tag, nb::handle x, bool keep_pre_activations);
nb::tuple backward_tagged(const MoeLayer& layer, std::uint64_t tag, const Saved& s, nb::handle dy,
                          nb::handle extra_dlogits);

/// {'max_violation', 'dead_experts', 'entropy', 'tokens'} of one set of counts (every Python
/// report of a load: load_metrics, BalanceUpdate.as_dict, LmTrainer's per-layer loads).
inline nb::dict load_dict(const LoadMetrics& l) {
  nb::dict d;
  d["max_violation"] = l.max_violation;
  d["dead_experts"] = l.dead_experts;
  d["entropy"] = l.entropy;
  d["tokens"] = l.tokens;
  return d;
}

void bind_core(nb::module_& m);
void bind_training(nb::module_& m);
void bind_lm(nb::module_& m);
void bind_experts(nb::module_& m);
void bind_model(nb::module_& m);
/// moekit.Sequence, Sampler, TextStream: the parts a server batches with (model.cpp).
void bind_serving(nb::module_& m);

}  // namespace moekit::py
