// The conformance table's contents (conformance.hpp): the weight formats, their runs, the paths
// and the shape sets.
#include <hwy/targets.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/conformance.hpp"
#include "kernels/formats/affine.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "kernels/targets.hpp"
#include "util/affine.hpp"
#include "util/random.hpp"

namespace moekit::testing::conformance {

using kernels::Bf16Path;
using kernels::Int8Path;
using kernels::Threads;
using kernels::WeightMatrix;

const char* name_of(Mode mode) {
  switch (mode) {
    case Mode::f32:
      return "f32";
    case Mode::bf16:
      return "bf16";
    case Mode::int8:
      return "int8";
  }
  return "?";
}

const char* name_of(Layout layout) {
  switch (layout) {
    case Layout::rows:
      return "rows";
    case Layout::panels:
      return "panels";
    case Layout::amx_tiles:
      return "amxtiles";
    case Layout::quant:
      return "quant";
  }
  return "?";
}

const char* name_of(Op op) {
  switch (op) {
    case Op::nt:
      return "nt";
    case Op::nn:
      return "nn";
    case Op::tn:
      return "tn";
  }
  return "?";
}

const char* name_of(Criterion criterion) {
  switch (criterion) {
    case Criterion::dot_bound:
      return "dot_bound";
    case Criterion::fma_chain:
      return "fma_chain";
    case Criterion::dense_bitwise:
      return "dense_bitwise";
    case Criterion::twin_bitwise:
      return "twin_bitwise";
    case Criterion::rounded_rows_bitwise:
      return "rounded_rows_bitwise";
    case Criterion::int8_bound:
      return "int8_bound";
    case Criterion::portable_bitwise:
      return "portable_bitwise";
  }
  return "?";
}

std::string Path::unsupported() const {
  if (target != 0 && !target_supported(target))
    return std::string("this CPU does not support Highway's ") + hwy::TargetName(target) +
           " target (compiled): the row was not run";
  if (!kernels::bf16_path_supported(bf16))
    return bf16 == Bf16Path::amx
               ? "this CPU (or OS) has no AMX-BF16: the tdpbf16ps path was not run"
               : "this CPU has no AVX512-BF16: the vdpbf16ps path was not run";
  if (!kernels::int8_path_supported(int8)) {
    switch (int8) {
      case Int8Path::amx:
        return "this CPU (or OS) has no AMX-INT8: the tdpbusd path was not run";
      case Int8Path::avx512vnni:
        return "this CPU has no AVX512-VNNI (with AVX2): the vpdpbusd path was not run";
      case Int8Path::avx2:
        return "this CPU has no AVX2 with FMA (or is not x86): the AVX2 path was not run";
      default:
        return "the int8 path is not supported here";
    }
  }
  return "";
}

std::string Row::name() const {
  return format->name + "_" + name_of(layout) + "_" + name_of(op) + "_" + path.name + "_" +
         shapes->name;
}

// ---- Paths
// ---------------------------------------------------------------------------------------

std::vector<Path> highway_paths() {
  std::vector<Path> out;
  for (const std::int64_t t : compiled_targets()) out.push_back({hwy::TargetName(t), t});
  return out;
}

std::vector<Path> bf16_f32_fma_paths() {
  std::vector<Path> out;
  for (const std::int64_t t : compiled_targets())
    out.push_back({std::string("bf16fma") + hwy::TargetName(t), t, Bf16Path::f32_fma});
  return out;
}

Path bf16_path(Bf16Path path) {
  return {path == Bf16Path::amx          ? "bf16amx"
          : path == Bf16Path::avx512bf16 ? "bf16avx512"
                                         : "bf16fma",
          0, path};
}

Path int8_path(Int8Path path) {
  const char* name = path == Int8Path::portable     ? "int8portable"
                     : path == Int8Path::avx2       ? "int8avx2"
                     : path == Int8Path::avx512vnni ? "int8vnni"
                     : path == Int8Path::amx        ? "int8amx"
                                                    : "int8dispatch";
  return {name, 0, Bf16Path::f32_fma, path};
}

std::vector<Path> int8_paths() {
  std::vector<Path> paths;
  for (const Int8Path p : {Int8Path::portable, Int8Path::avx2, Int8Path::avx512vnni, Int8Path::best})
    paths.push_back(int8_path(p));
  return paths;
}

// ---- Shape sets
// ------------------------------------------------------------------------------------

namespace {

using Shapes = std::shared_ptr<const ShapeSet>;

Shapes make_set(std::string name, std::vector<Case> cases) {
  return std::make_shared<const ShapeSet>(ShapeSet{std::move(name), std::move(cases)});
}

std::string shape_name(std::int64_t M, std::int64_t N, std::int64_t K) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}

// Four variants that together cover gathered and scaled rows, row scale and accumulate, each
// alone and in combination: 0 accumulate; 1 gathered, scaled; 2 row scale; 3 all.
Case variant(std::int64_t M, std::int64_t N, std::int64_t K, int v) {
  Case c{M, N, K};
  c.gather = c.scaled = v == 1 || v == 3;
  c.row_scale = v >= 2;
  c.accumulate = v == 0 || v == 3;
  return c;
}

// The exact mode's sweep around every target's tiles: rows 1..7, 13, 25 (3/4/6-row tiles);
// columns around the 4-wide dot tiles (nt on rows) or the outer kernels' 1-, 3- and 4-vector
// tiles of 4, 8 and 16 lanes; K around lane counts, 0 and 1 included; every shape in all four
// variants.
Shapes exact_tails(bool dot_tiles) {
  static const Shapes dot = [] {
    std::vector<Case> cases;
    for (const std::int64_t M : {1, 2, 3, 4, 5, 6, 7, 13, 25})
      for (const std::int64_t N : {1, 3, 4, 5, 9})
        for (const std::int64_t K : {0, 1, 7, 8, 9, 16, 17, 33})
          for (int v = 0; v < 4; ++v) cases.push_back(variant(M, N, K, v));
    return make_set("tails", std::move(cases));
  }();
  static const Shapes outer = [] {
    std::vector<Case> cases;
    for (const std::int64_t M : {1, 2, 3, 4, 5, 6, 7, 13, 25})
      for (const std::int64_t N : {1, 7, 8, 9, 17, 24, 25, 33, 65})
        for (const std::int64_t K : {0, 1, 7, 8, 9, 16, 17, 33})
          for (int v = 0; v < 4; ++v) cases.push_back(variant(M, N, K, v));
    return make_set("tails", std::move(cases));
  }();
  return dot_tiles ? dot : outer;
}

// One shape in variants 1 and 3 (together: gather, scale, row scale, accumulate).
Shapes single(std::int64_t M, std::int64_t N, std::int64_t K, Threads threads = Threads::pool) {
  std::vector<Case> cases;
  for (const int v : {1, 3}) {
    Case c = variant(M, N, K, v);
    c.threads = threads;
    cases.push_back(c);
  }
  return make_set(shape_name(M, N, K), std::move(cases));
}

// gemm_nn streams B in chunks of 64 rows, carrying each tile's partial sums from chunk to chunk,
// over blocks of C's rows sized by the partial sums' budget (gemm_outer.cpp's NnStream): K across
// several chunks and chunk tails, weight rows 8 KB, 4 KB and 3 KB apart (the strides of the
// reference shapes' weights), rows over several strips and column tails; and rows past one block
// (N = 2100 on the calling thread: 40 rows a block on AVX-512, 44 on the others).
Shapes nn_chunks(DType dtype) {
  struct Shape {
    std::int64_t stride_bytes, K, M, N;
  };
  std::vector<Case> cases;
  for (const Shape s :
       {Shape{8192, 140, 13, 17}, Shape{8192, 140, 30, 100}, Shape{4096, 300, 30, 17},
        Shape{3072, 1100, 30, 100}, Shape{8192, 33, 13, 100}, Shape{0, 129, 50, 2100}})
    for (const int v : {1, 3}) {
      Case c = variant(s.M, s.N, s.K, v);
      c.ld = s.stride_bytes / static_cast<std::int64_t>(dtype_size(dtype));
      c.threads = Threads::caller;
      cases.push_back(c);
    }
  return make_set("chunks", std::move(cases));
}

// A result of 1 MB or more goes out with non-temporal stores (the aligned whole vectors; the
// rest, at ldc = N + 2, with ordinary ones): gathered, scaled rows, stored and accumulated, on the
// calling thread and split over the pool.
Shapes tn_large_result() {
  std::vector<Case> cases;
  for (const bool acc : {false, true})
    for (const Threads threads : {Threads::caller, Threads::pool}) {
      Case c{300, 1000, 5};
      c.gather = c.scaled = true;
      c.accumulate = acc;
      c.threads = threads;
      cases.push_back(c);
    }
  return make_set(shape_name(300, 1000, 5), std::move(cases));
}

// The bf16 compute mode: rows 1..13 around the 6-row tiles, columns around 4-wide tiles, K around
// the 32-element pairs of vdpbf16ps and AMX's chunks; gathered rows (scaled too on f32_fma, whose
// f32 rows are rounded by round_to_bf16: the bf16 kernels take rows their producer rounded), row
// scale and accumulate from the shape.
std::vector<Shapes> bf16_sets() {
  static const std::vector<Shapes> sets = [] {
    const auto bf16_case = [](std::int64_t M, std::int64_t N, std::int64_t K, bool gather,
                              bool row_scale, bool acc) {
      Case c{M, N, K};
      c.gather = c.scaled = gather;
      c.row_scale = row_scale;
      c.accumulate = acc;
      return c;
    };
    std::vector<Case> tails;
    for (const std::int64_t M : {1, 2, 5, 6, 7, 13})
      for (const std::int64_t N : {1, 3, 4, 9, 37})
        for (const std::int64_t K : {1, 2, 31, 32, 33, 95, 256})
          tails.push_back(bf16_case(M, N, K, (M + N) % 2 == 0, K % 3 == 0, N % 2 == 1));
    const auto one = [&](std::int64_t M, std::int64_t N, std::int64_t K, bool gather,
                         bool row_scale, bool acc) {
      return make_set(shape_name(M, N, K), {bf16_case(M, N, K, gather, row_scale, acc)});
    };
    return std::vector<Shapes>{
        make_set("tails", std::move(tails)),
        one(64, 96, 2048, true, true, false),  // an expert task at the reference width
        // Several L2 blocks of weight rows (the kernel prefetches the next block while it
        // computes), with a K tail and odd row counts: 9 and 70 rows a block at K = 1509, 2085.
        one(7, 301, 1509, true, false, true), one(13, 150, 2085, false, true, false),
        one(7, 13, 300, false, false, false),  // K = 300: the exact-sum bound at length
    };
  }();
  return sets;
}

// AMX: partial, whole and odd panel counts (16 rows) and tile columns; and past 1 MB of
// activations the kernel runs its panels in groups (each over every column block): at K = 4101 a
// group is 6 panels, so 200 rows on the calling thread are groups of 6, 6 and 1 panels.
std::vector<Shapes> bf16_amx_sets() {
  std::vector<Shapes> sets = bf16_sets();
  std::vector<Case> panels;
  for (const std::int64_t M : {15, 16, 17, 32, 33, 50})
    for (const std::int64_t N : {16, 31, 32, 47, 70})
      for (const std::int64_t K : {32, 63, 160}) {
        Case c{M, N, K};
        c.gather = (M + N) % 2 == 1;
        c.row_scale = K % 3 == 0;
        c.accumulate = N % 2 == 0;
        panels.push_back(c);
      }
  sets.push_back(make_set("amxtails", std::move(panels)));
  Case groups{200, 40, 4101};
  groups.gather = groups.row_scale = groups.accumulate = true;
  groups.threads = Threads::caller;
  sets.push_back(make_set(shape_name(200, 40, 4101), {groups}));
  return sets;
}

// A quantized format, exact mode: rows 1..4 (the in-register path, up to 3 rows), 7 and 40 (a dequantized
// block in scratch); columns 1, 6, 13; K one and three groups; the four variants in turn.
Shapes exact_tails(int group) {
  std::vector<Case> cases;
  int i = 0;
  for (const std::int64_t M : {1, 2, 3, 4, 7, 40})
    for (const std::int64_t N : {1, 6, 13})
      for (const std::int64_t K : {group, 3 * group}) cases.push_back(variant(M, N, K, i++ % 4));
  return make_set("tails", std::move(cases));
}

// The int8 fast mode up to kInt8MaxRows rows (decode): every kernel tail of rows, 13 columns, K
// of 256 and of three spans (a span: a group, or a 32-block of two groups of 16).
Shapes int8_tails(int group) {
  std::vector<Case> cases;
  const std::int64_t three = 3 * std::max(group, 32);
  for (const std::int64_t K : {std::int64_t{256}, three}) {
    if (K == 256 && three == 256) continue;
    for (const std::int64_t M : {1, 2, 3, 5, 8}) cases.push_back({M, 13, K});
  }
  return make_set("tails", std::move(cases));
}

// AMX-INT8: partial panels and tile pairs, gathered and scaled rows, the epilogue.
Shapes int8_amx_tails(int group) {
  std::vector<Case> cases;
  const std::int64_t K = group == 64 ? 192 : 2 * group;
  for (const std::int64_t M : {1, 9, 16, 17, 33, 50})
    for (const std::int64_t N : {13, 32, 70}) {
      Case c{M, N, K};
      c.gather = (M + N) % 2 == 1;
      c.scaled = N % 2 == 0;
      c.row_scale = c.accumulate = M % 2 == 1;
      cases.push_back(c);
    }
  return make_set("amxtails", std::move(cases));
}

// ---- Formats
// ---------------------------------------------------------------------------------------

// f32, bf16, f16: values as stored, widened exactly.
std::shared_ptr<const WeightFormat> float_format(DType dtype) {
  auto f = std::make_shared<WeightFormat>();
  f->name = dtype_name(dtype);
  f->make = [dtype](std::int64_t rows, std::int64_t cols, std::int64_t ld, std::mt19937& rng) {
    Weights w;
    w.data = to_dtype(randn({rows, ld > 0 ? ld : cols + 5}, rng), dtype);
    w.w = {w.data.data(), dtype, w.data.dim(1)};
    return w;
  };
  f->decode = [](const WeightMatrix& w, std::int64_t rows, std::int64_t cols) {
    Tensor d({rows, cols}, DType::f32);
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t k = 0; k < cols; ++k) {
        const std::int64_t i = n * w.ld + k;
        const auto* half = static_cast<const std::uint16_t*>(w.data);
        d.data_as<float>()[n * cols + k] = w.dtype == DType::bf16 ? bf16_to_f32(half[i])
                                           : w.dtype == DType::f16
                                               ? f16_to_f32(half[i])
                                               : static_cast<const float*>(w.data)[i];
      }
    return d;
  };
  const std::vector<Path> targets = highway_paths();
  const Shapes model = single(1, 768, 2048);  // a decoded token through a Qwen3 expert's gate/up
  // The panels kernel packs A's rows in blocks of at most 4 MB (gemm_panel.cpp's kPackFloats):
  // K = 2100 puts 492 rows in a block on the 12- and 6-row targets, 495 on the 3-row ones, so 500
  // rows on the calling thread take two.
  const Shapes row_blocks = single(500, 20, 2100, Threads::caller);
  f->runs = {
      {Mode::f32, Layout::rows, Op::nt, Criterion::dot_bound, targets, {exact_tails(true), model}},
      {Mode::f32,
       Layout::panels,
       Op::nt,
       Criterion::fma_chain,
       targets,
       {exact_tails(false), model, row_blocks}},
      {Mode::f32,
       Layout::rows,
       Op::nn,
       Criterion::fma_chain,
       targets,
       {exact_tails(false), nn_chunks(dtype)}},
      {Mode::f32, Layout::panels, Op::nn, Criterion::dot_bound, targets, {exact_tails(false)}},
  };
  if (dtype == DType::f32)
    f->runs.push_back({Mode::f32,
                       Layout::rows,
                       Op::tn,
                       Criterion::fma_chain,
                       targets,
                       {exact_tails(false), tn_large_result()}});
  if (dtype == DType::bf16) {
    f->runs.push_back({Mode::bf16, Layout::rows, Op::nt, Criterion::rounded_rows_bitwise,
                       bf16_f32_fma_paths(), bf16_sets()});
    f->runs.push_back({Mode::bf16,
                       Layout::rows,
                       Op::nt,
                       Criterion::twin_bitwise,
                       {bf16_path(Bf16Path::avx512bf16)},
                       bf16_sets()});
    for (const Layout layout : {Layout::rows, Layout::amx_tiles})
      f->runs.push_back({Mode::bf16,
                         layout,
                         Op::nt,
                         Criterion::twin_bitwise,
                         {bf16_path(Bf16Path::amx)},
                         bf16_amx_sets()});
  }
  return f;
}

