// load_moe_layer: one MoE block of a checkpoint folder -> MoeLayer. The family's names come
// from MoeConfig::names (data); the expert layout is detected from which tensors exist.
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "io/layer_names.hpp"
#include "kernels/gemm.hpp"
#include "moekit/model.hpp"
#include "moekit/safetensors.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

using detail::replace_layer;

// Reads tensors of one block, with messages that name the file, the tensor and the expectation.
class BlockReader {
 public:
  BlockReader(std::shared_ptr<const Checkpoint> ckpt, std::string prefix, const QuantConfig& quant)
      : ckpt_(std::move(ckpt)), prefix_(std::move(prefix)), quant_(quant) {}

  std::string full(const std::string& rel) const { return prefix_ + "." + rel; }
  bool has(const std::string& rel) const { return ckpt_->contains(full(rel)); }

  [[noreturn]] void fail(const std::string& rel, const std::string& what) const {
    const std::string name = full(rel);
    const std::string file = ckpt_->contains(name) ? ckpt_->info(name).file : ckpt_->path();
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] " << file << ": tensor '" << name << "' " << what));
  }

  // A float view of `rel`, checked against `shape` (or, with `codes`, a U32 view).
  TensorView get(const std::string& rel, const Shape& shape, bool codes = false) const {
    const std::string name = full(rel);
    if (!ckpt_->contains(name))
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] " << ckpt_->path() << ": missing tensor '" << name
                                                                      << "', expected shape " << shape_str(shape)));
    const TensorInfo& info = ckpt_->info(name);
    if (info.shape != shape)
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] " << info.file << ": tensor '" << name
                                                                      << "' has shape " << shape_str(info.shape)
                                                                      << ", expected " << shape_str(shape)));
    if (codes) {
      if (info.dtype_name != "U32") fail(rel, "has dtype " + info.dtype_name + ", expected U32 (packed codes)");
      return ckpt_->view(name);
    }
    TensorView v = ckpt_->view(name);  // throws for dtypes moekit cannot compute on
    if (!is_float(v.dtype()))
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] " << info.file << ": tensor '" << name
                                                                      << "' has dtype " << info.dtype_name
                                                                      << ", expected F32, BF16 or F16"));
    return v;
  }

  // `get` converted to an owned f32 tensor (biases, small vectors).
  Tensor get_f32(const std::string& rel, const Shape& shape) const { return to_dtype(get(rel, shape), DType::f32); }

  // `get` usable in place when aligned; otherwise an owned aligned copy (recorded in `copied`).
  TensorView get_aligned(const std::string& rel, const Shape& shape, std::vector<std::shared_ptr<const void>>& keep,
                         bool& copied, bool codes = false) const {
    TensorView v = get(rel, shape, codes);
    if (reinterpret_cast<std::uintptr_t>(v.data()) % dtype_size(v.dtype()) == 0) return v;
    auto t = std::make_shared<Tensor>(v.shape(), v.dtype());
    std::memcpy(t->data(), v.data(), v.nbytes());
    keep.push_back(t);
    copied = true;
    return t->view();
  }

  const std::shared_ptr<const Checkpoint>& checkpoint() const { return ckpt_; }

  // Fails on the first non-finite entry of `v`, read as rows of `cols` (a row index taken modulo
  // `wrap` where that is not 0): "has a non-finite <noun> X at flat index i (<row> r, <col> c)".
  void check_finite(const std::string& rel, const TensorView& v, std::int64_t cols, std::int64_t wrap, const char* noun,
                    const char* row, const char* col) const {
    for (std::int64_t i = 0; i < v.numel(); ++i) {
      const float x = kernels::load_f32(v.data(), v.dtype(), i);
      if (!std::isfinite(x))
        fail(rel, MOEKIT_MSG("has a non-finite " << noun << " " << x << " at flat index " << i << " (" << row << " "
                                                 << (wrap > 0 ? i / cols % wrap : i / cols) << ", " << col << " "
                                                 << i % cols << ")"));
    }
  }

  // MXFP4 as OpenAI ships GPT-OSS: `<rel>_blocks` U8 [E, out, in / 32, 16] (two e2m1 per byte, low
  // nibble first) and `<rel>_scales` U8 [E, out, in / 32] (e8m0), used in place.
  ExpertMatrix mxfp4(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in) const {
    const std::string blocks = rel + "_blocks", scales = rel + "_scales";
    if (in % 32 != 0)
      fail(blocks, MOEKIT_MSG("has input dimension " << in << ", not a multiple of MXFP4's group of 32"));
    const auto u8 = [&](const std::string& t, const Shape& shape) {
      const std::string name = full(t);
      if (!ckpt_->contains(name))
        fail(t, MOEKIT_MSG("is missing, expected U8 " << shape_str(shape) << " (MXFP4, quant_method mxfp4)"));
      const TensorInfo& info = ckpt_->info(name);
      if (info.shape != shape)
        fail(t, MOEKIT_MSG("has shape " << shape_str(info.shape) << ", expected " << shape_str(shape)));
      if (info.dtype_name != "U8") fail(t, "has dtype " + info.dtype_name + ", expected U8 (MXFP4)");
      return ckpt_->view(name);
    };
    const TensorView b = u8(blocks, {E, out, in / 32, 16});
    const TensorView s = u8(scales, {E, out, in / 32});
    return microscaled(b.data(), s, scales, E, out, in, WeightFormat::mxfp4());
  }

  // A microscaled format's bytes (MXFP4 / NVFP4: two e2m1 per byte; MXFP8: one e4m3; [E or 1,
  // out, in · bits / 8] from `bytes`) and its scales `s` ([.., out, in / group]: e8m0, or e4m3 for
  // NVFP4; tensor `scales_rel`, checked for NaN) as one ExpertMatrix, in place.
  ExpertMatrix microscaled(const void* bytes, const TensorView& s, const std::string& scales_rel, std::int64_t E,
                           std::int64_t out, std::int64_t in, const WeightFormat& format) const {
    const std::int64_t n = std::max<std::int64_t>(E, 1), groups = in / format.block_cols;
    const bool e8m0 = format.scale_dtype == DType::f8_e8m0;
    const auto* raw = static_cast<const std::uint8_t*>(s.data());
    for (std::int64_t i = 0; i < s.numel(); ++i)
      if (e8m0 ? raw[i] == 0xFF : (raw[i] & 0x7F) == 0x7F)
        fail(scales_rel, MOEKIT_MSG("has the " << (e8m0 ? "e8m0 NaN (0xFF)" : "e4m3 NaN (0x7F / 0xFF)")
                                               << " at flat index " << i << " (expert " << i / (out * groups)
                                               << ", row " << i / groups % out << ", group " << i % groups << ")"));
    ExpertMatrix m = ExpertMatrix::stacked(TensorView(bytes, {n, out, in * format.bits / 8}, DType::u8));
    m.cols = in;  // row_stride stays the bytes per row
    m.format = format;
    m.scales = ExpertMatrix::stacked(TensorView(s.data(), {n, out, groups}, format.scale_dtype)).experts;
    m.scale_stride = groups;
    return m;
  }

  // mlx's microscaled modes (mx.quantize(w, group, bits, mode=...)): `mxfp4` (4 bits, e2m1, group
  // 32, e8m0), `nvfp4` (4 bits, e2m1, group 16, e4m3) and `mxfp8` (8 bits, e4m3, group 32, e8m0):
  // `.weight` U32 [.., out, in · bits / 32] holding the elements little-endian (mxfp4: the same
  // bytes as GPT-OSS's blocks), `.scales` U8 [.., out, in / group], no `.biases`. Used in place.
  template <typename ShapeOf>
  ExpertMatrix mlx_microscaled(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in,
                               const QuantParams& q, const ShapeOf& shape, const WeightFormat& format) const {
    const std::string& mode = q.mode;
    const std::int64_t group = format.block_cols;
    if (q.bits != format.bits || q.group_size != group)
      fail(rel + ".weight", MOEKIT_MSG("is " << mode << " with bits " << q.bits << " and group_size " << q.group_size
                                             << " in config.json (" << mode << " is " << format.bits << " bits, group "
                                             << group << ")"));
    if (in % group != 0)
      fail(rel + ".weight", MOEKIT_MSG("has input dimension " << in << ", not a multiple of " << group));
    if (has(rel + ".biases")) fail(rel + ".biases", "exists, but mlx's " + mode + " mode has no biases");
    const auto expect = [&](const std::string& t, const char* dtype, std::int64_t last) {
      if (!has(t))
        fail(t, MOEKIT_MSG("is missing, expected " << dtype << " " << shape_str(shape(last)) << " (" << mode << ")"));
      const TensorInfo& info = ckpt_->info(full(t));
      if (info.shape != shape(last))
        fail(t, MOEKIT_MSG("has shape " << shape_str(info.shape) << ", expected " << shape_str(shape(last)) << " ("
                                        << mode << ", " << in << " inputs)"));
      if (info.dtype_name != dtype) fail(t, "has dtype " + info.dtype_name + ", expected " + dtype + " (" + mode + ")");
      return ckpt_->view(full(t));
    };
    const TensorView codes = expect(rel + ".weight", "U32", in * format.bits / 32);
    const TensorView scales = expect(rel + ".scales", "U8", in / group);
    return microscaled(codes.data(), scales, rel + ".scales", E, out, in, format);
  }

  // FP8 as a Hugging Face release stores it (quant_method fp8, or compressed-tensors'
  // float-quantized): `<rel>.weight` F8_E4M3 [.., out, in] and its scales `<rel>.<suffix>` (F32,
  // BF16, F16 or F8_E8M0) [.., ceil(out / rows), ceil(in / cols)] for the release's block (a
  // per-tensor scale may be a scalar or [1]), used in place. Scales must be finite (e8m0: not
  // the NaN 0xFF).
  template <typename ShapeOf>
  ExpertMatrix fp8(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in, const ShapeOf& shape,
                   std::vector<std::shared_ptr<const void>>& keep) const {
    const ReleaseQuant& rq = quant_.release;
    const std::string w = rel + ".weight";
    if (rq.element != "e4m3")
      fail(w, "holds FP8 (F8_E4M3) weights, but config.json's quantization_config " +
                  (quant_.method.empty() ? std::string("has no quant_method (expected fp8 or compressed-tensors)")
                                         : "has quant_method '" + quant_.method + "' without an FP8 weight scheme"));
    const std::string sname = rel + "." + rq.scale_suffix;
    const std::int64_t br = rq.block_rows > 0 ? rq.block_rows : out, bc = rq.block_cols > 0 ? rq.block_cols : in;
    const std::int64_t srows = (out + br - 1) / br, scols = (in + bc - 1) / bc;
    const TensorInfo& wi = ckpt_->info(full(w));
    if (wi.shape != shape(in))
      fail(w, MOEKIT_MSG("has shape " << shape_str(wi.shape) << ", expected " << shape_str(shape(in))));
    const std::string block = MOEKIT_MSG(br << " × " << bc << " blocks of [" << out << ", " << in << "]");
    if (!has(sname))
      fail(sname,
           MOEKIT_MSG("is missing: FP8 weights need their scales, expected shape "
                      << shape_str(E > 0 ? Shape{E, srows, scols} : Shape{srows, scols}) << " (" << block << ")"));
    const TensorInfo& si = ckpt_->info(full(sname));
    const Shape want = E > 0 ? Shape{E, srows, scols} : Shape{srows, scols};
    std::int64_t numel = 1;
    for (const std::int64_t d : si.shape) numel *= d;
    const bool scalar = E == 0 && srows * scols == 1 && numel == 1 && si.shape.size() <= 2;
    if (si.shape != want && !scalar)
      fail(sname,
           MOEKIT_MSG("has shape " << shape_str(si.shape) << ", expected " << shape_str(want) << " (" << block << ")"));
    if (si.dtype_name != "F32" && si.dtype_name != "BF16" && si.dtype_name != "F16" && si.dtype_name != "F8_E8M0")
      fail(sname, "has dtype " + si.dtype_name + ", expected F32, BF16, F16 or F8_E8M0 (FP8 scales)");
    // The scales are read into an owned copy (a few bytes per 128 × 128 block), not through the
    // mapping, where each would make its neighbours' pages resident (SafetensorsFile::read).
    const DType sd = ckpt_->view(full(sname)).dtype();
    auto owned = std::make_shared<Tensor>(Shape{numel}, sd);
    ckpt_->read(full(sname), owned->data());
    keep.push_back(owned);
    const TensorView sv = owned->view();
    check_finite(sname, sv, scols, srows, "scale", "block row", "column");
    const std::int64_t n = std::max<std::int64_t>(E, 1);
    ExpertMatrix m = ExpertMatrix::stacked(TensorView(ckpt_->bytes(full(w)), {n, out, in}, DType::u8));
    m.format = WeightFormat::fp8(static_cast<int>(br), static_cast<int>(bc), sd);
    if (rq.round_to_scale_dtype) m.format.decode_dtype = sd == DType::bf16 || sd == DType::f16 ? sd : DType::f32;
    m.scales = ExpertMatrix::stacked(TensorView(sv.data(), {n, srows, scols}, sd)).experts;
    m.scale_stride = scols;
    return m;
  }

  // compressed-tensors' pack-quantized int4 (Kimi-K2-Thinking, K2.5): `<rel>.weight_packed` I32
  // [out, ceil(in / 8)] (eight nibbles q + 8 per word, element k at bits 4·(k mod 8) of word k / 8),
  // `<rel>.weight_scale` BF16 / F16 / F32 [out, ceil(in / group)], and `<rel>.weight_shape` (I32 or
  // I64 [2]) = [out, in]; symmetric (no zero point). Used in place.
  ExpertMatrix packed_int4(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in,
                           std::vector<std::shared_ptr<const void>>& keep, bool& copied) const {
    const ReleaseQuant& rq = quant_.release;
    const std::string packed = rel + ".weight_packed", sname = rel + ".weight_scale", wshape = rel + ".weight_shape";
    if (rq.element != "int4")
      fail(packed,
           "holds packed int4 weights, but config.json's quantization_config has no compressed-tensors "
           "pack-quantized int4 scheme" +
               (quant_.method.empty() ? std::string() : " (quant_method '" + quant_.method + "')"));
    if (E > 0) fail(packed, "is stacked over experts; compressed-tensors stores one tensor per expert");
    const std::string zname = rel + ".weight_zero_point";
    if (rq.symmetric && has(zname))
      fail(zname, "is present, but config.json's int4 scheme is symmetric (no zero points)");
    const std::int64_t group = rq.block_cols > 0 ? rq.block_cols : in, groups = (in + group - 1) / group;
    const auto expect = [&](const std::string& t, const Shape& shape, std::initializer_list<const char*> dtypes) {
      if (!has(t))
        fail(t, MOEKIT_MSG("is missing, expected shape " << shape_str(shape) << " (int4, group " << group << " of "
                                                         << in << " inputs)"));
      const TensorInfo& info = ckpt_->info(full(t));
      if (info.shape != shape)
        fail(t, MOEKIT_MSG("has shape " << shape_str(info.shape) << ", expected " << shape_str(shape)
                                        << " (int4, group " << group << " of " << in << " inputs)"));
      for (const char* d : dtypes)
        if (info.dtype_name == d) return info;
      fail(t, "has dtype " + info.dtype_name + ", which is not one of the int4 format's");
    };
    expect(packed, {out, (in + 7) / 8}, {"I32"});
    expect(sname, {out, groups}, {"BF16", "F16", "F32"});
    const TensorInfo& shi = expect(wshape, {2}, {"I32", "I64"});
    const std::uint8_t* sb = ckpt_->bytes(full(wshape));
    std::int64_t dims[2];
    for (int i = 0; i < 2; ++i) {
      if (shi.dtype_name == "I64") {
        std::memcpy(&dims[i], sb + 8 * i, 8);
      } else {
        std::int32_t v;
        std::memcpy(&v, sb + 4 * i, 4);
        dims[i] = v;
      }
    }
    if (dims[0] != out || dims[1] != in)
      fail(wshape, MOEKIT_MSG("holds [" << dims[0] << ", " << dims[1] << "], expected [" << out << ", " << in << "]"));
    const TensorView sv = get_aligned(sname, {out, groups}, keep, copied);
    check_finite(sname, sv, groups, 0, "scale", "row", "group");
    const std::int64_t row_bytes = (in + 7) / 8 * 4;
    ExpertMatrix m = ExpertMatrix::stacked(TensorView(ckpt_->bytes(full(packed)), {1, out, row_bytes}, DType::u8));
    m.cols = in;  // row_stride stays the bytes per row
    m.format = WeightFormat::int4(static_cast<int>(group), sv.dtype(), !rq.symmetric);
    m.scales = ExpertMatrix::stacked(TensorView(sv.data(), {1, out, groups}, sv.dtype())).experts;
    m.scale_stride = groups;
    if (!rq.symmetric) {
      // compressed-tensors packs the zero points along the rows: word (r / 8, g) holds row r's at
      // bits 4 · (r mod 8), stored as z + 8. Unpacked here beside the scales, in their dtype (an
      // owned [out, groups] array: the kernels read a zero point where they read its scale).
      expect(zname, {(out + 7) / 8, groups}, {"I32"});
      const std::uint8_t* zb = ckpt_->bytes(full(zname));
      Tensor zf({out, groups}, DType::f32);
      for (std::int64_t r = 0; r < out; ++r)
        for (std::int64_t g = 0; g < groups; ++g) {
          const std::uint8_t byte = zb[((r / 8) * groups + g) * 4 + (r % 8) / 2];
          zf.data_as<float>()[r * groups + g] = static_cast<float>(static_cast<int>((byte >> (4 * (r % 2))) & 0xF) - 8);
        }
      auto z = std::make_shared<Tensor>(to_dtype(zf, sv.dtype()));  // exact in bf16, f16 and f32
      m.biases = {z->data()};
      keep.push_back(z);  // side data like FP8's pread scales: the codes stay in place
    }
    return m;
  }

  // Projection module `rel` (relative to the block, without ".weight") of E experts stacked
  // [E, out, in] (E > 0) or one [out, in] matrix (E == 0): float as stored; FP8 (F8_E4M3 with its
  // scales) or compressed-tensors int4 (`weight_packed`) as a release stores it; or MLX-quantized
  // when `<rel>.scales` exists (affine: codes, scales and biases; mxfp4 / nvfp4 / mxfp8: codes and
  // scales). Used in place.
  // `projection`: an expert's (routed or shared) gate, up or down, which a release's
  // quantization_config quantizes unless it lists the module as excluded.
  ExpertMatrix matrix(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in,
                      std::vector<std::shared_ptr<const void>>& keep, bool& copied, bool projection = true) const {
    const auto shape = [&](std::int64_t last) { return E > 0 ? Shape{E, out, last} : Shape{out, last}; };
    const std::string module = full(rel);
    const QuantParams q = quant_.of(module);
    if (has(rel + ".weight") && ckpt_->info(full(rel + ".weight")).dtype_name == "F8_E4M3")
      return fp8(rel, E, out, in, shape, keep);
    if (has(rel + ".weight_packed")) return packed_int4(rel, E, out, in, keep, copied);
    const ReleaseQuant& rq = quant_.release;
    if (projection && rq.quantizes() && !rq.excludes(module) && !has(rel + ".scales")) {
      const std::string stored = has(rel + ".weight") ? ckpt_->info(full(rel + ".weight")).dtype_name : "missing";
      fail(rel + ".weight",
           MOEKIT_MSG("is " << stored << ", but config.json's quantization_config (quant_method " << quant_.method
                            << ") quantizes it and does not list it as excluded: expected "
                            << (rq.element == "e4m3" ? "F8_E4M3 with '" + rq.scale_suffix + "'" : "'weight_packed'")));
    }
    if (!has(rel + ".scales")) {
      if (quant_.modules.count(module) && q.bits != 0)
        fail(rel + ".weight", MOEKIT_MSG("is quantized in config.json (" << q.bits << " bits, group "
                                                                         << q.group_size << ") but '" << module
                                                                         << ".scales' is missing"));
      const TensorView v = get_aligned(rel + ".weight", shape(in), keep, copied);
      return ExpertMatrix::stacked(v);
    }
    if (!quant_.present)
      fail(rel + ".scales", "marks an mlx-quantized module, but config.json has no 'quantization' entry");
    if (q.bits == 0) fail(rel + ".scales", "marks a quantized module that config.json's 'quantization' excludes");
    if (q.mode == "mxfp4") return mlx_microscaled(rel, E, out, in, q, shape, WeightFormat::mxfp4());
    if (q.mode == "mxfp8") return mlx_microscaled(rel, E, out, in, q, shape, WeightFormat::mxfp8());
    if (q.mode == "nvfp4") return mlx_microscaled(rel, E, out, in, q, shape, WeightFormat::nvfp4());
    if (q.mode != "affine")
      fail(rel + ".weight", "uses quantization mode '" + q.mode +
                                "', which moekit cannot compute on (supported: affine, mxfp4, nvfp4, mxfp8)");
    if (in % q.group_size != 0)
      fail(rel + ".weight", MOEKIT_MSG("has input dimension " << in << ", not a multiple of group_size "
                                                              << q.group_size));
    const std::int64_t words = in * q.bits / 32, groups = in / q.group_size;
    const std::string ctx = MOEKIT_MSG(" for " << q.bits << "-bit codes, group " << q.group_size << " of " << in
                                               << " inputs");
    const auto expect_shape = [&](const std::string& t, std::int64_t last) {
      if (!has(t)) fail(t, MOEKIT_MSG("is missing, expected shape " << shape_str(shape(last)) << ctx));
      if (ckpt_->info(full(t)).shape != shape(last))
        fail(t, MOEKIT_MSG("has shape " << shape_str(ckpt_->info(full(t)).shape) << ", expected "
                                        << shape_str(shape(last)) << ctx));
    };
    expect_shape(rel + ".weight", words);
    expect_shape(rel + ".scales", groups);
    expect_shape(rel + ".biases", groups);
    const TensorView codes = get_aligned(rel + ".weight", shape(words), keep, copied, true);
    const TensorView scales = get_aligned(rel + ".scales", shape(groups), keep, copied);
    const TensorView biases = get_aligned(rel + ".biases", shape(groups), keep, copied);
    if (scales.dtype() != biases.dtype())
      fail(rel + ".biases", MOEKIT_MSG("has dtype " << dtype_name(biases.dtype()) << " but the scales are "
                                                    << dtype_name(scales.dtype())));
    for (const auto& [t, v] : {std::pair{rel + ".scales", scales}, std::pair{rel + ".biases", biases}})
      check_finite(t, v, groups, 0, "value", "row", "group");
    return ExpertMatrix::stacked_affine(codes, scales, biases, q.bits, q.group_size);
  }

 private:
  std::shared_ptr<const Checkpoint> ckpt_;
  std::string prefix_;
  const QuantConfig& quant_;
};

