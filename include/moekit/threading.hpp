// The one place that sets how many threads moekit uses. Results never depend on it: every
// parallel loop in moekit splits work so that each output element is computed by exactly one
// thread in a fixed order.
#pragma once

namespace moekit {

/// Sets the number of worker threads (>= 1) used by every moekit operation from now on.
/// 0 means "the number of hardware threads". Throws std::invalid_argument for n < 0.
/// Must not be called while another thread is inside a moekit operation.
void set_num_threads(int n);

/// The current thread count (defaults to the hardware thread count, or MOEKIT_NUM_THREADS).
int num_threads() noexcept;

}  // namespace moekit
