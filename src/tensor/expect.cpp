#include "tensor/expect.hpp"

#include <algorithm>
#include <stdexcept>

#include "util/error.hpp"

namespace moekit::detail {

ShapeSpec::ShapeSpec(const Shape& exact) {
  for (const std::int64_t n : exact) dims.emplace_back(n);
}

bool ShapeSpec::matches(const Shape& shape) const {
  const std::size_t n = dims.size();
  if (any_leading ? shape.size() < n : shape.size() != n) return false;
  const std::size_t offset = shape.size() - n;
  for (std::size_t i = 0; i < n; ++i)
    if (dims[i].name == nullptr && shape[offset + i] != dims[i].size) return false;
  return true;
}

std::string ShapeSpec::str() const {
  std::string s = "[";
  if (any_leading) s += dims.empty() ? "..." : "..., ";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += dims[i].name != nullptr ? std::string(dims[i].name) : std::to_string(dims[i].size);
  }
  return s + "]";
}

void expect_tensor(std::string_view fn, std::string_view name, const TensorView& t,
                   std::initializer_list<DType> dtypes, const ShapeSpec& shape, std::string_view note) {
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t.dtype()) != dtypes.end();
  if (t.defined() && dtype_ok && shape.matches(t.shape())) return;
  std::string want;
  for (const DType d : dtypes) {
    if (!want.empty()) want += " or ";
    want += dtype_name(d);
  }
  throw std::invalid_argument(MOEKIT_MSG(
      "[moekit::" << fn << "] " << name << " must be " << want << " " << shape.str()
                  << (note.empty() ? "" : " (") << note << (note.empty() ? "" : ")") << ", got "
                  << (t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()) : "nothing")));
}

}  // namespace moekit::detail
