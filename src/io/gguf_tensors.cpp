// The GGUF tensor reader shared by the MoE block's loader and the whole model's (gguf_tensors.hpp).
#include "io/gguf_tensors.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "util/error.hpp"

namespace moekit::detail {

namespace {

// The ggml types moekit computes on: the float types as plain dtypes, the block types as the
// formats of kernels/formats/ (each type's number in GGUF files is on its format).
struct TypeMap {
  std::uint32_t id;
  bool plain;
  DType dtype;
  Element element;
};
constexpr TypeMap kFloatTypes[] = {{0, true, DType::f32, Element::plain},
                                   {1, true, DType::f16, Element::plain},
                                   {30, true, DType::bf16, Element::plain}};

// The row of ggml type `id`, or nullopt for a type moekit does not compute on.
std::optional<TypeMap> type_map(std::uint32_t id) {
  for (const TypeMap& t : kFloatTypes)
    if (t.id == id) return t;
  const Element e = kernels::formats::gguf_element(id);
  if (e == Element::plain) return std::nullopt;
  return TypeMap{id, false, DType::u8, e};
}

}  // namespace

std::string gguf_supported_types() {
  std::string out;
  for (const TypeMap& t : kFloatTypes) out += (out.empty() ? "" : ", ") + std::string(ggml_type_info(t.id)->name);
#define MOEKIT_GGUF_NAME(f) out += std::string(", ") + kernels::formats::traits(Element::f).name;
  MOEKIT_GGML_FORMATS(MOEKIT_GGUF_NAME)
#undef MOEKIT_GGUF_NAME
  return out;
}

void GgufTensors::fail(const std::string& rel, const std::string& what) const {
  const GgufTensorInfo* t = find(rel);
  throw std::runtime_error(
      MOEKIT_MSG("[moekit::gguf] " << (t ? t->file : m_.path()) << ": tensor '" << full(rel) << "' " << what));
}

const GgufTensorInfo& GgufTensors::get(const std::string& rel, const std::vector<std::int64_t>& ne) const {
  const GgufTensorInfo* t = find(rel);
  if (t == nullptr)
    throw std::runtime_error(MOEKIT_MSG("[moekit::gguf] " << m_.path() << ": missing tensor '" << full(rel)
                                                          << "', expected ne " << shape_str(ne)));
  bool ok = true;  // extents past either list count as 1
  for (std::size_t i = 0; ok && i < std::max(t->ne.size(), ne.size()); ++i)
    ok = (i < t->ne.size() ? t->ne[i] : 1) == (i < ne.size() ? ne[i] : 1);
  if (!ok) fail(rel, MOEKIT_MSG("has ne " << shape_str(t->ne) << ", expected " << shape_str(ne)));
  return *t;
}

Tensor GgufTensors::f32(const std::string& rel, const std::vector<std::int64_t>& ne) const {
  const GgufTensorInfo& t = get(rel, ne);
  const std::optional<TypeMap> tm = type_map(t.type);
  if (!tm || !tm->plain)
    fail(rel, MOEKIT_MSG("has type " << ggml_type_info(t.type)->name << ", expected f32, f16 or bf16"));
  if (reinterpret_cast<std::uintptr_t>(t.data) % dtype_size(tm->dtype) != 0)
    fail(rel, "is not aligned to its element size");
  Tensor out({t.numel()}, DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = kernels::load_f32(t.data, tm->dtype, i);
    if (!std::isfinite(v)) fail(rel, MOEKIT_MSG("has a non-finite value " << v << " at index " << i));
    out.data_as<float>()[i] = v;
  }
  return out;
}

ExpertMatrix GgufTensors::matrix(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in) const {
  const GgufTensorInfo& t =
      get(rel, E > 0 ? std::vector<std::int64_t>{in, out, E} : std::vector<std::int64_t>{in, out});
  const std::optional<TypeMap> tm = type_map(t.type);
  if (!tm)
    fail(rel, MOEKIT_MSG("has ggml type " << ggml_type_info(t.type)->name << ", which moekit does not compute on "
                                          << "(supported: " << gguf_supported_types() << ")"));
  const std::int64_t n = std::max<std::int64_t>(E, 1);
  ExpertMatrix m;
  m.rows = out;
  m.cols = in;
  m.dtype = tm->dtype;
  if (tm->plain) {
    m.row_stride = in;
    if (reinterpret_cast<std::uintptr_t>(t.data) % dtype_size(tm->dtype) != 0)
      fail(rel, "is not aligned to its element size");
  } else {
    m.format = WeightFormat::ggml(tm->element);
    if (const std::string why = kernels::formats::traits(tm->element).check(m.format, out, in); !why.empty())
      fail(rel, why);
    m.row_stride = kernels::formats::traits(tm->element).row_elements(m.format, in);
  }
  const std::size_t per_expert = t.nbytes / static_cast<std::size_t>(n);
  for (std::int64_t e = 0; e < n; ++e) m.experts.push_back(t.data + static_cast<std::size_t>(e) * per_expert);
  return m;
}

}  // namespace moekit::detail