// Gathers src[e][i][j] (row-major, element size es) into dst[e][out][in] with out/in chosen by
// `pick`: dst(e, o, i) = src element at offset pick(e, o, i).
template <typename Pick>
Tensor gather_copy(const TensorView& src, std::int64_t E, std::int64_t rows, std::int64_t cols, Pick pick) {
  Tensor dst({E, rows, cols}, src.dtype());
  const std::size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const unsigned char*>(src.data());
  auto* d = static_cast<unsigned char*>(dst.data());
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t o = 0; o < rows; ++o)
      for (std::int64_t i = 0; i < cols; ++i)
        std::memcpy(d + static_cast<std::size_t>((e * rows + o) * cols + i) * es,
                    s + static_cast<std::size_t>(pick(e, o, i)) * es, es);
  return dst;
}

// Appends the experts of `part` (one expert's matrix) to `all`, which must agree on the format.
void append_expert(ExpertMatrix& all, const ExpertMatrix& part, const std::string& what, const std::string& file) {
  if (!all.defined()) {
    all = part;
    return;
  }
  if (part.describe() != all.describe())
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] "
                                        << file << ": " << what << " mixes "
                                        << (part.quantized() || all.quantized() ? "formats" : "dtypes")
                                        << " across experts (expert 0: " << all.describe() << ", expert "
                                        << all.num_experts() << ": " << part.describe() << ")"));
  all.experts.push_back(part.experts.front());
  if (part.quantized()) all.scales.push_back(part.scales.front());
  if (!part.biases.empty()) all.biases.push_back(part.biases.front());
}

