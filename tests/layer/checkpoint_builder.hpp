// Test utility: writes a checkpoint folder (config.json + safetensors, optionally sharded with
// model.safetensors.index.json) from in-memory tensors under names the test chooses, and
// rewrites one block's experts into any of the layouts docs/routing.md, "Checkpoint names" lists.
// Header-only so any test can include "layer/checkpoint_builder.hpp".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/safetensors_writer.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/tensor.hpp"

namespace moekit::testing {


/// An entry holding the bytes of `t` as stored (no conversion).
inline SafetensorsEntry entry_of(const std::string& name, const TensorView& t) {
  SafetensorsEntry e{name, safetensors_dtype_name(t.dtype()), t.shape(),
                     std::vector<std::uint8_t>(t.nbytes())};
  if (t.nbytes() != 0) std::memcpy(e.bytes.data(), t.data(), t.nbytes());
  return e;
}

/// An entry of `t` converted to `dtype` (round to nearest even for bf16/f16).
inline SafetensorsEntry entry_as(const std::string& name, const TensorView& t, DType dtype) {
  return entry_of(name, to_dtype(t, dtype).view());
}

/// An entry of any dtype name with `nbytes` deterministic filler bytes (for dtypes moekit cannot
/// hold, such as I64 or F8_E4M3).
inline SafetensorsEntry raw_entry(const std::string& name, const std::string& dtype, Shape shape,
                                  std::size_t nbytes) {
  SafetensorsEntry e{name, dtype, std::move(shape), std::vector<std::uint8_t>(nbytes)};
  for (std::size_t i = 0; i < nbytes; ++i) e.bytes[i] = static_cast<std::uint8_t>(i * 37u + 11u);
  return e;
}

/// f32 N(0, 1) * scale, deterministic for a seed.
inline Tensor random_f32(Shape shape, std::uint64_t seed, float scale = 1.0f) {
  Tensor t(std::move(shape), DType::f32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  float* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng) * scale;
  return t;
}

/// The f32 tensor holding `t` rounded to bf16 (exactly representable in bf16).
inline Tensor bf16_rounded(const TensorView& t) {
  return to_dtype(to_dtype(t, DType::bf16).view(), DType::f32);
}

/// The routed experts of one block in canonical form, f32 and stacked. Biases are undefined
/// (numel 0) unless the family has them.
struct ExpertSet {
  std::int64_t E = 0, F = 0, D = 0;
  Tensor gate, up, down;                 // [E, F, D], [E, F, D], [E, D, F]
  Tensor gate_bias, up_bias, down_bias;  // [E, F], [E, F], [E, D]

  bool has_bias() const { return down_bias.numel() > 0; }