// MLX affine codes of `bits` bits, groups of `group`, scales and biases in `scale_dtype`: Gaussian
// weights (σ = 0.05, an expert's scale) quantized per group by the min/max quantizer
// (util/affine.hpp), as a checkpoint holds them; rows one word and scale rows two entries longer
// than needed, the padding random (strides other than the minimal ones).
std::shared_ptr<const WeightFormat> affine_format(int bits, int group, DType scale_dtype) {
  auto f = std::make_shared<WeightFormat>();
  f->name = "q" + std::to_string(bits) + "g" + std::to_string(group) + dtype_name(scale_dtype);
  f->make = [=](std::int64_t rows, std::int64_t cols, std::int64_t ld, std::mt19937& rng) {
    const Quantized q = quantize_affine(randn({rows, cols}, rng, 0.05f), bits, group, scale_dtype);
    const std::int64_t words = ld > 0 ? ld : kernels::formats::affine::words(cols, bits) + 1, groups = cols / group,
                       sld = groups + 2;
    Weights w;
    std::vector<std::uint32_t> padded(static_cast<std::size_t>(rows * words));
    for (auto& v : padded) v = static_cast<std::uint32_t>(rng());
    w.data = u32_tensor({rows, words}, padded);
    w.scales = to_dtype(randn({rows, sld}, rng), scale_dtype);
    w.biases = to_dtype(randn({rows, sld}, rng), scale_dtype);
    const std::size_t code_bytes = static_cast<std::size_t>(kernels::formats::affine::words(cols, bits)) * 4,
                      group_bytes = static_cast<std::size_t>(groups) * dtype_size(scale_dtype);
    for (std::int64_t n = 0; n < rows; ++n) {
      std::memcpy(w.data.data_as<std::uint32_t>() + n * words,
                  q.codes.data_as<std::uint32_t>() + n * (cols * bits / 32), code_bytes);
      std::memcpy(
          static_cast<char*>(w.scales.data()) + n * sld * dtype_size(scale_dtype),
          static_cast<const char*>(q.scales.data()) + n * static_cast<std::int64_t>(group_bytes),
          group_bytes);
      std::memcpy(
          static_cast<char*>(w.biases.data()) + n * sld * dtype_size(scale_dtype),
          static_cast<const char*>(q.biases.data()) + n * static_cast<std::int64_t>(group_bytes),
          group_bytes);
    }
    w.w = {w.data.data(),
           DType::u32,
           words,
           kernels::WeightLayout::rows,
           moekit::WeightFormat::mlx_affine(bits, group, scale_dtype),
           w.scales.data(),
           w.biases.data(),
           sld};
    return w;
  };
  f->decode = [](const WeightMatrix& w, std::int64_t rows, std::int64_t cols) {
    Tensor d({rows, cols}, DType::f32);
    kernels::ref::dequantize(w, rows, cols, d.data_as<float>());
    return d;
  };
  f->runs = {{Mode::f32, Layout::quant, Op::nt, Criterion::dense_bitwise, highway_paths(), {exact_tails(group)}}};
  if (bits == 4 || bits == 8) {  // the fast mode's codes
    std::vector<Shapes> sets = {int8_tails(group)};
    if (group == 64 &&
        scale_dtype == DType::bf16) {  // MLX's recipe: a Qwen3 expert's gate/up and down
      sets.push_back(make_set(shape_name(1, 768, 2048), {Case{1, 768, 2048}}));
      sets.push_back(make_set(shape_name(4, 2048, 768), {Case{4, 2048, 768}}));
    }
    f->runs.push_back({Mode::int8, Layout::quant, Op::nt, Criterion::int8_bound, int8_paths(), sets});
    if (group % 64 == 0)  // AMX-INT8 takes groups of whole 64-byte tile rows
      f->runs.push_back({Mode::int8,
                         Layout::quant,
                         Op::nt,
                         Criterion::portable_bitwise,
                         {int8_path(Int8Path::amx)},
                         {int8_amx_tails(group)}});
  }
  return f;
}