// The quantization a Hugging Face release declares (quant_method) against the tensors present:
// a method moekit does not read, blocks without the method, or the method without blocks, is a
// named error before anything else is read.
void check_release_quantization(const BlockReader& r, const MoeConfig& c) {
  const std::string& method = c.quantization.method;
  const std::string blocks = c.names.experts + ".gate_up_proj_blocks";
  const std::string& file = r.checkpoint()->path();
  if (!method.empty() && method != "mxfp4" && method != "fp8" && method != "compressed-tensors")
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] "
                                        << file << ": config.json's quantization_config has quant_method '" << method
                                        << "', which moekit does not read (supported: mxfp4, fp8, "
                                           "compressed-tensors; and mlx-lm's 'quantization')"));
  if (r.has(blocks) && method != "mxfp4")
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] " << file << ": '" << r.full(blocks)
                                                                    << "' holds MXFP4 blocks, but config.json's "
                                                                       "quantization_config has no quant_method "
                                                                       "'mxfp4'"));
  if (method == "mxfp4" && !r.has(blocks))
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] "
                                        << file << ": config.json quantizes the experts (quant_method mxfp4), but '"
                                        << r.full(blocks) << "' is missing"));
}

// mlx-lm stacks experts [E, out, in] under "switch_mlp" (or under "experts" for GPT-OSS, with
// stacked biases [E, out]); float or MLX-quantized, used in place.
void load_stacked(const BlockReader& r, const MoeConfig& c, const std::string& stacked, ExpertWeights& ex,
                  bool& copied) {
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width;
  const bool gated = is_gated(c.body);
  const std::string s = stacked + ".";
  if (gated) ex.gate = r.matrix(s + "gate_proj", E, F, D, ex.keep_alive, copied);
  ex.up = r.matrix(s + "up_proj", E, F, D, ex.keep_alive, copied);
  ex.down = r.matrix(s + "down_proj", E, D, F, ex.keep_alive, copied);
  if (c.expert_bias) {
    if (gated) ex.gate_bias = r.get_f32(s + "gate_proj.bias", {E, F});
    ex.up_bias = r.get_f32(s + "up_proj.bias", {E, F});
    ex.down_bias = r.get_f32(s + "down_proj.bias", {E, D});
  }
}

