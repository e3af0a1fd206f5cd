// A checkpoint's tensors under one prefix, read in every format moekit computes on (float as
// stored, FP8 and int4 as releases store them, MLX affine and microscaled), used in place, with
// messages naming the file, the tensor and the expectation. The MoE block's loader and the whole
// model's reader share it. Internal.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"
#include "moekit/config.hpp"
#include "moekit/experts.hpp"
#include "moekit/safetensors.hpp"
#include "util/error.hpp"

namespace moekit::detail {

// Reads tensors of one block, with messages that name the file, the tensor and the expectation.
class BlockReader {
 public:
  BlockReader(std::shared_ptr<const Checkpoint> ckpt, std::string prefix, const QuantConfig& quant)
      : ckpt_(std::move(ckpt)), prefix_(std::move(prefix)), quant_(quant) {}

  std::string full(const std::string& rel) const { return prefix_.empty() ? rel : prefix_ + "." + rel; }
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
        fail(rel + ".weight",
             MOEKIT_MSG("is quantized in config.json (" << q.bits << " bits, group " << q.group_size << ") but '"
                                                        << module << ".scales' is missing"));
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
      fail(rel + ".weight",
           MOEKIT_MSG("has input dimension " << in << ", not a multiple of group_size " << q.group_size));
    const std::int64_t words = in * q.bits / 32, groups = in / q.group_size;
    const std::string ctx =
        MOEKIT_MSG(" for " << q.bits << "-bit codes, group " << q.group_size << " of " << in << " inputs");
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

}  // namespace moekit::detail