// A format of bytes with a scale per block of format.block_rows × block_cols weights, named `name`:
// random bytes, each passed through `fix` (e4m3 turns its two NaNs into numbers: a NaN's payload
// need not survive every path); e8m0 scales around 2^-5 with a few at the extremes (2^-127, an f32
// subnormal, and 2^3), float scales of random magnitude around 2^-6 with the same extremes (an f32
// subnormal as bf16 or f32, 8); rows three bytes and scale rows two entries longer than needed,
// the padding random. `shapes`: the exact mode's shape set.
template <typename Fix>
std::shared_ptr<WeightFormat> scaled_format(const std::string& name, const moekit::WeightFormat& format, Fix fix,
                                            Shapes shapes) {
  auto f = std::make_shared<WeightFormat>();
  f->name = name;
  f->make = [=](std::int64_t rows, std::int64_t cols, std::int64_t ld, std::mt19937& rng) {
    const std::int64_t bytes = ld > 0 ? ld : cols * format.bits / 8 + 3;
    const std::int64_t srows = kernels::formats::scale_rows(format, rows);
    const std::int64_t sld = kernels::formats::scale_cols(format, cols) + 2;
    Weights w;
    w.data = Tensor({rows, bytes}, DType::u8);
    auto* d = w.data.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < w.data.numel(); ++i) d[i] = fix(static_cast<std::uint8_t>(rng()));
    if (format.scale_dtype == DType::f8_e8m0) {
      w.scales = Tensor({srows, sld}, DType::f8_e8m0);
      auto* s = static_cast<std::uint8_t*>(w.scales.data());
      for (std::int64_t i = 0; i < w.scales.numel(); ++i) {
        const std::uint32_t r = rng() % 64;
        s[i] = static_cast<std::uint8_t>(r == 0 ? 0 : r == 1 ? 130 : 119 + r % 6);
      }
    } else if (format.scale_dtype == DType::f8_e4m3) {  // NVFP4: positive e4m3, around 2^-4, the extremes
      w.scales = Tensor({srows, sld}, DType::f8_e4m3);
      auto* s = static_cast<std::uint8_t*>(w.scales.data());
      for (std::int64_t i = 0; i < w.scales.numel(); ++i) {
        const std::uint32_t r = rng() % 64;
        s[i] = static_cast<std::uint8_t>(r == 0 ? 0x01 : r == 1 ? 0x7E : r == 2 ? 0x00 : 0x18 + rng() % 0x18);
      }
    } else {
      Tensor s({srows, sld}, DType::f32);
      std::uniform_real_distribution<float> mag(0.5f, 2.0f);
      for (std::int64_t i = 0; i < s.numel(); ++i) {
        const std::uint32_t r = rng() % 64;
        s.data_as<float>()[i] = r == 0 ? 1e-39f : r == 1 ? 8.0f : mag(rng) * 0x1p-6f;
      }
      w.scales = to_dtype(s, format.scale_dtype);
    }
    if (format.has_bias) {  // int4's zero points: every value in [-8, 7], in the scales' dtype
      Tensor z({srows, sld}, DType::f32);
      for (std::int64_t i = 0; i < z.numel(); ++i)
        z.data_as<float>()[i] = static_cast<float>(static_cast<int>(rng() % 16) - 8);
      w.biases = to_dtype(z, format.scale_dtype);
    }
    w.w = {w.data.data(),
           DType::u8,
           bytes,
           kernels::WeightLayout::rows,
           format,
           w.scales.data(),
           format.has_bias ? w.biases.data() : nullptr,
           sld};
    return w;
  };
  f->decode = [](const WeightMatrix& w, std::int64_t rows, std::int64_t cols) {
    Tensor d({rows, cols}, DType::f32);
    kernels::ref::dequantize(w, rows, cols, d.data_as<float>());
    return d;
  };
  f->runs = {{Mode::f32, Layout::quant, Op::nt, Criterion::dense_bitwise, highway_paths(), {std::move(shapes)}}};
  return f;
}