  static ExpertSet random(std::int64_t E, std::int64_t F, std::int64_t D, std::uint64_t seed,
                          bool biases = false) {
    ExpertSet s;
    s.E = E, s.F = F, s.D = D;
    s.gate = random_f32({E, F, D}, seed, 1.0f / std::sqrt(static_cast<float>(D)));
    s.up = random_f32({E, F, D}, seed + 1, 1.0f / std::sqrt(static_cast<float>(D)));
    s.down = random_f32({E, D, F}, seed + 2, 1.0f / std::sqrt(static_cast<float>(F)));
    if (biases) {
      s.gate_bias = random_f32({E, F}, seed + 3, 0.5f);
      s.up_bias = random_f32({E, F}, seed + 4, 0.5f);
      s.down_bias = random_f32({E, D}, seed + 5, 0.5f);
    }
    return s;
  }
};

/// Expert layouts of docs/routing.md, "Checkpoint names", as files store them.
enum class ExpertLayout {
  per_expert,     // experts.{e}.{gate,up,down}.weight [F, D] / [D, F]
  fused_gate_up,  // experts.gate_up_proj [E, 2F, D] (gate rows first), down_proj [E, D, F]
  fused_gate_up_transposed,  // Llama-4: gate_up_proj [E, D, 2F] (gate columns first), down_proj [E,
                             // F, D]
  fused_gate_up_transposed_interleaved,  // GPT-OSS: gate = columns 0, 2, ..., up = 1, 3, ...
  switch_mlp,  // mlx-lm: switch_mlp.{gate,up,down}_proj.weight [E, out, in]
};

/// Names of per-expert tensors: `<experts>.{e}.<gate>.weight` etc.
struct PerExpertNames {
  std::string experts = "experts", gate = "gate_proj", up = "up_proj", down = "down_proj";
};

/// The tensors of `s` under block `block` (e.g. "model.layers.1.mlp") in `layout`, stored as
/// `dtype`. Biases (when `s` has them) are written f32 beside the weights: per-expert
/// `<name>.bias`, fused `gate_up_proj_bias` [E, 2F] (arranged like the columns) and
/// `down_proj_bias` [E, D].
inline std::vector<SafetensorsEntry> expert_entries(const ExpertSet& s, ExpertLayout layout,
                                                    const std::string& block,
                                                    DType dtype = DType::f32,
                                                    const PerExpertNames& n = {}) {
  const std::int64_t E = s.E, F = s.F, D = s.D;
  const float* g = s.gate.data_as<const float>();
  const float* u = s.up.data_as<const float>();
  const float* dn = s.down.data_as<const float>();
  std::vector<SafetensorsEntry> out;
  const std::string ex = block + "." + n.experts + ".";
  switch (layout) {
    case ExpertLayout::per_expert:
      for (std::int64_t e = 0; e < E; ++e) {
        const std::string p = ex + std::to_string(e) + ".";
        const auto sub = [&](const Tensor& t, std::int64_t rows, std::int64_t cols) {
          return TensorView(t.data_as<const float>() + e * rows * cols, {rows, cols}, DType::f32);
        };
        out.push_back(entry_as(p + n.gate + ".weight", sub(s.gate, F, D), dtype));
        out.push_back(entry_as(p + n.up + ".weight", sub(s.up, F, D), dtype));
        out.push_back(entry_as(p + n.down + ".weight", sub(s.down, D, F), dtype));
        if (s.has_bias()) {
          out.push_back(
              entry_of(p + n.gate + ".bias",
                       TensorView(s.gate_bias.data_as<const float>() + e * F, {F}, DType::f32)));
          out.push_back(
              entry_of(p + n.up + ".bias",
                       TensorView(s.up_bias.data_as<const float>() + e * F, {F}, DType::f32)));
          out.push_back(
              entry_of(p + n.down + ".bias",
                       TensorView(s.down_bias.data_as<const float>() + e * D, {D}, DType::f32)));
        }
      }
      return out;
    case ExpertLayout::switch_mlp:
      out.push_back(entry_as(block + ".switch_mlp.gate_proj.weight", s.gate, dtype));
      out.push_back(entry_as(block + ".switch_mlp.up_proj.weight", s.up, dtype));
      out.push_back(entry_as(block + ".switch_mlp.down_proj.weight", s.down, dtype));
      return out;
    case ExpertLayout::fused_gate_up:
    case ExpertLayout::fused_gate_up_transposed:
    case ExpertLayout::fused_gate_up_transposed_interleaved: {
      const bool transposed = layout != ExpertLayout::fused_gate_up;
      const bool interleaved = layout == ExpertLayout::fused_gate_up_transposed_interleaved;
      // Position of gate row f / up row f along the 2F axis.
      const auto gate_at = [&](std::int64_t f) { return interleaved ? 2 * f : f; };
      const auto up_at = [&](std::int64_t f) { return interleaved ? 2 * f + 1 : F + f; };
      Tensor gu =
          transposed ? Tensor({E, D, 2 * F}, DType::f32) : Tensor({E, 2 * F, D}, DType::f32);
      Tensor down = transposed ? Tensor({E, F, D}, DType::f32) : s.down.clone();
      float* pgu = gu.data_as<float>();
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t f = 0; f < F; ++f)
          for (std::int64_t d = 0; d < D; ++d) {
            const float gv = g[(e * F + f) * D + d], uv = u[(e * F + f) * D + d];
            if (transposed) {
              pgu[(e * D + d) * 2 * F + gate_at(f)] = gv;
              pgu[(e * D + d) * 2 * F + up_at(f)] = uv;
              down.data_as<float>()[(e * F + f) * D + d] = dn[(e * D + d) * F + f];
            } else {
              pgu[(e * 2 * F + gate_at(f)) * D + d] = gv;
              pgu[(e * 2 * F + up_at(f)) * D + d] = uv;
            }
          }
      out.push_back(entry_as(ex + "gate_up_proj", gu, dtype));
      out.push_back(entry_as(ex + "down_proj", down, dtype));
      if (s.has_bias()) {
        Tensor gub({E, 2 * F}, DType::f32);
        for (std::int64_t e = 0; e < E; ++e)
          for (std::int64_t f = 0; f < F; ++f) {
            gub.data_as<float>()[e * 2 * F + gate_at(f)] =
                s.gate_bias.data_as<const float>()[e * F + f];
            gub.data_as<float>()[e * 2 * F + up_at(f)] =
                s.up_bias.data_as<const float>()[e * F + f];
          }
        out.push_back(entry_of(ex + "gate_up_proj_bias", gub));
        out.push_back(entry_of(ex + "down_proj_bias", s.down_bias));
      }
      return out;
    }
  }
  throw std::invalid_argument("expert_entries: unknown layout");
}

