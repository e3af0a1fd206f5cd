// load_moe_layer: one MoE block of a checkpoint folder -> MoeLayer. The family's names come
// from MoeConfig::names (data); the expert layout is detected from which tensors exist.
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "io/block_reader.hpp"
#include "io/layer_names.hpp"
#include "kernels/gemm.hpp"
#include "moekit/model.hpp"
#include "moekit/safetensors.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

using detail::replace_layer;

using detail::BlockReader;

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
