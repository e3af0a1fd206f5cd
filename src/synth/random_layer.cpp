#include "synth/random_layer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "moekit/moekit.hpp"
#include "util/splitmix.hpp"
#include "util/thread_pool.hpp"

namespace moekit::synth {

namespace {

const ReferenceShape kShapes[] = {
    {"qwen3", "Qwen3-30B-A3B", 2048, 768, 128, 8, 0,
     R"({"model_type":"qwen3_moe","hidden_size":2048,"num_hidden_layers":1,"num_experts":128,
        "num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true})"},
    {"deepseek", "DeepSeek-style (sigmoid, selection bias, groups 8/4, 2 shared)", 2048, 1408, 64, 6, 2,
     R"({"model_type":"deepseek_v3","hidden_size":2048,"num_hidden_layers":1,"n_routed_experts":64,
        "num_experts_per_tok":6,"moe_intermediate_size":1408,"n_group":8,"topk_group":4,
        "topk_method":"noaux_tc","scoring_func":"sigmoid","norm_topk_prob":true,
        "routed_scaling_factor":2.5,"n_shared_experts":2,"first_k_dense_replace":0})"},
    {"mixtral", "Mixtral-8x7B", 4096, 14336, 8, 2, 0,
     R"({"model_type":"mixtral","hidden_size":4096,"num_hidden_layers":1,"num_local_experts":8,
        "num_experts_per_tok":2,"intermediate_size":14336})"},
    {"tiny", "tiny (smoke tests)", 64, 32, 8, 2, 0,
     R"({"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":1,"num_experts":8,
        "num_experts_per_tok":2,"moe_intermediate_size":32,"norm_topk_prob":true})"},
};

std::uint16_t to_bf16_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even (the values are finite)
  return static_cast<std::uint16_t>(bits >> 16);
}

float stddev_for(const WeightSpec& spec, std::int64_t fan_in) {
  return spec.stddev > 0 ? spec.stddev : 1.0f / std::sqrt(static_cast<float>(fan_in));
}

}  // namespace

std::span<const ReferenceShape> reference_shapes() { return kShapes; }

const ReferenceShape* find_reference_shape(const std::string& name) {
  for (const ReferenceShape& s : kShapes)
    if (name == s.name) return &s;
  return nullptr;
}

MoeConfig config_of(const ReferenceShape& s) {
  MoeConfig cfg = parse_hf_config(s.config_json);
  if (cfg.hidden_size != s.D || cfg.expert_width != s.F || cfg.router.num_experts != s.E ||
      cfg.router.top_k != s.K || cfg.shared_width != s.shared * s.F)
    throw std::logic_error(std::string("reference shape ") + s.name + " disagrees with its config");
  return cfg;
}

void fill_uniform(const Tensor& t, float stddev, std::uint64_t stream) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 18;
  const std::int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float a = std::sqrt(3.0f) * stddev;
  const DType dtype = t.dtype();
  detail::parallel_for(chunks, 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      std::uint64_t state = stream * 0xD1B54A32D192ED03ull + static_cast<std::uint64_t>(c);
      detail::splitmix(state);
      const std::int64_t b = c * kChunk, e = std::min(n, b + kChunk);
      float tmp[256];
      for (std::int64_t i = b; i < e; i += 256) {
        const std::int64_t m = std::min<std::int64_t>(256, e - i);
        for (std::int64_t j = 0; j < m; ++j) {
          const float u = static_cast<float>(detail::splitmix(state) >> 40) * (1.0f / 16777216.0f);
          tmp[j] = (2.0f * u - 1.0f) * a;
        }
        if (dtype == DType::f32) {
          std::memcpy(t.data_as<float>() + i, tmp, static_cast<std::size_t>(m) * sizeof(float));
        } else if (dtype == DType::bf16) {
          std::uint16_t* p = t.data_as<std::uint16_t>() + i;
          for (std::int64_t j = 0; j < m; ++j) p[j] = to_bf16_bits(tmp[j]);
        } else {
          convert(TensorView(tmp, {m}, DType::f32), TensorView(t.data_as<std::uint16_t>() + i, {m}, dtype));
        }
      }
    }
  });
}