/// The inverse of expert_entries: reads `E` experts of width `F` under `block` stored in `layout`
/// from an open checkpoint, converted to f32. `biases` reads the biases too.
inline ExpertSet read_expert_set(const Checkpoint& ck, ExpertLayout layout,
                                 const std::string& block, std::int64_t E, bool biases = false,
                                 const PerExpertNames& n = {}) {
  const auto f32 = [&](const std::string& name) { return to_dtype(ck.view(name), DType::f32); };
  ExpertSet s;
  s.E = E;
  const std::string ex = block + "." + n.experts + ".";
  if (layout == ExpertLayout::per_expert) {
    const Tensor d0 = f32(ex + "0." + n.down + ".weight");
    s.D = d0.dim(0), s.F = d0.dim(1);
    const std::int64_t F = s.F, D = s.D;
    s.gate = Tensor({E, F, D}, DType::f32), s.up = Tensor({E, F, D}, DType::f32),
    s.down = Tensor({E, D, F}, DType::f32);
    if (biases)
      s.gate_bias = Tensor({E, F}, DType::f32), s.up_bias = Tensor({E, F}, DType::f32),
      s.down_bias = Tensor({E, D}, DType::f32);
    for (std::int64_t e = 0; e < E; ++e) {
      const std::string p = ex + std::to_string(e) + ".";
      const auto put = [&](const std::string& name, Tensor& dst, std::int64_t count) {
        const Tensor t = f32(name);
        if (t.numel() != count) throw std::runtime_error("read_expert_set: bad size of " + name);
        std::memcpy(dst.data_as<float>() + e * count, t.data(),
                    static_cast<std::size_t>(count) * 4);
      };
      put(p + n.gate + ".weight", s.gate, F * D);
      put(p + n.up + ".weight", s.up, F * D);
      put(p + n.down + ".weight", s.down, D * F);
      if (biases) {
        put(p + n.gate + ".bias", s.gate_bias, F);
        put(p + n.up + ".bias", s.up_bias, F);
        put(p + n.down + ".bias", s.down_bias, D);
      }
    }
    return s;
  }
  if (layout == ExpertLayout::switch_mlp) {
    s.gate = f32(block + ".switch_mlp.gate_proj.weight");
    s.up = f32(block + ".switch_mlp.up_proj.weight");
    s.down = f32(block + ".switch_mlp.down_proj.weight");
    s.F = s.gate.dim(1), s.D = s.gate.dim(2);
    return s;
  }
  const bool transposed = layout != ExpertLayout::fused_gate_up;
  const bool interleaved = layout == ExpertLayout::fused_gate_up_transposed_interleaved;
  const Tensor gu = f32(ex + "gate_up_proj");
  const Tensor dn = f32(ex + "down_proj");
  s.D = transposed ? gu.dim(1) : gu.dim(2);
  s.F = (transposed ? gu.dim(2) : gu.dim(1)) / 2;
  const std::int64_t F = s.F, D = s.D;
  const auto gate_at = [&](std::int64_t f) { return interleaved ? 2 * f : f; };
  const auto up_at = [&](std::int64_t f) { return interleaved ? 2 * f + 1 : F + f; };
  s.gate = Tensor({E, F, D}, DType::f32), s.up = Tensor({E, F, D}, DType::f32),
  s.down = Tensor({E, D, F}, DType::f32);
  const float* pgu = gu.data_as<const float>();
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t f = 0; f < F; ++f)
      for (std::int64_t d = 0; d < D; ++d) {
        const std::int64_t o = (e * F + f) * D + d;
        if (transposed) {
          s.gate.data_as<float>()[o] = pgu[(e * D + d) * 2 * F + gate_at(f)];
          s.up.data_as<float>()[o] = pgu[(e * D + d) * 2 * F + up_at(f)];
          s.down.data_as<float>()[(e * D + d) * F + f] = dn.data_as<const float>()[o];
        } else {
          s.gate.data_as<float>()[o] = pgu[(e * 2 * F + gate_at(f)) * D + d];
          s.up.data_as<float>()[o] = pgu[(e * 2 * F + up_at(f)) * D + d];
        }
      }
  if (!transposed) s.down = dn;
  if (biases) {
    const Tensor gub = f32(ex + "gate_up_proj_bias");
    s.gate_bias = Tensor({E, F}, DType::f32), s.up_bias = Tensor({E, F}, DType::f32);
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t f = 0; f < F; ++f) {
        s.gate_bias.data_as<float>()[e * F + f] =
            gub.data_as<const float>()[e * 2 * F + gate_at(f)];
        s.up_bias.data_as<float>()[e * F + f] = gub.data_as<const float>()[e * 2 * F + up_at(f)];
      }
    s.down_bias = f32(ex + "down_proj_bias");
  }
  return s;
}

