#include <cmath>
#include <stdexcept>
#include <utility>

#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "moekit/experts.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"

namespace moekit {

ExpertMatrix ExpertMatrix::stacked(const TensorView& t) {
  if (!t.defined() || (t.rank() != 3 && t.rank() != 2))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::ExpertMatrix::stacked] expected [E, out, in] or [out, in], got "
                                           << shape_str(t.shape())));
  ExpertMatrix m;
  m.dtype = t.dtype();
  m.rows = t.dim(-2);
  m.cols = t.dim(-1);
  m.row_stride = m.cols;
  const auto* base = static_cast<const char*>(t.data());
  const std::size_t step = static_cast<std::size_t>(m.rows * m.cols) * dtype_size(t.dtype());
  const std::int64_t E = t.rank() == 3 ? t.dim(0) : 1;
  for (std::int64_t e = 0; e < E; ++e) m.experts.push_back(base + static_cast<std::size_t>(e) * step);
  return m;
}

ExpertMatrix ExpertMatrix::stacked_affine(const TensorView& codes, const TensorView& scales, const TensorView& biases,
                                          int bits, int group_size) {
  ExpertMatrix m = stacked(codes);
  const ExpertMatrix s = stacked(scales), b = stacked(biases);
  if (m.dtype != DType::u32 || bits <= 0 || s.num_experts() != m.num_experts() || s.rows != m.rows ||
      scales.shape() != biases.shape() || scales.dtype() != biases.dtype() ||
      s.cols * group_size != m.cols * 32 / bits)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::ExpertMatrix::stacked_affine] codes "
                                           << dtype_name(codes.dtype()) << " " << shape_str(codes.shape())
                                           << ", scales " << shape_str(scales.shape()) << ", biases "
                                           << shape_str(biases.shape()) << " disagree for " << bits
                                           << " bits, group " << group_size));
  m.cols = m.cols * 32 / bits;  // row_stride stays the words per row
  m.format = WeightFormat::mlx_affine(bits, group_size, scales.dtype());
  m.scale_stride = s.cols;
  m.scales = s.experts;
  m.biases = b.experts;
  return m;
}

namespace {
// Bytes of one matrix of every expert in `layout`.
std::size_t matrix_bytes(const ExpertMatrix& m, MatrixLayout layout) {
  if (m.quantized() || layout == MatrixLayout::rows)
    return static_cast<std::size_t>(m.num_experts()) *
           kernels::formats::matrix_bytes(m.format, m.dtype, m.rows, m.cols);
  const std::int64_t per = layout == MatrixLayout::panels ? kernels::panel_elements(m.rows, m.cols)
                                                          : kernels::amx_tile_elements(m.rows, m.cols);
  return static_cast<std::size_t>(m.num_experts() * per) * dtype_size(m.dtype);
}
}  // namespace

std::int64_t ExpertMatrix::row_elements() const {
  return quantized() ? kernels::formats::traits(format.element).row_elements(format, cols) : cols;
}
std::int64_t ExpertMatrix::scale_rows() const { return quantized() ? kernels::formats::scale_rows(format, rows) : 0; }
std::int64_t ExpertMatrix::scale_cols() const { return quantized() ? kernels::formats::scale_cols(format, cols) : 0; }

ExpertMatrix ExpertMatrix::select(const std::vector<std::int64_t>& ids) const {
  ExpertMatrix s = *this;
  const auto pick = [&](const std::vector<const void*>& from, std::vector<const void*>& to) {
    to.clear();
    if (from.empty()) return;
    for (const std::int64_t e : ids) to.push_back(from[static_cast<std::size_t>(e)]);
  };
  pick(experts, s.experts);
  pick(scales, s.scales);
  pick(biases, s.biases);
  return s;
}

std::size_t ExpertMatrix::nbytes() const noexcept { return matrix_bytes(*this, layout); }

std::string ExpertMatrix::describe() const { return kernels::formats::describe(format, dtype); }