// The gate and up halves of a fused [E] x [2F, in] matrix as two [E] x [F, in] views of the same
// memory: interleaved rows (gate = 0, 2, 4, ...: twice the row and scale strides) or gate rows
// first. Quantized matrices keep their scales alongside.
void split_gate_up(const ExpertMatrix& gu, bool interleaved, std::int64_t F, ExpertMatrix& gate, ExpertMatrix& up) {
  gate = up = gu;
  gate.rows = up.rows = F;
  const std::int64_t row_step = interleaved ? gu.row_stride : F * gu.row_stride;
  const std::int64_t scale_step = interleaved ? gu.scale_stride : F * gu.scale_stride;
  if (interleaved) {
    gate.row_stride = up.row_stride = 2 * gu.row_stride;
    gate.scale_stride = up.scale_stride = 2 * gu.scale_stride;
  }
  const auto advance = [](const void* p, std::int64_t elements, DType dtype) {
    return static_cast<const void*>(static_cast<const unsigned char*>(p) +
                                    static_cast<std::size_t>(elements) * dtype_size(dtype));
  };
  for (std::size_t e = 0; e < gu.experts.size(); ++e) {
    up.experts[e] = advance(gu.experts[e], row_step, gu.dtype);
    if (!gu.scales.empty()) up.scales[e] = advance(gu.scales[e], scale_step, gu.format.scale_dtype);
    if (!gu.biases.empty()) up.biases[e] = advance(gu.biases[e], scale_step, gu.format.scale_dtype);
  }
}