namespace {
// A 4-bit format of random nibbles and one scale per group of `format.block_cols`, every scale
// the byte pattern `scale` (a one- or two-byte dtype): MXFP4 (e8m0 2^-8: values within ±0.023),
// NVFP4 (e4m3 2^-8) and compressed-tensors' int4 (bf16 2^-9: values within ±0.016), of the float
// weights' spread.
ExpertMatrix random_nibbles(const WeightFormat& format, std::uint16_t scale, std::int64_t n, std::int64_t out,
                            std::int64_t in, std::uint64_t& stream, std::vector<std::shared_ptr<const void>>& keep) {
  const std::int64_t groups = in / format.block_cols;
  auto blocks = std::make_shared<Tensor>(Tensor::uninitialized({n, out, in / 2}, DType::u8));
  auto scales = std::make_shared<Tensor>(Tensor::uninitialized({n, out, groups}, format.scale_dtype));
  std::uint64_t state = stream++ * 0xD1B54A32D192ED03ull;
  auto* b = blocks->data_as<std::uint8_t>();
  for (std::int64_t i = 0; i < blocks->numel(); ++i) b[i] = static_cast<std::uint8_t>(detail::splitmix(state));
  auto* sb = static_cast<std::uint8_t*>(scales->data());
  const std::size_t es = dtype_size(format.scale_dtype);
  for (std::int64_t i = 0; i < scales->numel(); ++i)
    std::memcpy(sb + static_cast<std::size_t>(i) * es, &scale, es);  // little-endian: the low byte first
  keep.insert(keep.end(), {blocks, scales});
  ExpertMatrix m = ExpertMatrix::stacked(*blocks);
  m.cols = in;
  m.format = format;
  m.scales = ExpertMatrix::stacked(*scales).experts;
  m.scale_stride = groups;
  return m;
}

ExpertMatrix random_mxfp4(std::int64_t n, std::int64_t out, std::int64_t in, std::uint64_t& stream,
                          std::vector<std::shared_ptr<const void>>& keep) {
  return random_nibbles(WeightFormat::mxfp4(), 127 - 8, n, out, in, stream, keep);
}
// FP8 in DeepSeek-V3's layout: random e4m3 bytes but the NaNs (magnitudes up to 448) and the f32
// scale 2^-14 for every 128 × 128 block: values within ±0.027, of the float weights' spread.
ExpertMatrix random_fp8(std::int64_t n, std::int64_t out, std::int64_t in, std::uint64_t& stream,
                        std::vector<std::shared_ptr<const void>>& keep) {
  const std::int64_t srows = (out + 127) / 128, scols = (in + 127) / 128;
  auto bytes = std::make_shared<Tensor>(Tensor::uninitialized({n, out, in}, DType::u8));
  auto scales = std::make_shared<Tensor>(Tensor::uninitialized({n, srows, scols}, DType::f32));
  std::uint64_t state = stream++ * 0xD1B54A32D192ED03ull;
  auto* b = bytes->data_as<std::uint8_t>();
  for (std::int64_t i = 0; i < bytes->numel(); ++i) {
    const auto v = static_cast<std::uint8_t>(detail::splitmix(state));
    b[i] = (v & 0x7F) == 0x7F ? static_cast<std::uint8_t>(v ^ 1) : v;
  }
  std::fill_n(scales->data_as<float>(), scales->numel(), 0x1p-14f);
  keep.insert(keep.end(), {bytes, scales});
  ExpertMatrix m = ExpertMatrix::stacked(*bytes);
  m.format = WeightFormat::fp8(128, 128, DType::f32);
  m.scales = ExpertMatrix::stacked(*scales).experts;
  m.scale_stride = scols;
  return m;
}
}  // namespace

