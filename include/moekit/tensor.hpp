// Tensor and TensorView: contiguous row-major arrays with a shape and a dtype.
// Not a general array library: just enough to carry activations, weights and routing results
// across moekit's API without copies.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace moekit {

/// Element types moekit stores. f32 is the compute type; bf16/f16 are storage types;
/// i32 carries expert ids; u8 carries raw bytes (npy files); u32 carries packed quantized codes
/// (MLX affine weights, docs/formats.md); f8_e4m3 (OCP E4M3FN: bias 7, no infinities, max 448)
/// and f8_e8m0 (a power of two 2^(e − 127), 0xFF NaN) are the 8-bit elements and scales of the
/// FP8 and microscaling formats, read (widened exactly to f32), never computed in.
enum class DType : std::uint8_t { f32, bf16, f16, i32, u8, u32, f8_e4m3, f8_e8m0 };

/// Bytes per element.
std::size_t dtype_size(DType dtype) noexcept;
/// Lower-case name ("f32", "bf16", ...).
const char* dtype_name(DType dtype) noexcept;
/// Whether `dtype` is a float format moekit stores values in (f32, bf16, f16).
constexpr bool is_float(DType dtype) noexcept {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

/// A shape, outermost dimension first.
using Shape = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for rank 0). Throws std::invalid_argument on a negative
/// dimension or on overflow of int64.
std::int64_t shape_numel(const Shape& shape);
/// "(2, 3, 4)" — used in error messages.
std::string shape_str(const Shape& shape);

// --- scalar conversions (round to nearest even; NaN stays NaN, Inf stays Inf) ---
std::uint16_t f32_to_bf16(float value) noexcept;
float bf16_to_f32(std::uint16_t bits) noexcept;
std::uint16_t f32_to_f16(float value) noexcept;
float f16_to_f32(std::uint16_t bits) noexcept;
/// Exact widenings of the 8-bit float encodings (every value is an f32). Inline: the kernels
/// widen a scale per group inside their loops, where a call would spill the accumulators.
inline float e8m0_to_f32(std::uint8_t bits) noexcept {
  // 2^(e − 127): e = 0 is 2^-127, an f32 subnormal (mantissa bit 22); 0xFF is NaN.
  const std::uint32_t f = bits == 0 ? 0x00400000u : bits == 0xFFu ? 0x7FC00000u : std::uint32_t{bits} << 23;
  return std::bit_cast<float>(f);
}
inline float e4m3_to_f32(std::uint8_t bits) noexcept {
  const std::uint32_t e = (bits >> 3) & 0xFu, m = bits & 0x7u;
  float v;
  if (e == 0xFu && m == 0x7u) {
    v = std::bit_cast<float>(0x7FC00000u);  // E4M3FN's only NaN (either sign)
  } else if (e == 0) {
    v = static_cast<float>(m) * 0x1p-9f;  // subnormal m · 2^-9, exact
  } else {
    v = std::bit_cast<float>(((e + 120u) << 23) | (m << 20));  // (1 + m/8) · 2^(e − 7), rebiased
  }
  return (bits & 0x80u) ? -v : v;
}
/// Whether `dtype` is one of the 8-bit float encodings (read, widened to f32; never written).
constexpr bool is_f8(DType dtype) noexcept { return dtype == DType::f8_e4m3 || dtype == DType::f8_e8m0; }

/// A non-owning view of contiguous row-major memory. Cheap to copy. A default-constructed view
/// is empty (`data() == nullptr`, `defined() == false`).
class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, Shape shape, DType dtype);
  TensorView(const void* data, Shape shape, DType dtype)
      : TensorView(const_cast<void*>(data), std::move(shape), dtype) {}

  bool defined() const noexcept { return defined_; }
  void* data() const noexcept { return data_; }
  template <typename T>
  T* data_as() const noexcept { return static_cast<T*>(data_); }
  const Shape& shape() const noexcept { return shape_; }
  DType dtype() const noexcept { return dtype_; }
  int rank() const noexcept { return static_cast<int>(shape_.size()); }
  /// Dimension i; negative i counts from the end. Precondition: -rank <= i < rank.
  std::int64_t dim(int i) const noexcept;
  std::int64_t numel() const noexcept { return numel_; }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  /// Product of all dimensions but the last ("rows"); 1 for rank 0 or 1.
  std::int64_t rows() const noexcept;
  /// The same memory under another shape with the same element count.
  /// Throws std::invalid_argument if the counts differ.
  TensorView reshaped(Shape shape) const;
  /// Rows [begin, end) of the outermost dimension. Throws std::out_of_range.
  TensorView slice_rows(std::int64_t begin, std::int64_t end) const;

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  std::int64_t numel_ = 0;
  bool defined_ = false;
};

/// An owning, 64-byte aligned, zero-initialised contiguous array. Copies share the storage
/// (like a shared_ptr); clone() makes a deep copy.
class Tensor {
 public:
  Tensor() = default;
  /// Allocates zeroed storage. Throws std::invalid_argument for a negative dimension,
  /// std::bad_alloc when memory runs out.
  Tensor(Shape shape, DType dtype);

  /// Allocates without zeroing, for outputs that are written in full before they are read.
  static Tensor uninitialized(Shape shape, DType dtype);
  static Tensor from_f32(Shape shape, const std::vector<float>& values);
  static Tensor from_i32(Shape shape, const std::vector<std::int32_t>& values);

  TensorView view() const noexcept { return view_; }
  operator TensorView() const noexcept { return view_; }  // NOLINT: views are the currency
  void* data() const noexcept { return view_.data(); }
  template <typename T>
  T* data_as() const noexcept { return view_.data_as<T>(); }
  const Shape& shape() const noexcept { return view_.shape(); }
  DType dtype() const noexcept { return view_.dtype(); }
  int rank() const noexcept { return view_.rank(); }
  std::int64_t dim(int i) const noexcept { return view_.dim(i); }
  std::int64_t numel() const noexcept { return view_.numel(); }
  std::size_t nbytes() const noexcept { return view_.nbytes(); }
  /// Deep copy.
  Tensor clone() const;
  /// Changes the shape in place (same element count). Throws std::invalid_argument.
  void reshape(Shape shape);

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

/// Converts `src` into `dst` elementwise (any float dtype to any float dtype, i32<->i32,
/// u8<->u8). Shapes must have equal element counts. Throws std::invalid_argument.
void convert(const TensorView& src, const TensorView& dst);
/// A new tensor holding `src` converted to `dtype`.
Tensor to_dtype(const TensorView& src, DType dtype);

}  // namespace moekit