// A signed 4-bit format's fast mode (e2m1, int4): its tails on every path below AMX.
std::shared_ptr<const WeightFormat> with_int8(std::shared_ptr<WeightFormat> f, int group) {
  f->runs.push_back({Mode::int8, Layout::quant, Op::nt, Criterion::int8_bound, int8_paths(), {int8_tails(group)}});
  return f;
}

// MXFP4: every byte value (so every e2m1 nibble, −0 included); the fast mode.
std::shared_ptr<const WeightFormat> mxfp4_format() {
  return with_int8(scaled_format(
                       "mxfp4", moekit::WeightFormat::mxfp4(), [](std::uint8_t b) { return b; }, exact_tails(32)),
                   32);
}

// NVFP4 (mlx's nvfp4 mode): every byte value, groups of 16, e4m3 scales; the fast mode (two
// groups per 32-block).
std::shared_ptr<const WeightFormat> nvfp4_format() {
  return with_int8(scaled_format(
                       "nvfp4", moekit::WeightFormat::nvfp4(), [](std::uint8_t b) { return b; }, exact_tails(16)),
                   16);
}

// Every e4m3 byte but the two NaNs, subnormals included.
std::uint8_t e4m3_number(std::uint8_t b) { return (b & 0x7F) == 0x7F ? static_cast<std::uint8_t>(b ^ 0x01) : b; }

