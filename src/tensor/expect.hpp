// The one check of a tensor argument's dtype and shape at an API boundary, with one message form:
//   [moekit::route_into] ids must be i32 [3, 4], got f32 (3, 4)
//   [moekit::MoeLayer::forward] x must be f32 or bf16 [..., 24], got f16 (3, 25)
// (expected shapes in brackets, with a name where any size is accepted; what was given in
// parentheses, or "nothing" for an undefined tensor). Internal.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit::detail {

/// One dimension of an expected shape: a size, or a name standing for any size ("T", "K").
struct Dim {
  Dim(std::int64_t n) : size(n) {}  // NOLINT(google-explicit-constructor): {D, "K"} reads as a shape
  Dim(const char* any) : name(any) {}  // NOLINT(google-explicit-constructor)
  std::int64_t size = -1;
  const char* name = nullptr;
};

/// An expected shape: its dimensions, optionally after any number of leading ones ("[..., E]").
struct ShapeSpec {
  ShapeSpec(std::initializer_list<Dim> d, bool leading = false) : dims(d), any_leading(leading) {}
  ShapeSpec(const Shape& exact);  // NOLINT(google-explicit-constructor): every dimension fixed
  std::vector<Dim> dims;
  bool any_leading = false;
  bool matches(const Shape& shape) const;
  std::string str() const;
};

/// [..., last]: rank >= 1 with the last dimension `last` (a size or a name).
inline ShapeSpec trailing(Dim last) { return ShapeSpec({last}, true); }

/// Throws std::invalid_argument "[moekit::<fn>] <name> must be <dtypes> <shape>[ (<note>)], got
/// <dtype> <shape>" unless `t` is defined, has one of `dtypes` and matches `shape`.
void expect_tensor(std::string_view fn, std::string_view name, const TensorView& t,
                   std::initializer_list<DType> dtypes, const ShapeSpec& shape, std::string_view note = {});

}  // namespace moekit::detail
