// inspect_report: what moekit reads from a checkpoint folder (`moekit inspect`, the Python
// module's inspect): the config as moekit understands it, then one MoE layer loaded for real
// (layout, dtypes, bytes).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "experts/weight_matrix.hpp"
#include "kernels/gemm.hpp"
#include "kernels/plan.hpp"
#include "moekit/model.hpp"

namespace moekit {

// The kernel plan (kernels/plan.hpp) for the routed experts' projections on this CPU, per mode
// they can run in, at row counts from decode to prefill: one line per projection and mode.
static std::string plan_rows(const ExpertWeights& w) {
  constexpr std::int64_t kRows[] = {1, 4, 8, 16, 64, 512};
  std::ostringstream os;
  os << "  kernel plan, routed experts (this CPU; rows of one expert's call:";
  for (const std::int64_t m : kRows) os << " " << m;
  os << "):\n";
  const std::pair<const char*, const ExpertMatrix*> mats[] = {{"gate", &w.gate}, {"up", &w.up}, {"down", &w.down}};
  for (const ComputeMode mode : {ComputeMode::exact, ComputeMode::int8, ComputeMode::bf16}) {
    bool bf16_ok = true;
    try {
      if (mode == ComputeMode::bf16) validate_bf16_activations(w, "experts");
    } catch (const std::invalid_argument&) {
      bf16_ok = false;
    }
    if (!bf16_ok) continue;
    for (const auto& [name, m] : mats) {
      if (!m->defined()) continue;
      if (mode == ComputeMode::int8 && !m->quantized()) continue;  // int8 changes nothing on float weights
      os << "    " << compute_mode_name(mode) << " " << name << ":";
      for (const std::int64_t M : kRows)
        os << " " << kernels::describe(kernels::plan_gemm_nt(weight_matrix(*m, 0), mode, M, m->cols));
      os << "\n";
    }
  }
  return os.str();
}

// "f32" when all defined matrices share a plain format, else per projection: "gate 4-bit affine,
// group 64, bf16 scales (1.5 MB, 4.5 bits per weight); up ...; down ...".
static std::string matrix_formats(const ExpertWeights& w) {
  std::vector<std::pair<const char*, const ExpertMatrix*>> ms;
  if (w.gate.defined()) ms.emplace_back("gate", &w.gate);
  ms.emplace_back("up", &w.up);
  ms.emplace_back("down", &w.down);
  bool same = true, quantized = false;
  for (const auto& m : ms) {
    same = same && m.second->describe() == ms.front().second->describe();
    quantized = quantized || m.second->quantized();
  }
  if (same && !quantized) return ms.front().second->describe();
  std::ostringstream os;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const ExpertMatrix& m = *ms[i].second;
    // Bits per weight as stored: elements, scales and biases over rows × cols.
    const double weights = static_cast<double>(m.num_experts() * m.rows * m.cols);
    char bpw[32];
    std::snprintf(bpw, sizeof bpw, "%.3g", weights > 0 ? 8.0 * static_cast<double>(m.nbytes()) / weights : 0.0);
    os << (i ? "; " : "") << ms[i].first << " " << m.describe() << " (" << format_bytes(m.nbytes()) << ", " << bpw
       << " bits per weight)";
  }
  return os.str();
}

static std::string describe_experts(const ExpertWeights& w) {
  std::ostringstream os;
  os << w.num_experts() << " x " << (w.gate.defined() ? "gate, up " : "up ")
     << shape_str({w.width(), w.hidden_size()}) << ", down "
     << shape_str({w.hidden_size(), w.width()}) << ", " << matrix_formats(w) << ", "
     << format_bytes(w.nbytes());
  if (w.up_bias.numel() > 0 || w.down_bias.numel() > 0) os << ", with f32 biases";
  return os.str();
}