std::shared_ptr<const WeightFormat> mxfp8_format() {
  return scaled_format("mxfp8", moekit::WeightFormat::mxfp8(), e4m3_number, exact_tails(32));
}

// Block-scaled FP8 (DeepSeek-V3's 128 × 128; blocks of 16 × 32 to cross many block edges in small
// shapes): ragged edge blocks in both dimensions, K that is not a whole number of vectors (the
// scalar path), and N of 150 on the pool, whose thread shares start at column 64, inside a block.
std::shared_ptr<const WeightFormat> fp8_blocks_format(int block_rows, int block_cols, DType scale_dtype,
                                                      DType decode_dtype = DType::f32) {
  std::vector<Case> cases;
  int i = 0;
  for (const std::int64_t M : {1, 2, 3, 7, 40})
    for (const std::int64_t N : {13, 150})
      for (const std::int64_t K : {48, 200, 256, 36}) cases.push_back(variant(M, N, K, i++ % 4));
  std::string name = "fp8b" + std::to_string(block_rows) + "x" + std::to_string(block_cols) + dtype_name(scale_dtype);
  if (decode_dtype != DType::f32) name += std::string("round") + dtype_name(decode_dtype);
  name.erase(std::remove(name.begin(), name.end(), '_'), name.end());  // letters and digits
  moekit::WeightFormat format = moekit::WeightFormat::fp8(block_rows, block_cols, scale_dtype);
  format.decode_dtype = decode_dtype;
  return scaled_format(name, format, e4m3_number, make_set("edges", std::move(cases)));
}