// Biases of a fused gate_up (gate and up interleaved or in halves) and of down, as f32 [E, F] /
// [E, D].
void load_fused_biases(const BlockReader& r, const MoeConfig& c, const std::string& gu_name, const std::string& dn_name,
                       ExpertWeights& ex) {
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width;
  const bool il = c.names.fused_interleaved;
  const Tensor gub = r.get_f32(gu_name + "_bias", {E, 2 * F});
  ex.gate_bias = Tensor({E, F}, DType::f32);
  ex.up_bias = Tensor({E, F}, DType::f32);
  const float* b = gub.data_as<const float>();
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t f = 0; f < F; ++f) {
      ex.gate_bias.data_as<float>()[e * F + f] = b[e * 2 * F + (il ? 2 * f : f)];
      ex.up_bias.data_as<float>()[e * F + f] = b[e * 2 * F + (il ? 2 * f + 1 : F + f)];
    }
  ex.down_bias = r.get_f32(dn_name + "_bias", {E, D});
}

// Hugging Face's fused experts: gate_up_proj [E, 2F, D] used in place (gate rows first), or
// [E, D, 2F] (Llama-4, GPT-OSS; gate/up interleaved for GPT-OSS) copied once into [E, out, in].
std::string load_fused(const BlockReader& r, const MoeConfig& c, ExpertWeights& ex, bool& copied) {
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width;
  const WeightNames& n = c.names;
  const std::string gu_name = n.experts + ".gate_up_proj", dn_name = n.experts + ".down_proj";
  std::string layout;
  if (!n.fused_transposed) {
    layout = "fused_gate_up";
    split_gate_up(ExpertMatrix::stacked(r.get_aligned(gu_name, {E, 2 * F, D}, ex.keep_alive, copied)), false, F,
                  ex.gate, ex.up);
    ex.down = ExpertMatrix::stacked(r.get_aligned(dn_name, {E, D, F}, ex.keep_alive, copied));
  } else {
    layout = n.fused_interleaved ? "fused_gate_up_transposed_interleaved" : "fused_gate_up_transposed";
    copied = true;
    const TensorView gu = r.get(gu_name, {E, D, 2 * F});
    const bool il = n.fused_interleaved;
    auto gate = std::make_shared<Tensor>(gather_copy(gu, E, F, D, [&](std::int64_t e, std::int64_t f, std::int64_t d) {
      return (e * D + d) * 2 * F + (il ? 2 * f : f);
    }));
    auto up = std::make_shared<Tensor>(gather_copy(gu, E, F, D, [&](std::int64_t e, std::int64_t f, std::int64_t d) {
      return (e * D + d) * 2 * F + (il ? 2 * f + 1 : F + f);
    }));
    const TensorView dn = r.get(dn_name, {E, F, D});
    auto down = std::make_shared<Tensor>(
        gather_copy(dn, E, D, F, [&](std::int64_t e, std::int64_t d, std::int64_t f) { return (e * F + f) * D + d; }));
    ex.gate = ExpertMatrix::stacked(*gate);
    ex.up = ExpertMatrix::stacked(*up);
    ex.down = ExpertMatrix::stacked(*down);
    ex.keep_alive.insert(ex.keep_alive.end(), {gate, up, down});
  }
  if (c.expert_bias) load_fused_biases(r, c, gu_name, dn_name, ex);
  return layout;
}