std::string inspect_report(const std::string& path, std::int64_t layer_index) {
  // Everything that can fail happens before anything is printed. A GGUF model is opened once, for
  // its metadata, the layer and the report's GGUF section.
  const std::shared_ptr<const GgufModel> gguf = is_gguf_path(path) ? GgufModel::open(path) : nullptr;
  const MoeConfig cfg = gguf ? gguf_config(*gguf) : load_hf_config(path);
  std::vector<std::int64_t> moe, dense;
  for (std::int64_t l = 0; l < cfg.num_layers; ++l)
    (cfg.is_moe_layer(l) ? moe : dense).push_back(l);
  const std::int64_t layer = layer_index >= 0 ? layer_index : (moe.empty() ? -1 : moe.front());
  std::unique_ptr<MoeLayer> moe_layer;
  if (layer >= 0)
    moe_layer = std::make_unique<MoeLayer>(gguf ? load_moe_layer(gguf, cfg, layer) : load_moe_layer(path, cfg, layer));

  std::ostringstream out;
  out << "model: " << path << "\n";
  out << "family: " << cfg.model_type << "\n";
  out << "layers: " << cfg.num_layers << "\n";
  out << "MoE layers: " << compact_ranges(moe) << "\n";
  out << "dense layers: " << compact_ranges(dense) << "\n";
  out << "D: " << cfg.hidden_size << " (hidden_size)\n";
  out << "E: " << cfg.router.num_experts << " (routed experts)\n";
  out << "K: " << cfg.router.top_k << " (top_k)\n";
  out << "F: " << cfg.expert_width << " (routed expert width)\n";
  out << "routing: " << describe(cfg.router) << "\n";
  out << "shared experts: ";
  if (cfg.shared_width > 0)
    out << "width " << cfg.shared_width << ", "
        << (cfg.shared_gated ? "gated (sigmoid gate)" : "not gated") << "\n";
  else
    out << "none\n";
  out << "expert body: " << body_name(cfg.body);
  if (cfg.body == BodyKind::swiglu_clamped)
    out << " (limit " << cfg.swiglu_limit << ", alpha " << cfg.swiglu_alpha << ")";
  if (cfg.expert_bias) out << ", with expert biases";
  out << "\n";

  if (gguf) {
    const GgufFile& f = gguf->first();
    out << "GGUF: version " << f.version() << ", architecture " << cfg.model_type;
    if (f.has("general.name") && f.get("general.name").type() == GgufType::string)
      out << ", name '" << f.get("general.name").as_string() << "'";
    out << ", " << gguf->tensors().size() << " tensors in " << gguf->files().size()
        << (gguf->files().size() == 1 ? " file" : " files") << "\n";
    for (const auto& part : gguf->files())
      out << "  " << part->path() << ": " << part->tensors().size() << " tensors, " << format_bytes(part->file_size())
          << "\n";
  }

  if (!moe_layer) {
    out << "(no MoE layer to load)\n";
  } else {
    const MoeWeights& w = moe_layer->weights();
    out << "\nlayer " << layer << ":\n";
    out << "  layout: " << (w.layout.empty() ? "(unnamed)" : w.layout) << ", "
        << (w.mapped ? "mapped (used in place)" : "copied") << "\n";
    if (w.router_quantized.defined()) {
      out << "  router: " << w.router_quantized.describe() << " "
          << shape_str({w.router_quantized.rows, w.router_quantized.cols}) << " ("
          << format_bytes(w.router_quantized.nbytes()) << ")";
    } else {
      out << "  router: " << dtype_name(w.router.dtype()) << " " << shape_str(w.router.shape());
    }
    if (w.router_bias.numel() > 0) out << " + bias " << dtype_name(w.router_bias.dtype());
    out << "\n";
    if (w.selection_bias.numel() > 0)
      out << "  selection bias: " << dtype_name(w.selection_bias.dtype()) << " "
          << shape_str(w.selection_bias.shape()) << "\n";
    out << "  routed experts: " << describe_experts(w.experts) << "\n";
    if ((w.shared.num_experts() > 0))
      out << "  shared experts: " << describe_experts(w.shared) << "\n";
    // What `forward --pack` (MoeLayer::pack_weights) would hold resident: the experts in panels.
    const std::size_t packed = w.experts.packed_nbytes() + w.shared.packed_nbytes();
    out << "  resident expert bytes: " << (w.mapped ? "mapped, only the pages a batch touches; " : "")
        << format_bytes(packed) << " when packed (forward --pack"
        << (w.experts.up.quantized() ? "; quantized projections stay in their packed codes" : "") << ")";
    // bf16 experts on a CPU whose bf16 compute mode runs on AMX: the tile layout's bytes too.
    if (!w.experts.up.quantized() && w.experts.up.dtype == DType::bf16 &&
        kernels::bf16_path() == kernels::Bf16Path::amx) {
      std::size_t tiles = 0;
      for (const ExpertWeights* x : {&w.experts, &w.shared}) tiles += x->packed_nbytes(ComputeMode::bf16);
      out << ", " << format_bytes(tiles) << " in AMX tiles (forward --pack --bf16-activations)";
    }
    out << "\n";
    if (w.shared_gate.defined())
      out << "  shared gate: " << dtype_name(w.shared_gate.dtype()) << " "
          << shape_str(w.shared_gate.shape()) << "\n";
    if (w.shared_gate_quantized.defined())
      out << "  shared gate: " << w.shared_gate_quantized.describe() << " " << shape_str({1, cfg.hidden_size}) << "\n";
    const std::size_t total =
        w.experts.nbytes() + ((w.shared.num_experts() > 0) ? w.shared.nbytes() : 0);
    out << "  expert weight bytes: " << format_bytes(total) << " (routed + shared)\n";
    out << plan_rows(w.experts);
    if (gguf) {  // the block's tensors as stored: ggml type, extents (ne[0] first), bits per weight
      out << "  tensors:\n";
      const std::string prefix = "blk." + std::to_string(layer) + ".";
      for (const GgufTensorInfo* t : gguf->tensors()) {
        if (t->name.compare(0, prefix.size(), prefix) != 0) continue;
        char bpw[32];
        std::snprintf(bpw, sizeof bpw, "%.4g",
                      t->numel() > 0 ? 8.0 * static_cast<double>(t->nbytes) / static_cast<double>(t->numel()) : 0.0);
        std::ostringstream ne;
        for (std::size_t i = 0; i < t->ne.size(); ++i) ne << (i ? ", " : "") << t->ne[i];
        out << "    " << t->name << ": " << ggml_type_info(t->type)->name << " ne [" << ne.str() << "], " << bpw
            << " bits per weight" << (gguf->files().size() > 1 ? " (" + t->file + ")" : "") << "\n";
      }
    }
  }
  return out.str();
}

}  // namespace moekit