std::size_t ExpertWeights::nbytes() const noexcept {
  std::size_t n = 0;
  for (const ExpertMatrix* m : {&gate, &up, &down}) n += matrix_bytes(*m, m->layout);
  return n;
}

namespace {
// The layout pack_panels() packs into in `mode` (throws where there is none).
MatrixLayout packed_layout(ComputeMode mode) {
  if (mode != ComputeMode::bf16) return MatrixLayout::panels;
  const kernels::Bf16Path path = kernels::bf16_path();
  if (path == kernels::Bf16Path::amx) return MatrixLayout::amx_tiles;
  throw std::invalid_argument(MOEKIT_MSG("[moekit::pack_panels] the bf16 compute mode has a packed layout on the amx "
                                         "path only; this CPU runs it on "
                                         << kernels::bf16_path_name(path) << ", which reads the rows in place"));
}
}  // namespace

std::size_t ExpertWeights::packed_nbytes(ComputeMode mode) const noexcept {
  MatrixLayout target = MatrixLayout::panels;
  try {
    target = packed_layout(mode);
  } catch (const std::invalid_argument&) {
    target = MatrixLayout::rows;  // nothing would be packed
  }
  std::size_t n = 0;
  for (const ExpertMatrix* m : {&gate, &up, &down}) n += matrix_bytes(*m, m->packed() ? m->layout : target);
  return n;
}

void validate_bf16_activations(const ExpertWeights& w, const char* what) {
  const std::pair<const ExpertMatrix*, const char*> mats[] = {{&w.gate, "gate"}, {&w.up, "up"}, {&w.down, "down"}};
  for (const auto& item : mats) {
    const ExpertMatrix& m = *item.first;
    if (!m.defined()) continue;
    // bf16 weights, or FP8 ones (decoded and rounded to bf16 a block at a time), in place.
    const bool fp8 = m.quantized() && m.format.element == Element::e4m3 && m.layout == MatrixLayout::rows;
    if (!fp8 && (m.quantized() || m.dtype != DType::bf16 || m.layout == MatrixLayout::panels))
      throw std::invalid_argument(MOEKIT_MSG(
          "[moekit] the bf16 compute mode multiplies bf16 or FP8 weights read in rows "
          "layout, but "
          << what << "." << item.second << " is " << (m.packed() ? "packed in panels, " : "") << m.describe()));
  }
}

void pack_panels(ExpertWeights& w, ComputeMode mode) {
  // A matrix packed before this call reads memory that keep_alive holds; then nothing is let go.
  // A quantized matrix keeps reading its codes in place, so then nothing is let go either.
  bool any_rows = false, any_kept = false;
  for (const ExpertMatrix* m : {&w.gate, &w.up, &w.down}) {
    any_rows |= m->defined() && !m->packed() && !m->quantized();
    any_kept |= m->defined() && (m->packed() || m->quantized());
  }
  if (!any_rows) return;
  const MatrixLayout target = packed_layout(mode);
  for (const ExpertMatrix* m : {&w.gate, &w.up, &w.down})
    if (m->defined() && !m->quantized() && m->dtype != DType::f32 && m->dtype != DType::bf16 &&
        m->dtype != DType::f16)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::pack_panels] dtype " << dtype_name(m->dtype)
                                                                          << " is not f32, bf16 or f16"));
  std::vector<std::shared_ptr<const void>> holders;
  for (ExpertMatrix* m : {&w.gate, &w.up, &w.down}) {
    if (!m->defined() || m->packed() || m->quantized()) continue;
    const bool tiles = target == MatrixLayout::amx_tiles;
    const std::int64_t per = tiles ? kernels::amx_tile_elements(m->rows, m->cols)
                                   : kernels::panel_elements(m->rows, m->cols);
    const std::size_t es = dtype_size(m->dtype);
    const Tensor packed = Tensor::uninitialized({m->num_experts(), per}, m->dtype);
    auto* base = static_cast<char*>(packed.data());
    for (std::int64_t e = 0; e < m->num_experts(); ++e) {
      char* dst = base + static_cast<std::size_t>(e * per) * es;
      if (tiles) {
        kernels::pack_amx_tiles({m->experts[e], m->dtype, m->row_stride}, m->rows, m->cols, dst);
      } else {
        kernels::pack_panels({m->experts[e], m->dtype, m->row_stride}, m->rows, m->cols, dst);
      }
      m->experts[e] = dst;
    }
    m->layout = target;
    m->row_stride = m->cols;
    holders.push_back(std::make_shared<Tensor>(packed));
  }
  // Every matrix now reads its packed copy, so the source (owned tensors or a mapping) is let
  // go: its pages are no longer touched, and owned ones are freed.
  if (any_kept) {
    for (auto& h : w.keep_alive) holders.push_back(std::move(h));
  }
  w.keep_alive = std::move(holders);
}