// GPT-OSS as OpenAI ships it (quant_method mxfp4): gate_up_proj_blocks / _scales [E, 2F, D / 32, ..]
// with gate and up rows interleaved, down_proj_blocks / _scales [E, D, F / 32, ..], float biases.
// Used in place: the gate and up halves are views of the interleaved rows.
void load_mxfp4(const BlockReader& r, const MoeConfig& c, ExpertWeights& ex) {
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width;
  const std::string gu_name = c.names.experts + ".gate_up_proj", dn_name = c.names.experts + ".down_proj";
  split_gate_up(r.mxfp4(gu_name, E, 2 * F, D), c.names.fused_interleaved, F, ex.gate, ex.up);
  ex.down = r.mxfp4(dn_name, E, D, F);
  if (c.expert_bias) load_fused_biases(r, c, gu_name, dn_name, ex);
}

// One tensor per expert and projection (`experts.{e}.gate_proj.weight`, ...), float or
// MLX-quantized, used in place.
void load_per_expert(const BlockReader& r, const MoeConfig& c, ExpertWeights& ex, bool& copied) {
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width;
  const WeightNames& n = c.names;
  const bool gated = is_gated(c.body);
  const std::string e0 = n.experts + ".0.";
  const std::string first = e0 + (gated ? n.gate_proj : n.up_proj) + ".weight";
  // `.weight`, or compressed-tensors' packed int4 `.weight_packed`.
  const auto present = [&](const std::string& module) {
    return r.has(module + ".weight") || r.has(module + ".weight_packed");
  };
  if (!present(e0 + n.gate_proj) && !present(e0 + n.up_proj) && !present(e0 + n.down_proj))
    throw std::runtime_error(MOEKIT_MSG(
        "[moekit::load_moe_layer] " << r.checkpoint()->path() << ": no routed experts found; tried '" << r.full(first)
                                    << "' (per_expert), '" << r.full(n.experts + ".gate_up_proj") << "' (fused) and '"
                                    << r.full("switch_mlp.up_proj.weight") << "' (switch_mlp)"));
  const std::string& file = r.checkpoint()->path();
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string p = n.experts + "." + std::to_string(e) + ".";
    if (gated) append_expert(ex.gate, r.matrix(p + n.gate_proj, 0, F, D, ex.keep_alive, copied), "gate", file);
    append_expert(ex.up, r.matrix(p + n.up_proj, 0, F, D, ex.keep_alive, copied), "up", file);
    append_expert(ex.down, r.matrix(p + n.down_proj, 0, D, F, ex.keep_alive, copied), "down", file);
  }
  if (!c.expert_bias) return;
  ex.up_bias = Tensor({E, F}, DType::f32);
  ex.down_bias = Tensor({E, D}, DType::f32);
  if (gated) ex.gate_bias = Tensor({E, F}, DType::f32);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string p = n.experts + "." + std::to_string(e) + ".";
    const auto copy_row = [&](const std::string& rel, std::int64_t len, Tensor& dst) {
      const Tensor b = r.get_f32(rel, {len});
      std::memcpy(dst.data_as<float>() + e * len, b.data(), static_cast<std::size_t>(len) * 4);
    };
    copy_row(p + n.up_proj + ".bias", F, ex.up_bias);
    copy_row(p + n.down_proj + ".bias", D, ex.down_bias);
    if (gated) copy_row(p + n.gate_proj + ".bias", F, ex.gate_bias);
  }
}

