#include "kernels/formats/table.hpp"

#include <stdexcept>

#include "kernels/formats/affine.hpp"
#include "kernels/formats/e2m1.hpp"
#include "kernels/formats/e4m3.hpp"
#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/int4.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats {

bool known(Element element) noexcept {
  switch (element) {
#define MOEKIT_FORMAT_KNOWN(f) \
  case Element::f:             \
    return true;
    MOEKIT_QUANTIZED_FORMATS(MOEKIT_FORMAT_KNOWN)
#undef MOEKIT_FORMAT_KNOWN
    case Element::plain:
      break;
  }
  return false;
}

const FormatTraits& traits(Element element) {
  switch (element) {
#define MOEKIT_FORMAT_TRAITS(f) \
  case Element::f:              \
    return f::kTraits;
    MOEKIT_QUANTIZED_FORMATS(MOEKIT_FORMAT_TRAITS)
#undef MOEKIT_FORMAT_TRAITS
    case Element::plain:
      break;
  }
  throw std::invalid_argument(
      MOEKIT_MSG("[moekit::formats] element " << static_cast<int>(element) << " is not a quantized weight format"));
}

bool inline_scales(const WeightFormat& f) { return f.quantized() && traits(f.element).inline_scales; }

bool ggml_int8(Element element) noexcept {
  switch (element) {
#define MOEKIT_GGML_INT8(f) \
  case Element::f:          \
    return f::Type::kInt8;
    MOEKIT_GGML_FORMATS(MOEKIT_GGML_INT8)
#undef MOEKIT_GGML_INT8
    default:
      return false;
  }
}

Element gguf_element(std::uint32_t gguf_id) noexcept {
#define MOEKIT_GGUF_ELEMENT(f) \
  if (f::Type::kGgufId == gguf_id) return Element::f;
  MOEKIT_GGML_FORMATS(MOEKIT_GGUF_ELEMENT)
#undef MOEKIT_GGUF_ELEMENT
  return Element::plain;
}

DType container_dtype(const WeightFormat& f, DType plain) {
  return f.quantized() ? traits(f.element).container : plain;
}

std::size_t matrix_bytes(const WeightFormat& f, DType dtype, std::int64_t rows, std::int64_t cols) {
  if (!f.quantized()) return static_cast<std::size_t>(rows * cols) * dtype_size(dtype);
  const FormatTraits& t = traits(f.element);
  const std::int64_t stored = rows * t.row_elements(f, cols) * static_cast<std::int64_t>(dtype_size(t.container));
  const std::int64_t scales = scale_rows(f, rows) * scale_cols(f, cols) * (f.has_bias ? 2 : 1) *
                              static_cast<std::int64_t>(dtype_size(f.scale_dtype));
  return static_cast<std::size_t>(stored + scales);
}

std::string describe(const WeightFormat& f, DType dtype) {
  return f.quantized() ? traits(f.element).describe(f) : dtype_name(dtype);
}

float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  if (B.quantized()) return traits(B.format.element).decode(B, n, k);
  return load_f32(B.data, B.dtype, n * B.ld + k);
}

}  // namespace moekit::kernels::formats

namespace moekit {

WeightFormat WeightFormat::ggml(Element element) {
  const kernels::formats::FormatTraits::GgufBlock g = kernels::formats::known(element)
                                                          ? kernels::formats::traits(element).gguf
                                                          : kernels::formats::FormatTraits::GgufBlock{};
  return {element, g.bits, 1, g.weights, element == Element::ggml_mxfp4 ? DType::f8_e8m0 : DType::f16, false};
}

}  // namespace moekit
