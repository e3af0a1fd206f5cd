// An ExpertMatrix's expert e as the kernel layer's WeightMatrix (float rows or panels, or MLX
// affine codes with their scales and biases). Internal.
#pragma once

#include "kernels/gemm.hpp"
#include "moekit/experts.hpp"

namespace moekit {

inline kernels::WeightMatrix weight_matrix(const ExpertMatrix& m, std::int64_t e) {
  kernels::WeightMatrix w{m.experts[e], m.dtype, m.row_stride,
                          m.panels ? kernels::WeightLayout::panels : kernels::WeightLayout::rows};
  if (m.quantized())
    w.affine = {m.affine.bits, m.affine.group_size, m.affine.scale_dtype, m.affine.scales[e], m.affine.biases[e],
                m.affine.scale_stride};
  return w;
}

}  // namespace moekit