ExpertMatrix random_matrix(const WeightSpec& spec, std::int64_t n, std::int64_t out, std::int64_t in,
                           std::uint64_t& stream, std::vector<std::shared_ptr<const void>>& keep) {
  if (!spec.quantized()) {
    auto t = std::make_shared<Tensor>(Tensor::uninitialized({n, out, in}, spec.dtype));
    fill_uniform(*t, stddev_for(spec, in), stream++);
    keep.push_back(t);
    return ExpertMatrix::stacked(*t);
  }
  if (spec.element == Element::e2m1 && spec.group == 16)  // NVFP4: e4m3 scales 2^-8 (subnormal 2 · 2^-9)
    return random_nibbles(WeightFormat::nvfp4(), 0x02, n, out, in, stream, keep);
  if (spec.element == Element::e2m1) return random_mxfp4(n, out, in, stream, keep);
  if (spec.element == Element::e4m3) return random_fp8(n, out, in, stream, keep);
  if (spec.element == Element::int4)
    return random_nibbles(WeightFormat::int4(spec.group, DType::bf16), 0x3B00, n, out, in, stream, keep);
  const std::int64_t words = in * spec.bits / 32, groups = in / spec.group;
  auto codes = std::make_shared<Tensor>(Tensor::uninitialized({n, out, words}, DType::u32));
  auto scales = std::make_shared<Tensor>(Tensor::uninitialized({n, out, groups}, DType::bf16));
  auto biases = std::make_shared<Tensor>(Tensor::uninitialized({n, out, groups}, DType::bf16));
  std::uint64_t state = stream++ * 0xD1B54A32D192ED03ull;
  auto* c = codes->data_as<std::uint32_t>();
  for (std::int64_t i = 0; i < codes->numel(); ++i) c[i] = static_cast<std::uint32_t>(detail::splitmix(state));
  // Codes uniform in [0, 2^bits): values uniform in [-0.035, 0.035], spread ~0.02.
  const float top = static_cast<float>((1 << spec.bits) - 1);
  auto* sc = scales->data_as<std::uint16_t>();
  auto* bi = biases->data_as<std::uint16_t>();
  for (std::int64_t i = 0; i < scales->numel(); ++i) {
    sc[i] = to_bf16_bits(0.07f / top);
    bi[i] = to_bf16_bits(-0.035f);
  }
  keep.insert(keep.end(), {codes, scales, biases});
  return ExpertMatrix::stacked_affine(*codes, *scales, *biases, spec.bits, spec.group);
}

ExpertWeights random_experts(const WeightSpec& spec, std::int64_t n, std::int64_t F, std::int64_t D,
                             std::uint64_t& stream) {
  ExpertWeights ex;
  ex.gate = random_matrix(spec, n, F, D, stream, ex.keep_alive);
  ex.up = random_matrix(spec, n, F, D, stream, ex.keep_alive);
  ex.down = random_matrix(spec, n, D, F, stream, ex.keep_alive);
  return ex;
}

MoeWeights random_router(const MoeConfig& cfg, const WeightSpec& spec, std::uint64_t& stream) {
  const std::int64_t E = cfg.router.num_experts, D = cfg.hidden_size;
  MoeWeights w;
  auto router = std::make_shared<Tensor>(Tensor::uninitialized({E, D}, DType::f32));
  fill_uniform(*router, stddev_for(spec, D), stream++);
  w.router = router->view();
  w.keep_alive.push_back(router);
  if (cfg.router.has_selection_bias) {
    w.selection_bias = Tensor({E}, DType::f32);
    fill_uniform(w.selection_bias, spec.bias_stddev, stream++);
  }
  if (cfg.router.has_router_bias) {
    w.router_bias = Tensor({E}, DType::f32);
    fill_uniform(w.router_bias, spec.bias_stddev, stream++);
  }
  return w;
}

MoeWeights random_weights(const MoeConfig& cfg, const WeightSpec& spec, std::uint64_t seed) {
  std::uint64_t stream = seed * 1000 + 1;
  MoeWeights w = random_router(cfg, spec, stream);
  w.experts = random_experts(spec, cfg.router.num_experts, cfg.expert_width, cfg.hidden_size, stream);
  if (cfg.shared_width > 0) w.shared = random_experts(spec, 1, cfg.shared_width, cfg.hidden_size, stream);
  w.layout = "stacked (random, in memory)";
  return w;
}

}  // namespace moekit::synth