// The routed experts, in whichever layout the tensors present say (docs/formats.md, "Expert layouts").
void load_experts(const BlockReader& r, const MoeConfig& c, MoeWeights& w) {
  const WeightNames& n = c.names;
  ExpertWeights& ex = w.experts;
  ex.keep_alive.push_back(r.checkpoint());
  bool copied = false;
  std::string stacked;
  for (const std::string& container : {std::string("switch_mlp"), n.experts})
    if (stacked.empty() && r.has(container + ".up_proj.weight") &&
        r.checkpoint()->info(r.full(container + ".up_proj.weight")).shape.size() == 3)
      stacked = container;
  if (!stacked.empty()) {
    w.layout = "switch_mlp";
    w.stacked_container = stacked;
    load_stacked(r, c, stacked, ex, copied);
  } else if (r.has(n.experts + ".gate_up_proj_blocks")) {
    w.layout = "mxfp4_interleaved";
    load_mxfp4(r, c, ex);
  } else if (r.has(n.experts + ".gate_up_proj")) {
    w.layout = load_fused(r, c, ex, copied);
  } else {
    w.layout = "per_expert";
    load_per_expert(r, c, ex, copied);
  }
  w.mapped = !copied;
}

}  // namespace

MoeLayer load_moe_layer(const std::string& path, std::int64_t layer) {
  if (is_gguf_path(path)) {  // one open serves the metadata and the tensors
    auto model = GgufModel::open(path);
    return load_moe_layer(model, gguf_config(*model), layer);
  }
  return load_moe_layer(path, load_hf_config(path), layer);
}

