// The two halves of one expert's body over r rows, shared by the grouped forward
// (grouped.cpp) and the backward (train layer), so a backward that recomputes the
// pre-activations gets the forward's bits. Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gemm.hpp"
#include "moekit/experts.hpp"

namespace moekit {

/// gate [r, F] = xin · Wg_eᵀ (+ bg_e) (skipped for plain-MLP bodies; gate may then be null) and
/// up [r, F] = xin · Wu_eᵀ (+ bu_e). `split`: each GEMM spread over the pool.
/// The projections run in `mode`.
void expert_pre_activations(const ExpertWeights& w, std::int64_t e, const kernels::RowSource& xin, std::int64_t r,
                            float* gate, float* up, bool split, ComputeMode mode);

/// out [r, D] (+)= (h · Wd_eᵀ (+ bd_e)) · out_scale[row] (out_scale may be null).
void expert_down(const ExpertWeights& w, std::int64_t e, const float* h, std::int64_t r, float* out,
                 const float* out_scale, bool split, bool accumulate, ComputeMode mode);

/// One task of the grouped experts: `count` (1..kTaskRows) rows of `expert` from sorted row
/// `begin`. run_sorted_rows cuts each expert's rows into such tasks, in expert order, and runs
/// them on the pool's dynamic schedule (moekit bench --simulate-threads replays the same cut).
struct ExpertTask {
  std::int64_t expert, begin, count;
};
constexpr std::int64_t kTaskRows = 64;
/// The tasks of rows grouped by expert: rows [offsets[e], offsets[e + 1]) are expert e's.
std::vector<ExpertTask> expert_tasks(const std::vector<std::int64_t>& offsets);
/// Whether run_sorted_rows runs its `tasks` one after another, each GEMM split over the pool's
/// `threads` (fewer tasks than threads: decode with few experts), rather than the tasks side by
/// side, one per thread.
inline bool split_gemms(std::int64_t tasks, std::int64_t threads) { return tasks < threads; }

/// The routed rows of one batch, grouped by expert: rows [offsets[e], offsets[e + 1]) go to
/// expert e of `w`; row i reads row src[i] of x ([*, D] f32, in place) with slot weight
/// weight[i] (on the input, or in the down projection's epilogue); out [rows, D] receives the
/// weighted expert outputs in the same order. Tasks of (expert, up to 64 of its rows), as
/// run_experts: a row's bits depend only on its expert's rows, in their order — so a caller
/// that hands an expert the same rows in the same order (expert parallelism) gets the same
/// bits. keep_gate / keep_up, when set, receive the [rows, F] pre-activations. The projections
/// run in `mode`.
void run_sorted_rows(const ExpertWeights& w, const ExpertBody& body, const float* x, const std::int32_t* src,
                     const float* weight, bool weight_on_input, const std::vector<std::int64_t>& offsets, float* out,
                     float* keep_gate, float* keep_up, ComputeMode mode);

/// The combine: y[t] (+)= Σ_k rows[position[t·K + k]] over k = 0..K−1 in slot order, in fp32
/// from +0 (or from y with `accumulate`). rows [*, D]; y [T, D].
void combine_rows(const float* rows, const std::int64_t* position, std::int64_t T, std::int64_t K, std::int64_t D,
                  float* y, bool accumulate);

}  // namespace moekit