// compressed-tensors' int4: every nibble (−8 … 7), groups of `group` inputs, decoded in the scale's
// dtype; K of one and three groups, and a ragged last group.
std::shared_ptr<const WeightFormat> int4_format(int group, DType scale_dtype, bool zero_point = false) {
  std::vector<Case> cases;
  int i = 0;
  for (const std::int64_t M : {1, 2, 3, 7, 40})
    for (const std::int64_t N : {13, 70})
      for (const std::int64_t K : {std::int64_t{group}, std::int64_t{3} * group, std::int64_t{group} + 16})
        cases.push_back(variant(M, N, K, i++ % 4));
  std::string name = "int4g" + std::to_string(group) + dtype_name(scale_dtype) + (zero_point ? "zp" : "");
  auto f = scaled_format(
      name, moekit::WeightFormat::int4(group, scale_dtype, zero_point), [](std::uint8_t b) { return b; },
      make_set("groups", std::move(cases)));
  if (group % 32 == 0 && !zero_point) return with_int8(f, group);
  return f;
}

}  // namespace

const std::vector<std::shared_ptr<const WeightFormat>>& weight_formats() {
  static const std::vector<std::shared_ptr<const WeightFormat>> formats = [] {
    std::vector<std::shared_ptr<const WeightFormat>> out;
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
      out.push_back(float_format(dtype));
    // 256: no MLX recipe uses it, but a file may.
    for (const int bits : {2, 3, 4, 5, 6, 8})
      for (const int group : {32, 64, 128, 256})
        for (const DType scale_dtype : {DType::bf16, DType::f16, DType::f32})
          out.push_back(affine_format(bits, group, scale_dtype));
    out.push_back(mxfp4_format());
    out.push_back(mxfp8_format());
    out.push_back(nvfp4_format());
    out.push_back(fp8_blocks_format(128, 128, DType::f32));
    out.push_back(fp8_blocks_format(128, 128, DType::f8_e8m0));
    out.push_back(fp8_blocks_format(16, 32, DType::bf16));
    out.push_back(fp8_blocks_format(1, 256, DType::bf16, DType::bf16));  // compressed-tensors, per row
    out.push_back(fp8_blocks_format(1, 256, DType::f16, DType::f16));
    out.push_back(int4_format(32, DType::bf16));  // Kimi-K2-Thinking's
    out.push_back(int4_format(128, DType::f16));
    out.push_back(int4_format(64, DType::f32));
    out.push_back(int4_format(32, DType::f16, true));  // compressed-tensors' asymmetric scheme (AWQ)
    out.push_back(int4_format(128, DType::bf16, true));
    return out;
  }();
  return formats;
}

std::vector<Row> table() {
  std::vector<Row> rows;
  for (const auto& format : weight_formats())
    for (const Run& run : format->runs)
      for (const Path& path : run.paths)
        for (const auto& shapes : run.shapes)
          rows.push_back({format, run.mode, run.layout, run.op, run.criterion, path, shapes});
  return rows;
}

}  // namespace moekit::testing::conformance
