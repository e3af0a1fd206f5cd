// stored_tensors: a block's MoeTensors under its checkpoint's names and layouts (the inverse of
// moe_loader.cpp's reading), for `moekit backward` and for saving trained layers.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include "moekit/model.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

// dst(e, i, j) = src element picked by `pick(e, i, j)`, over a [E, R, C] result.
template <typename Pick>
Tensor relayout(const Tensor& src, Shape shape, Pick pick) {
  Tensor dst(shape, DType::f32);
  const float* s = src.data_as<const float>();
  float* d = dst.data_as<float>();
  const std::int64_t E = shape[0], R = shape[1], C = shape[2];
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t i = 0; i < R; ++i)
      for (std::int64_t j = 0; j < C; ++j) d[(e * R + i) * C + j] = s[pick(e, i, j)];
  return dst;
}

// Expert e of a stacked [E, R, C] tensor as its own [R, C] tensor (or [C] for [E, C] biases).
Tensor expert_slice(const Tensor& t, std::int64_t e) {
  Shape shape(t.shape().begin() + 1, t.shape().end());
  Tensor out(shape, DType::f32);
  const std::int64_t n = out.numel();
  std::memcpy(out.data(), t.data_as<const float>() + e * n, static_cast<std::size_t>(n) * 4);
  return out;
}

void expect(const Tensor& t, const Shape& shape, const char* name) {
  if (t.numel() > 0) detail::expect_tensor("stored_tensors", name, t, {DType::f32}, shape);
}

}  // namespace

StoredLayout stored_layout(const MoeLayer& layer) {
  const MoeWeights& w = layer.weights();
  if (w.block.empty())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::stored_layout] the layer was not loaded from a checkpoint (layout '"
                                           << w.layout << "')"));
  return {w.block, w.layout, w.stacked_container.empty() ? std::string("switch_mlp") : w.stacked_container};
}

