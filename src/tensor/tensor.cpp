#include "moekit/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>

#include "util/error.hpp"

namespace moekit {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::u8:
    case DType::f8_e4m3:
    case DType::f8_e8m0:
      return 1;
  }
  return 1;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::u8:
      return "u8";
    case DType::u32:
      return "u32";
    case DType::f8_e4m3:
      return "f8_e4m3";
    case DType::f8_e8m0:
      return "f8_e8m0";
  }
  return "?";
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument(MOEKIT_MSG("[moekit::shape] negative dimension in " << shape_str(shape)));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::shape] element count overflows in " << shape_str(shape)));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << (shape.size() == 1 ? ",)" : ")");
  return os.str();
}

// bf16 is the top half of an f32; round to nearest even on the dropped 16 bits.
std::uint16_t f32_to_bf16(float value) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const std::uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(bits >> 16);
}

float bf16_to_f32(std::uint16_t bits) noexcept {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, 4);
  return out;
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
std::uint16_t f32_to_f16(float value) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &value, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value = m * 2^-24. Shift with round to nearest even.
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half of 2^-24
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14 + (113 - exp) - 1 ... yields m in [0, 1024]
    const std::uint32_t half_mant = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    std::uint32_t r = half_mant;
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits to nearest even.
  std::uint32_t h = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}

float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// ---------------------------------------------------------------------------------------------

TensorView::TensorView(void* data, Shape shape, DType dtype)
    : data_(data), shape_(std::move(shape)), dtype_(dtype), numel_(shape_numel(shape_)), defined_(true) {}

std::int64_t TensorView::dim(int i) const noexcept {
  const int r = rank();
  return shape_[static_cast<std::size_t>(i < 0 ? i + r : i)];
}

std::int64_t TensorView::rows() const noexcept {
  if (shape_.size() <= 1) return 1;
  std::int64_t n = 1;
  for (std::size_t i = 0; i + 1 < shape_.size(); ++i) n *= shape_[i];
  return n;
}

TensorView TensorView::reshaped(Shape shape) const {
  const std::int64_t n = shape_numel(shape);
  if (n != numel_) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::TensorView::reshaped] cannot view " << shape_str(shape_) << " as "
                                                                                       << shape_str(shape)));
  }
  return TensorView(data_, std::move(shape), dtype_);
}

TensorView TensorView::slice_rows(std::int64_t begin, std::int64_t end) const {
  if (shape_.empty() || begin < 0 || end < begin || end > shape_[0]) {
    throw std::out_of_range(MOEKIT_MSG("[moekit::TensorView::slice_rows] rows [" << begin << ", " << end
                                                                              << ") of shape " << shape_str(shape_)));
  }
  Shape s = shape_;
  s[0] = end - begin;
  const std::int64_t row_elems = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  auto* base = static_cast<char*>(data_);
  return TensorView(base ? base + begin * row_elems * static_cast<std::int64_t>(dtype_size(dtype_)) : nullptr,
                    std::move(s), dtype_);
}

namespace {
std::shared_ptr<void> allocate(std::size_t bytes, bool zero) {
  const std::size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (zero) std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
}  // namespace

Tensor::Tensor(Shape shape, DType dtype) {
  const std::int64_t n = shape_numel(shape);
  storage_ = allocate(static_cast<std::size_t>(n) * dtype_size(dtype), true);
  view_ = TensorView(storage_.get(), std::move(shape), dtype);
}

Tensor Tensor::uninitialized(Shape shape, DType dtype) {
  Tensor t;
  const std::int64_t n = shape_numel(shape);
  t.storage_ = allocate(static_cast<std::size_t>(n) * dtype_size(dtype), false);
  t.view_ = TensorView(t.storage_.get(), std::move(shape), dtype);
  return t;
}

Tensor Tensor::from_f32(Shape shape, const std::vector<float>& values) {
  Tensor t(std::move(shape), DType::f32);
  if (static_cast<std::int64_t>(values.size()) != t.numel()) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Tensor::from_f32] " << values.size() << " values for shape "
                                                                        << shape_str(t.shape())));
  }
  std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i32(Shape shape, const std::vector<std::int32_t>& values) {
  Tensor t(std::move(shape), DType::i32);
  if (static_cast<std::int64_t>(values.size()) != t.numel()) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Tensor::from_i32] " << values.size() << " values for shape "
                                                                        << shape_str(t.shape())));
  }
  std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape(), dtype());
  if (nbytes() != 0) std::memcpy(t.data(), data(), nbytes());
  return t;
}

void Tensor::reshape(Shape shape) { view_ = view_.reshaped(std::move(shape)); }

namespace {

// Element i of a float array that may be unaligned for its dtype: views of a mapped
// safetensors file are (mlx's writer does not pad its header, so a bf16 bias can sit at an odd
// address), and a typed load there is undefined behaviour.
float load_float(const void* base, DType d, std::int64_t i) {
  const auto* bytes = static_cast<const unsigned char*>(base);
  if (d == DType::f8_e4m3) return e4m3_to_f32(bytes[i]);
  if (d == DType::f8_e8m0) return e8m0_to_f32(bytes[i]);
  if (d == DType::f32) {
    float v;
    std::memcpy(&v, bytes + 4 * i, 4);
    return v;
  }
  std::uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return d == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store_float(void* base, DType d, std::int64_t i, float v) {
  auto* bytes = static_cast<unsigned char*>(base);
  if (d == DType::f32) {
    std::memcpy(bytes + 4 * i, &v, 4);
    return;
  }
  const std::uint16_t h = d == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(bytes + 2 * i, &h, 2);
}
}  // namespace

void convert(const TensorView& src, const TensorView& dst) {
  if (src.numel() != dst.numel()) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::convert] element counts differ: src " << shape_str(src.shape())
                                                                                         << " dst " << shape_str(dst.shape())));
  }
  if (src.dtype() == dst.dtype()) {
    if (src.nbytes() != 0 && src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  if (!(is_float(src.dtype()) || is_f8(src.dtype())) || !is_float(dst.dtype())) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::convert] unsupported conversion " << dtype_name(src.dtype()) << " -> "
                                                                                     << dtype_name(dst.dtype())));
  }
  for (std::int64_t i = 0; i < src.numel(); ++i) store_float(dst.data(), dst.dtype(), i, load_float(src.data(), src.dtype(), i));
}

Tensor to_dtype(const TensorView& src, DType dtype) {
  Tensor out(src.shape(), dtype);
  convert(src, out.view());
  return out;
}

}  // namespace moekit
