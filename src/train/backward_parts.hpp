// The pieces of backward() (backward.cpp), shared with the expert-parallel backward (src/dist):
// the routed experts over expert-sorted rows, and the rest of the block (combine, router, shared
// experts). Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/train.hpp"

namespace moekit::detail {

/// Where one ExpertWeights' gradients go: the stacked grads, expert e at offset e · size.
struct GradSink {
  float* gate = nullptr;
  float* up = nullptr;
  float* down = nullptr;
  float* gate_bias = nullptr;
  float* up_bias = nullptr;
  float* down_bias = nullptr;
  /// Elements from one expert's gate (and up) gradient to the next's, and likewise for their
  /// bias gradients; 0: packed (F·D, F). A fused [E, 2F, D] gate‖up gradient has 2·F·D (2·F),
  /// with up = gate + F·D (gate_bias + F).
  std::int64_t matrix_stride = 0, bias_stride = 0;
};

/// Throws std::invalid_argument ("[moekit::<fn>] ...") if the experts `x` are quantized (no gradient
/// through them) or packed in AMX tiles (a forward-only layout).
void check_float_experts(const char* fn, const ExpertWeights& x);

/// Throws std::invalid_argument ("[moekit::<fn>] ...") if `layer` has quantized weights (no
/// gradient through them).
void check_float_weights(const char* fn, const MoeLayer& layer);

/// Checks dy (f32 or bf16, shaped `shape` = T rows of D) and options.extra_dlogits (f32 [T, E])
/// and returns dy as f32 — widened into `owned` for bf16 — after checking every element is
/// finite. Throws std::invalid_argument naming fn and what is wrong.
const float* checked_dy(const char* fn, const TensorView& dy, const Shape& shape, std::int64_t T, std::int64_t D,
                        std::int64_t E, const BackwardOptions& options, Tensor& owned);

/// Checks every gradient member `layer` has (router, experts, shared) against its f32 shape —
/// the experts' members for `num_experts` experts (E, or one rank's own) — allocating the empty
/// ones as zeros. Throws std::invalid_argument naming fn and the first bad member.
void check_grads(const char* fn, const MoeLayer& layer, std::int64_t num_experts, MoeTensors& g);

/// Where the routed experts' gradients in g go.
GradSink expert_sink(const MoeTensors& g);

/// The routed experts' backward over an expert-sorted batch of rows (run_sorted_rows' layout):
/// rows [offsets[e], offsets[e + 1]) are expert e's; row i read x and dy at row src[i] (both
/// [*, D]), slot weight slot_weight[i] (on the input when `woi`); pre_gate / pre_up [rows, F]
/// the forward's pre-activations, or null (recomputed). Writes pair_dx [rows, D] (dL/d input row)
/// and pair_dg [rows] (dL/d slot weight) in the same order, and each expert's weight gradients
/// into `sink` (experts with no rows are zeroed unless `accumulate`). An expert's rows run in
/// order in chunks of 256: its gradients depend only on its rows and their order. Recomputed
/// pre-activations run in `mode`, the forward's (so they are its bits).
void backward_sorted_rows(const ExpertWeights& w, const ExpertBody& body, const float* x, const std::int32_t* src,
                          const float* slot_weight, bool woi, const std::vector<std::int64_t>& offsets,
                          const float* pre_gate, const float* pre_up, const float* dy, float* pair_dx, float* pair_dg,
                          const GradSink& sink, bool accumulate, ComputeMode mode);

/// The combine's backward: dx [T, D] row t = Σ_k pair_dx[position[t·K + k]] (slot order), and
/// dweights [T, K] = pair_dg at the same positions.
void combine_backward(std::int64_t T, std::int64_t K, std::int64_t D, const float* pair_dx, const float* pair_dg,
                      const std::int64_t* position, float* dx, float* dweights);

/// The rest of the block's backward for T tokens: dx_t = Σ_k pair_dx[position[t·K + k]] (slot
/// order), dweights from pair_dg likewise, the router's backward (+ options.extra_dlogits) into
/// g.router (g.router_bias) and dx, the shared experts and gate into g.shared_* and dx. `saved`
/// supplies x, the logits, the routing and the shared trace (its routed trace is not read).
/// g's members must already have their shapes. Returns dx [T, D].
Tensor backward_tail(const MoeLayer& layer, const SavedForward& saved, const float* dy, const float* pair_dx,
                     const float* pair_dg, const std::int64_t* position, MoeTensors& g, bool accumulate,
                     const BackwardOptions& options);

}  // namespace moekit::detail
