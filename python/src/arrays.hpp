// Arrays across the Python boundary: numpy arrays and DLPack producers (torch tensors, ...) in,
// without a copy where they are C-contiguous CPU memory of a dtype moekit reads; moekit Tensors
// out, owned by the Python object that wraps them (no copy).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "moekit/tensor.hpp"

namespace moekit::py {

namespace nb = nanobind;

/// The array library a result is handed back in: the caller's (numpy in -> numpy out, torch in
/// -> torch out); anything else (mlx, jax, array-API producers) gets numpy arrays.
enum class Framework { numpy, torch };

/// numpy or torch, from the Python type of `obj` (torch.Tensor and its subclasses -> torch).
Framework framework_of(nb::handle obj);

/// An input array as moekit sees it: a view of the caller's memory (kept alive by `owner`) or,
/// for a non-contiguous input, of a contiguous copy held in `copy`.
struct InputArray {
  TensorView view;
  Tensor copy;              ///< set only when the input had to be made contiguous
  nb::ndarray<nb::ro> array;  ///< the imported array (keeps the caller's buffer alive)
  Framework framework = Framework::numpy;
};

/// `obj` as the DLPack array it is, strides and all (nothing copied), after import_array's checks:
/// a numpy array or DLPack producer, not a torch tensor that requires grad, on the CPU, of a dtype
/// moekit reads (float32, bfloat16, float16, int32; returned in `dtype`). Throws as import_array.
nb::ndarray<nb::ro> checked_array(nb::handle obj, const char* what, DType& dtype, Framework& framework);

/// Imports `obj` (named `what` in errors). Accepts numpy arrays and DLPack producers on the CPU
/// with dtype float32, bfloat16, float16 or int32; non-contiguous inputs are copied into a
/// contiguous tensor (the only copy an input ever gets). Throws nb::type_error for an object
/// that is no array, std::invalid_argument naming `what` for another device, a dtype moekit has
/// no use for, or a torch tensor that requires grad.
InputArray import_array(nb::handle obj, const char* what);

/// Hands `t` to Python in `framework` without a copy: the returned array owns `t`'s storage.
nb::object export_tensor(Tensor t, Framework framework);

/// A view of memory owned by `owner` (a Python object that keeps it alive) as a numpy or torch
/// array with the given shape and element strides; read-only unless `writable` (numpy's
/// writeable flag; torch has none). For numpy, bf16 memory is shown as uint16 (numpy has no
/// bfloat16; the Python side reinterprets it when ml_dtypes is installed).
nb::object export_view(const void* data, DType dtype, const Shape& shape, const std::vector<std::int64_t>& strides,
                       nb::handle owner, Framework framework, bool writable);

/// "float32", "bfloat16", ... for a moekit dtype (the names numpy and torch use).
const char* python_dtype_name(DType dtype) noexcept;

}  // namespace moekit::py