namespace {

// A quantized matrix: the format's own rules (kernels/formats/), then the container and scale
// arrays every format has.
template <typename Fail>
void check_quantized(const ExpertMatrix& m, std::int64_t E, const Fail& fail) {
  if (!kernels::formats::known(m.format.element))
    fail(MOEKIT_MSG("unknown weight format (element " << static_cast<int>(m.format.element) << ")"));
  const kernels::formats::FormatTraits& t = kernels::formats::traits(m.format.element);
  if (const std::string why = t.check(m.format, m.rows, m.cols); !why.empty()) fail(why);
  if (m.dtype != t.container)
    fail(
        MOEKIT_MSG(t.name << " elements are stored as " << dtype_name(t.container) << ", got " << dtype_name(m.dtype)));
  if (m.packed()) fail("a quantized matrix cannot be in a packed float layout (panels, AMX tiles)");
  const std::int64_t per_row = t.row_elements(m.format, m.cols);
  if (m.row_stride < per_row)
    fail(MOEKIT_MSG("row_stride " << m.row_stride << " " << dtype_name(t.container) << " < " << per_row));
  const auto count = [](const std::vector<const void*>& v) { return static_cast<std::int64_t>(v.size()); };
  if (t.inline_scales) {  // ggml's blocks: scales inside, no arrays beside
    if (!m.scales.empty() || !m.biases.empty())
      fail(MOEKIT_MSG(t.name << " keeps its scales in its blocks: no scale or bias arrays"));
    for (std::int64_t e = 0; e < E; ++e)
      if (m.experts[static_cast<std::size_t>(e)] == nullptr) fail(MOEKIT_MSG("expert " << e << " has no data"));
    return;
  }
  const std::int64_t groups = kernels::formats::scale_cols(m.format, m.cols);
  if (m.scale_stride < groups) fail(MOEKIT_MSG("scale_stride " << m.scale_stride << " < groups " << groups));
  if (count(m.scales) != E || count(m.biases) != (m.format.has_bias ? E : 0))
    fail(m.format.has_bias ? "needs scales and biases for every expert"
                           : "needs scales (and no biases) for every expert");
  const std::size_t sa = dtype_size(m.format.scale_dtype);
  for (std::int64_t e = 0; e < E; ++e) {
    const auto i = static_cast<std::size_t>(e);
    const void* bias = m.format.has_bias ? m.biases[i] : m.scales[i];
    if (m.experts[i] == nullptr || m.scales[i] == nullptr || bias == nullptr)
      fail(MOEKIT_MSG("expert " << e << " has no data"));
    if (reinterpret_cast<std::uintptr_t>(m.experts[i]) % dtype_size(m.dtype) != 0 ||
        reinterpret_cast<std::uintptr_t>(m.scales[i]) % sa != 0 || reinterpret_cast<std::uintptr_t>(bias) % sa != 0)
      fail(MOEKIT_MSG("expert " << e << " is not aligned"));
  }
}

void check_bias(const Tensor& b, std::int64_t E, std::int64_t n, const char* what, const char* name) {
  detail::expect_tensor("validate_experts", std::string(what) + "." + name, b, {DType::f32}, {E, n});
}

}  // namespace

