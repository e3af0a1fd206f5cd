#include "arrays.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace moekit::py {

namespace {

namespace dl = nb::dlpack;

dl::dtype to_dlpack(DType dtype, Framework framework) {
  switch (dtype) {
    case DType::f32: return nb::dtype<float>();
    case DType::f16: return dl::dtype{static_cast<std::uint8_t>(dl::dtype_code::Float), 16, 1};
    case DType::bf16:
      // numpy has no bfloat16: its arrays carry the raw bits as uint16.
      if (framework == Framework::numpy) return nb::dtype<std::uint16_t>();
      return dl::dtype{static_cast<std::uint8_t>(dl::dtype_code::Bfloat), 16, 1};
    case DType::i32: return nb::dtype<std::int32_t>();
    case DType::u8:
    case DType::f8_e4m3:  // raw bytes: numpy and DLPack consumers read the encoding from the name
    case DType::f8_e8m0:
      return nb::dtype<std::uint8_t>();
    case DType::u32: return nb::dtype<std::uint32_t>();
  }
  throw std::invalid_argument("[moekit] unknown dtype");
}

// The moekit dtype of an imported array, or a message naming what it is.
bool from_dlpack(dl::dtype d, DType& out, std::string& name) {
  const auto code = static_cast<dl::dtype_code>(d.code);
  name = "unknown";
  if (d.lanes != 1) {
    name = "vector of " + std::to_string(d.lanes) + " lanes";
    return false;
  }
  switch (code) {
    case dl::dtype_code::Float:
      name = "float" + std::to_string(d.bits);
      if (d.bits == 32) return out = DType::f32, true;
      if (d.bits == 16) return out = DType::f16, true;
      return false;
    case dl::dtype_code::Bfloat:
      name = "bfloat" + std::to_string(d.bits);
      if (d.bits == 16) return out = DType::bf16, true;
      return false;
    case dl::dtype_code::Int:
      name = "int" + std::to_string(d.bits);
      if (d.bits == 32) return out = DType::i32, true;
      return false;
    case dl::dtype_code::UInt: name = "uint" + std::to_string(d.bits); return false;
    case dl::dtype_code::Bool: name = "bool"; return false;
    case dl::dtype_code::Complex: name = "complex" + std::to_string(d.bits); return false;
    default: return false;
  }
}

template <class Fw>
nb::object make_array(void* data, std::size_t ndim, const std::size_t* shape, nb::handle owner,
                      const std::int64_t* strides, dl::dtype dtype, bool writable) {
  if (writable)
    return nb::cast(nb::ndarray<Fw>(data, ndim, shape, owner, strides, dtype, nb::device::cpu::value));
  return nb::cast(nb::ndarray<Fw, nb::ro>(data, ndim, shape, owner, strides, dtype, nb::device::cpu::value));
}

}  // namespace

const char* python_dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::u8: return "uint8";
    case DType::u32: return "uint32";
    case DType::f8_e4m3:
      return "float8_e4m3fn";
    case DType::f8_e8m0:
      return "float8_e8m0fnu";
  }
  return "unknown";
}

Framework framework_of(nb::handle obj) {
  nb::handle type = obj.type();
  // Walk the MRO so subclasses (torch.nn.Parameter) count as their framework's arrays.
  for (nb::handle base : nb::borrow<nb::tuple>(type.attr("__mro__"))) {
    nb::object mod = nb::getattr(base, "__module__", nb::none());
    if (!nb::isinstance<nb::str>(mod)) continue;
    const std::string m = nb::cast<std::string>(mod);
    if (m == "torch" || m.rfind("torch.", 0) == 0) return Framework::torch;
  }
  return Framework::numpy;
}

