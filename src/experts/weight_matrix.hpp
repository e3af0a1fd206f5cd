// An ExpertMatrix's expert e as the kernel layer's WeightMatrix: the same format descriptor, the
// expert's pointers. Internal.
#pragma once

#include "kernels/gemm.hpp"
#include "moekit/experts.hpp"

namespace moekit {

inline kernels::WeightLayout layout(MatrixLayout l) {
  switch (l) {
    case MatrixLayout::panels: return kernels::WeightLayout::panels;
    case MatrixLayout::amx_tiles: return kernels::WeightLayout::amx_tiles;
    case MatrixLayout::rows: break;
  }
  return kernels::WeightLayout::rows;
}

inline kernels::WeightMatrix weight_matrix(const ExpertMatrix& m, std::int64_t e) {
  kernels::WeightMatrix w{m.experts[e], m.dtype, m.row_stride, layout(m.layout), m.format};
  if (m.quantized()) {
    const auto i = static_cast<std::size_t>(e);
    w.scales = m.scales.empty() ? nullptr : m.scales[i];  // (ggml blocks carry their scales)
    w.biases = m.biases.empty() ? nullptr : m.biases[i];
    w.scale_ld = m.scale_stride;
  }
  return w;
}

}  // namespace moekit