std::vector<std::pair<std::string, Tensor>> stored_tensors(const MoeConfig& c, const StoredLayout& where,
                                                           const MoeTensors& t) {
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width, S = c.shared_width;
  expect(t.router, {E, D}, "router");
  expect(t.router_bias, {E}, "router_bias");
  expect(t.gate, {E, F, D}, "gate");
  expect(t.up, {E, F, D}, "up");
  expect(t.down, {E, D, F}, "down");
  expect(t.gate_bias, {E, F}, "gate_bias");
  expect(t.up_bias, {E, F}, "up_bias");
  expect(t.down_bias, {E, D}, "down_bias");
  expect(t.shared_gate_proj, {S, D}, "shared_gate_proj");
  expect(t.shared_up_proj, {S, D}, "shared_up_proj");
  expect(t.shared_down_proj, {D, S}, "shared_down_proj");
  expect(t.shared_gate, {1, D}, "shared_gate");
  const WeightNames& n = c.names;
  const std::string b = where.block + ".";
  std::vector<std::pair<std::string, Tensor>> out;
  const auto put = [&](const std::string& name, const Tensor& v) {
    if (v.numel() > 0) out.emplace_back(name, v);
  };
  const bool gated = t.gate.numel() > 0;
  const std::string& L = where.layout;
  if (L == "gguf" || L == "gguf_fused_gate_up") {
    // llama.cpp's names; each tensor shaped as its ne reversed ([E, out, in] for ne {in, out, E}).
    put(b + "ffn_gate_inp.weight", t.router);
    put(b + "ffn_gate_inp.bias", t.router_bias);
    if (L == "gguf_fused_gate_up") {
      if (!gated) throw std::invalid_argument("[moekit::stored_tensors] a fused gate/up layout needs a gated body");
      Tensor gu({E, 2 * F, D}, DType::f32);  // gate rows first
      for (std::int64_t e = 0; e < E; ++e) {
        const std::size_t n_ = static_cast<std::size_t>(F * D);
        std::memcpy(gu.data_as<float>() + e * 2 * F * D, t.gate.data_as<const float>() + e * F * D, n_ * 4);
        std::memcpy(gu.data_as<float>() + (e * 2 + 1) * F * D, t.up.data_as<const float>() + e * F * D, n_ * 4);
      }
      put(b + "ffn_gate_up_exps.weight", gu);
    } else {
      put(b + "ffn_gate_exps.weight", t.gate);
      put(b + "ffn_up_exps.weight", t.up);
    }
    put(b + "ffn_down_exps.weight", t.down);
    put(b + "ffn_gate_exps.bias", t.gate_bias);
    put(b + "ffn_up_exps.bias", t.up_bias);
    put(b + "ffn_down_exps.bias", t.down_bias);
    put(b + "ffn_gate_shexp.weight", t.shared_gate_proj);
    put(b + "ffn_up_shexp.weight", t.shared_up_proj);
    put(b + "ffn_down_shexp.weight", t.shared_down_proj);
    if (t.shared_gate.numel() > 0)
      put(b + "ffn_gate_inp_shexp.weight", to_dtype(t.shared_gate.view().reshaped({D}), DType::f32));
    std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    return out;
  }
  put(b + n.router + ".weight", t.router);
  put(b + n.router + ".bias", t.router_bias);
  if (L == "per_expert") {
    for (std::int64_t e = 0; e < E; ++e) {
      const std::string p = b + n.experts + "." + std::to_string(e) + ".";
      for (const auto& [name, w, bias] :
           {std::tuple{n.gate_proj, &t.gate, &t.gate_bias}, std::tuple{n.up_proj, &t.up, &t.up_bias},
            std::tuple{n.down_proj, &t.down, &t.down_bias}}) {
        if (w->numel() > 0) put(p + name + ".weight", expert_slice(*w, e));
        if (bias->numel() > 0) put(p + name + ".bias", expert_slice(*bias, e));
      }
    }
  } else if (L == "switch_mlp") {
    const std::string p = b + where.stacked_container + ".";
    put(p + "gate_proj.weight", t.gate);
    put(p + "up_proj.weight", t.up);
    put(p + "down_proj.weight", t.down);
    put(p + "gate_proj.bias", t.gate_bias);
    put(p + "up_proj.bias", t.up_bias);
    put(p + "down_proj.bias", t.down_bias);
  } else if (L == "fused_gate_up" || L == "fused_gate_up_transposed" || L == "fused_gate_up_transposed_interleaved" ||
             L == "mxfp4_interleaved") {
    if (!gated) throw std::invalid_argument("[moekit::stored_tensors] a fused gate/up layout needs a gated body");
    const std::string gu = b + n.experts + ".gate_up_proj", dn = b + n.experts + ".down_proj";
    const float* g = t.gate.data_as<const float>();
    const float* u = t.up.data_as<const float>();
    const auto gate_or_up = [&](std::int64_t e, std::int64_t f, std::int64_t d, bool il) {
      // (e, column f of 2F, input d) -> flat index into gate or up; up marked by offset E·F·D.
      const bool is_up = il ? (f % 2 == 1) : f >= F;
      const std::int64_t ff = il ? f / 2 : (is_up ? f - F : f);
      return (is_up ? E * F * D : 0) + (e * F + ff) * D + d;
    };
    Tensor both({2, E, F, D}, DType::f32);  // gate then up, so one pick function reads either
    std::memcpy(both.data(), g, static_cast<std::size_t>(E * F * D) * 4);
    std::memcpy(both.data_as<float>() + E * F * D, u, static_cast<std::size_t>(E * F * D) * 4);
    if (L == "fused_gate_up") {
      put(gu, relayout(both, {E, 2 * F, D}, [&](std::int64_t e, std::int64_t f, std::int64_t d) {
            return gate_or_up(e, f, d, false);
          }));
      put(dn, t.down);
    } else {
      // GPT-OSS's MXFP4 release: the gradients of the decoded weights in the layout transformers
      // dequantizes the blocks into, which is the float release's ([E, D, 2F] interleaved).
      const bool il = L == "fused_gate_up_transposed_interleaved" || L == "mxfp4_interleaved";
      put(gu, relayout(both, {E, D, 2 * F}, [&](std::int64_t e, std::int64_t d, std::int64_t f) {
            return gate_or_up(e, f, d, il);
          }));
      put(dn, relayout(t.down, {E, F, D}, [&](std::int64_t e, std::int64_t f, std::int64_t d) {
            return (e * D + d) * F + f;
          }));
    }
    if (t.up_bias.numel() > 0) {
      const bool il = L == "fused_gate_up_transposed_interleaved" || L == "mxfp4_interleaved";
      Tensor fused({E, 2 * F}, DType::f32);
      float* fb = fused.data_as<float>();
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t f = 0; f < F; ++f) {
          fb[e * 2 * F + (il ? 2 * f : f)] = t.gate_bias.numel() > 0 ? t.gate_bias.data_as<const float>()[e * F + f] : 0.0f;
          fb[e * 2 * F + (il ? 2 * f + 1 : F + f)] = t.up_bias.data_as<const float>()[e * F + f];
        }
      put(gu + "_bias", fused);
    }
    put(dn + "_bias", t.down_bias);
  } else {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::stored_tensors] unknown layout '"
                                           << L
                                           << "' (known: per_expert, fused_gate_up, fused_gate_up_transposed, "
                                              "fused_gate_up_transposed_interleaved, mxfp4_interleaved, switch_mlp)"));
  }
  const std::string sh = b + n.shared + ".";
  put(sh + "gate_proj.weight", t.shared_gate_proj);
  put(sh + "up_proj.weight", t.shared_up_proj);
  put(sh + "down_proj.weight", t.shared_down_proj);
  if (!n.shared_gate.empty()) put(b + n.shared_gate + ".weight", t.shared_gate);
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return out;
}

}  // namespace moekit