nb::ndarray<nb::ro> checked_array(nb::handle obj, const char* what, DType& dtype, Framework& framework) {
  framework = framework_of(obj);
  if (framework == Framework::torch && nb::cast<bool>(nb::getattr(obj, "requires_grad", nb::bool_(false))))
    throw std::invalid_argument(std::string("[moekit] ") + what +
                                " is a torch tensor that requires grad: pass it .detach()ed, or train through "
                                "moekit.torch.MoE");
  nb::ndarray<nb::ro> arr;
  if (!nb::try_cast(obj, arr, /*convert=*/false))
    throw nb::type_error((std::string("[moekit] ") + what +
                          " must be a numpy array or a DLPack tensor (torch.Tensor, ...), got " +
                          nb::cast<std::string>(nb::str(obj.type().attr("__name__"))))
                             .c_str());
  if (arr.device_type() != nb::device::cpu::value)
    throw std::invalid_argument(std::string("[moekit] ") + what + " is on DLPack device type " +
                                std::to_string(arr.device_type()) + "; moekit computes on the CPU (use .cpu())");
  std::string dtype_text;
  if (!from_dlpack(arr.dtype(), dtype, dtype_text))
    throw std::invalid_argument(std::string("[moekit] ") + what + " has dtype " + dtype_text +
                                "; moekit takes float32, bfloat16, float16 or int32 arrays");
  return arr;
}

InputArray import_array(nb::handle obj, const char* what) {
  InputArray in;
  DType dtype = DType::f32;
  const nb::ndarray<nb::ro> arr = checked_array(obj, what, dtype, in.framework);
  const std::size_t ndim = arr.ndim();
  Shape shape(ndim);
  for (std::size_t i = 0; i < ndim; ++i) shape[i] = static_cast<std::int64_t>(arr.shape(i));
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t* strides = arr.stride_ptr();
  bool contiguous = reinterpret_cast<std::uintptr_t>(arr.data()) % static_cast<std::uintptr_t>(elem) == 0;
  if (strides != nullptr) {
    std::int64_t expect = 1;
    for (std::size_t i = ndim; i-- > 0;) {
      if (shape[i] != 1 && strides[i] != expect) contiguous = false;
      expect *= shape[i];
    }
  }
  in.array = arr;
  if (contiguous || shape_numel(shape) == 0) {
    in.view = TensorView(arr.data(), shape, dtype);
    return in;
  }
  // Strided (or misaligned) input: one contiguous copy, element by element in C order.
  in.copy = Tensor::uninitialized(shape, dtype);
  auto* dst = static_cast<unsigned char*>(in.copy.data());
  const auto* base = static_cast<const unsigned char*>(arr.data());
  const std::int64_t n = in.copy.numel();
  // Element strides: the array's, or C order's where it gave none (a misaligned compact array).
  std::vector<std::int64_t> step(ndim, 1);
  for (std::size_t i = ndim; i-- > 0;)
    step[i] = strides ? strides[i] : (i + 1 < ndim ? step[i + 1] * shape[i + 1] : 1);
  std::vector<std::int64_t> index(ndim, 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < ndim; ++i) offset += index[i] * step[i];
    std::memcpy(dst + k * elem, base + offset * elem, static_cast<std::size_t>(elem));
    for (std::size_t i = ndim; i-- > 0;) {
      if (++index[i] < shape[i]) break;
      index[i] = 0;
    }
  }
  in.view = in.copy.view();
  return in;
}

nb::object export_tensor(Tensor t, Framework framework) {
  auto held = std::make_unique<Tensor>(std::move(t));
  std::vector<std::size_t> shape(held->shape().begin(), held->shape().end());
  void* data = held->data();
  const dl::dtype dtype = to_dlpack(held->dtype(), framework);
  nb::capsule owner(held.get(), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  held.release();
  if (framework == Framework::torch)
    return make_array<nb::pytorch>(data, shape.size(), shape.data(), owner, nullptr, dtype, true);
  return make_array<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr, dtype, true);
}

nb::object export_view(const void* data, DType dtype, const Shape& shape, const std::vector<std::int64_t>& strides,
                       nb::handle owner, Framework framework, bool writable) {
  std::vector<std::size_t> dims(shape.begin(), shape.end());
  const dl::dtype dt = to_dlpack(dtype, framework);
  const std::int64_t* st = strides.empty() ? nullptr : strides.data();
  void* p = const_cast<void*>(data);
  if (framework == Framework::torch)
    return make_array<nb::pytorch>(p, dims.size(), dims.data(), owner, st, dt, writable);
  return make_array<nb::numpy>(p, dims.size(), dims.data(), owner, st, dt, writable);
}

}  // namespace moekit::py
