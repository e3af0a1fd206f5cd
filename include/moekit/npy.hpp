// NumPy .npy files (format versions 1.0, 2.0 and 3.0), little-endian, C order.
#pragma once

#include <cstddef>
#include <string>

#include "moekit/tensor.hpp"

namespace moekit {

/// Reads a .npy file. Supported dtypes: '<f4' (f32), '<f2' (f16), '<i4' (i32), '|u1' (u8).
/// Throws std::runtime_error naming the file for: a file that cannot be opened, a bad magic or
/// version, a malformed header dict, any other dtype (the message lists the supported ones),
/// fortran_order True, a big-endian dtype, a negative or overflowing shape, or fewer data bytes
/// than the shape needs (truncated). Bytes after the array are ignored, as numpy.load does.
Tensor read_npy(const std::string& path);

/// Parses .npy bytes already in memory; `name` is used in messages. Same contract as read_npy.
Tensor parse_npy(const void* data, std::size_t size, const std::string& name);

/// Writes `t` (f32, f16, i32 or u8) as a version 1.0 .npy file. The file is written to a
/// temporary name beside `path` and renamed into place, so a failure never leaves a partial
/// file or destroys an existing one. Throws std::invalid_argument for bf16 (npy has no bf16) and
/// std::runtime_error for I/O failures (naming the file).
void write_npy(const std::string& path, const TensorView& t);

}  // namespace moekit