MoeLayer load_moe_layer(const std::string& path, const MoeConfig& config, std::int64_t layer) {
  if (layer < 0 || layer >= config.num_layers || !config.is_moe_layer(layer))
    return load_moe_layer(std::shared_ptr<const Checkpoint>(), config, layer);  // the same errors, first
  if (is_gguf_path(path)) return load_moe_layer(GgufModel::open(path), config, layer);
  return load_moe_layer(Checkpoint::open(path), config, layer);
}

MoeLayer load_moe_layer(std::shared_ptr<const Checkpoint> ckpt, const MoeConfig& config, std::int64_t layer) {
  if (layer < 0 || layer >= config.num_layers)
    throw std::out_of_range(MOEKIT_MSG("[moekit::load_moe_layer] layer " << layer << " outside [0, "
                                                                         << config.num_layers << ")"));
  if (!config.is_moe_layer(layer))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::load_moe_layer] layer "
                                           << layer << " is dense, not MoE (" << config.model_type
                                           << "; MoE layers: " << compact_ranges(config.moe_layer_indices()) << ")"));
  if (!ckpt) throw std::invalid_argument("[moekit::load_moe_layer] no checkpoint");
  const std::string& path = ckpt->path();
  const std::int64_t E = config.router.num_experts, D = config.hidden_size;
  const WeightNames& n = config.names;

  // Multimodal wrappers (Llama-4) prefix the language model's names.
  std::string block;
  for (const char* wrapper : {"", "language_model."}) {
    const std::string candidate = wrapper + replace_layer(n.block, layer);
    if (ckpt->contains(candidate + "." + n.router + ".weight")) {
      block = candidate;
      break;
    }
  }
  if (block.empty())
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_moe_layer] " << path << ": missing tensor '"
                                                                    << replace_layer(n.block, layer) << "." << n.router
                                                                    << ".weight' (the router of layer " << layer
                                                                    << "), expected shape " << shape_str({E, D})));
  const BlockReader r(ckpt, block, config.quantization);
  check_release_quantization(r, config);
  MoeWeights w;
  w.keep_alive.push_back(ckpt);
  w.block = block;
  bool copied = false;
  const ExpertMatrix router = r.matrix(n.router, 0, E, D, w.keep_alive, copied, false);
  if (router.quantized()) {
    w.router_quantized = router;
  } else {
    w.router = TensorView(router.experts.front(), {E, D}, router.dtype);
  }
  if (w.router.defined() && w.router.dtype() == DType::f16) {
    auto t = std::make_shared<Tensor>(to_dtype(w.router, DType::f32));
    w.keep_alive.push_back(t);
    w.router = t->view();
  }
  if (config.router.has_router_bias) w.router_bias = r.get_f32(n.router + ".bias", {E});
  if (config.router.has_selection_bias) w.selection_bias = r.get_f32(n.selection_bias, {E});
  load_experts(r, config, w);

  if (config.shared_width > 0) {
    const std::int64_t S = config.shared_width;
    ExpertWeights& sh = w.shared;
    sh.keep_alive.push_back(ckpt);
    bool shared_copied = false;
    const auto one = [&](const std::string& rel, std::int64_t out, std::int64_t in) {
      return r.matrix(n.shared + "." + rel, 0, out, in, sh.keep_alive, shared_copied);
    };
    sh.gate = one("gate_proj", S, D);
    sh.up = one("up_proj", S, D);
    sh.down = one("down_proj", D, S);
    if (config.shared_gated) {
      const ExpertMatrix g = r.matrix(n.shared_gate, 0, 1, D, w.keep_alive, copied, false);
      if (g.quantized()) {
        w.shared_gate_quantized = g;
      } else {
        w.shared_gate = TensorView(g.experts.front(), {1, D}, g.dtype);
      }
    }
    if (w.shared_gate.defined()) {
      if (w.shared_gate.dtype() == DType::f16) {
        auto t = std::make_shared<Tensor>(to_dtype(w.shared_gate, DType::f32));
        w.keep_alive.push_back(t);
        w.shared_gate = t->view();
      }
    }
  }
  return MoeLayer(config, std::move(w));
}

}  // namespace moekit
