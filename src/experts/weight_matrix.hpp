// An ExpertMatrix's expert e as the kernel layer's WeightMatrix (float rows or panels, or MLX
// affine codes with their scales and biases). Internal.
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
  kernels::WeightMatrix w{m.experts[e], m.dtype, m.row_stride, layout(m.layout)};
  if (m.quantized()) {
    w.affine.bits = m.affine.bits;
    w.affine.group_size = m.affine.group_size;
    w.affine.scale_dtype = m.affine.scale_dtype;
    w.affine.scales = m.affine.scales[e];
    w.affine.biases = m.affine.biases[e];
    w.affine.scale_ld = m.affine.scale_stride;
    w.affine.int8_activations = m.affine.int8_activations;
  }
  return w;
}

}  // namespace moekit