void validate_matrix(const ExpertMatrix& m, std::int64_t E, std::int64_t rows, std::int64_t cols, const char* what,
                  const char* name) {
  const auto fail = [&](const std::string& msg) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::validate_experts] " << what << "." << name << ": " << msg));
  };
  if (m.num_experts() != E) fail(MOEKIT_MSG("has " << m.num_experts() << " experts, expected " << E));
  if (m.rows != rows || m.cols != cols)
    fail(MOEKIT_MSG("is [" << m.rows << ", " << m.cols << "] per expert, expected [" << rows << ", " << cols << "]"));
  if (m.quantized()) {
    check_quantized(m, E, fail);
    return;
  }
  if (!m.packed() && m.row_stride < m.cols) fail(MOEKIT_MSG("row_stride " << m.row_stride << " < cols " << m.cols));
  if (m.layout == MatrixLayout::amx_tiles && m.dtype != DType::bf16)
    fail(MOEKIT_MSG("AMX tiles hold bf16, got " << dtype_name(m.dtype)));
  if (m.dtype != DType::f32 && m.dtype != DType::bf16 && m.dtype != DType::f16)
    fail(MOEKIT_MSG("dtype " << dtype_name(m.dtype) << " is not f32, bf16 or f16"));
  const std::size_t align = dtype_size(m.dtype);
  for (std::int64_t e = 0; e < E; ++e) {
    if (m.experts[e] == nullptr) fail(MOEKIT_MSG("expert " << e << " has no data"));
    if (reinterpret_cast<std::uintptr_t>(m.experts[e]) % align != 0)
      fail(MOEKIT_MSG("expert " << e << " is not " << align << "-byte aligned"));
  }
}

void validate_experts(const ExpertWeights& w, const ExpertBody& body, std::int64_t D, const char* what,
                      ComputeMode mode) {
  const std::int64_t E = w.down.num_experts();
  if (E < 1) throw std::invalid_argument(MOEKIT_MSG("[moekit::validate_experts] " << what << " has no experts"));
  const std::int64_t F = w.down.cols;
  validate_matrix(w.down, E, D, F, what, "down");
  validate_matrix(w.up, E, F, D, what, "up");
  if (is_gated(body.kind)) {
    validate_matrix(w.gate, E, F, D, what, "gate");
  } else if (w.gate.defined()) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::validate_experts] " << what
                                                                        << ".gate given for an ungated MLP body"));
  }
  if (w.gate_bias.numel() || w.gate_bias.rank()) check_bias(w.gate_bias, E, F, what, "gate_bias");
  if (w.up_bias.numel() || w.up_bias.rank()) check_bias(w.up_bias, E, F, what, "up_bias");
  if (w.down_bias.numel() || w.down_bias.rank()) check_bias(w.down_bias, E, D, what, "down_bias");
  const bool tiles = w.gate.layout == MatrixLayout::amx_tiles || w.up.layout == MatrixLayout::amx_tiles ||
                     w.down.layout == MatrixLayout::amx_tiles;
  if (tiles && (mode != ComputeMode::bf16 || !kernels::bf16_path_supported(kernels::Bf16Path::amx)))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::validate_experts] "
                                           << what << " holds AMX tiles, which only the bf16 compute mode reads, on "
                                                      "a CPU with AMX-BF16"));
  if (tiles) validate_bf16_activations(w, what);
  if (!std::isfinite(body.swiglu_limit) || body.swiglu_limit <= 0.0f || !std::isfinite(body.swiglu_alpha))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::validate_experts] swiglu_limit (" << body.swiglu_limit
                                                                                     << ") and swiglu_alpha ("
                                                                                     << body.swiglu_alpha
                                                                                     << ") must be finite, limit > 0"));
}

}  // namespace moekit
