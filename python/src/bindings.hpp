// The parts of the Python module (module.cpp, train.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <shared_mutex>

#include "moekit/layer.hpp"

namespace moekit::py {

namespace nb = nanobind;

/// Computations hold it shared (with the GIL released); set_num_threads and the layer's
/// non-thread-safe mutators (pack_weights, set_int8_activations) hold it exclusively, so a
/// Python thread can never run them under another's forward.
std::shared_mutex& compute_mutex();

/// MoeLayer.forward (also used by the trainable layer).
nb::object layer_forward(const MoeLayer& layer, nb::handle x, bool return_routing);

void bind_core(nb::module_& m);
void bind_training(nb::module_& m);

}  // namespace moekit::py
