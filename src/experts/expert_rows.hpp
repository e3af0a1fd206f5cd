// The two halves of one expert's body over r rows, shared by the grouped forward
// (grouped.cpp) and the backward (train layer), so a backward that recomputes the
// pre-activations gets the forward's bits. Internal.
#pragma once

#include <cstdint>

#include "kernels/gemm.hpp"
#include "moekit/experts.hpp"

namespace moekit {

/// gate [r, F] = xin · Wg_eᵀ (+ bg_e) (skipped for plain-MLP bodies; gate may then be null) and
/// up [r, F] = xin · Wu_eᵀ (+ bu_e). `split`: each GEMM spread over the pool.
void expert_pre_activations(const ExpertWeights& w, std::int64_t e, const kernels::RowSource& xin, std::int64_t r,
                            float* gate, float* up, bool split);

/// out [r, D] (+)= (h · Wd_eᵀ (+ bd_e)) · out_scale[row] (out_scale may be null).
void expert_down(const ExpertWeights& w, std::int64_t e, const float* h, std::int64_t r, float* out,
                 const float* out_scale, bool split, bool accumulate);

}  // namespace moekit