/// A checkpoint folder under construction: a config and named tensors in insertion order.
class CheckpointBuilder {
 public:
  explicit CheckpointBuilder(nlohmann::json config = nlohmann::json::object())
      : config_(std::move(config)) {}

  nlohmann::json& config() { return config_; }
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }

  /// Adds (or replaces, keeping its position) a tensor.
  CheckpointBuilder& add(SafetensorsEntry e) {
    if (SafetensorsEntry* old = find(e.name)) {
      *old = std::move(e);
    } else {
      tensors_.push_back(std::move(e));
    }
    return *this;
  }
  CheckpointBuilder& add(const std::string& name, const TensorView& t) {
    return add(entry_of(name, t));
  }
  CheckpointBuilder& add(std::vector<SafetensorsEntry> es) {
    for (SafetensorsEntry& e : es) add(std::move(e));
    return *this;
  }
  /// Every tensor of an open checkpoint whose name `keep` accepts, bytes as stored.
  template <typename Keep>
  CheckpointBuilder& add_from(const Checkpoint& ck, Keep keep) {
    for (const std::string& name : ck.names()) {
      if (!keep(name)) continue;
      const TensorInfo& info = ck.info(name);
      const std::uint8_t* b = nullptr;
      for (const auto& f : ck.files())
        if (f->contains(name)) b = f->bytes(name);
      add(SafetensorsEntry{name, info.dtype_name, info.shape,
                           std::vector<std::uint8_t>(b, b + (info.end - info.begin))});
    }
    return *this;
  }
  /// Removes a tensor; throws if absent (a test naming a tensor that is not there is a bug).
  CheckpointBuilder& remove(const std::string& name) {
    for (auto it = tensors_.begin(); it != tensors_.end(); ++it)
      if (it->name == name) {
        tensors_.erase(it);
        return *this;
      }
    throw std::invalid_argument("CheckpointBuilder::remove: no tensor " + name);
  }
  SafetensorsEntry* find(const std::string& name) {
    for (SafetensorsEntry& e : tensors_)
      if (e.name == name) return &e;
    return nullptr;
  }
  SafetensorsEntry& at(const std::string& name) {
    if (SafetensorsEntry* e = find(name)) return *e;
    throw std::invalid_argument("CheckpointBuilder::at: no tensor " + name);
  }

  /// Writes config.json (unless the config is null) and the tensors into `dir` (created if
  /// needed): model.safetensors when shards == 1, else model-0000i-of-0000n.safetensors holding
  /// consecutive runs of the tensors (as equal in count as possible) plus
  /// model.safetensors.index.json {"metadata": {"total_size": N}, "weight_map": {...}}.
  void write(const std::filesystem::path& dir, int shards = 1) const {
    std::filesystem::create_directories(dir);
    if (!config_.is_null()) write_text(dir / "config.json", config_.dump(2));
    if (shards <= 1) {
      write_safetensors(dir / "model.safetensors", tensors_);
      return;
    }
    nlohmann::ordered_json index;
    std::size_t total = 0;
    const std::size_t n = tensors_.size();
    for (int s = 0; s < shards; ++s) {
      const std::size_t lo = n * static_cast<std::size_t>(s) / static_cast<std::size_t>(shards);
      const std::size_t hi = n * static_cast<std::size_t>(s + 1) / static_cast<std::size_t>(shards);
      const std::string file = shard_name(s + 1, shards);
      std::vector<SafetensorsEntry> part(tensors_.begin() + static_cast<std::ptrdiff_t>(lo),
                                         tensors_.begin() + static_cast<std::ptrdiff_t>(hi));
      for (const SafetensorsEntry& e : part) {
        index["weight_map"][e.name] = file;
        total += e.bytes.size();
      }
      write_safetensors(dir / file, part);
    }
    index["metadata"]["total_size"] = total;
    write_text(dir / "model.safetensors.index.json", index.dump(2));
  }

  /// "model-00002-of-00003.safetensors".
  static std::string shard_name(int i, int n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i, n);
    return buf;
  }

 private:
  nlohmann::json config_;
  std::vector<SafetensorsEntry> tensors_;
};

}  // namespace moekit::testing
