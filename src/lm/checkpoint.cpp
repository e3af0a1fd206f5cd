// The language model of lm.hpp as a checkpoint folder (moekit/checkpoint.hpp: lm_config_json,
// parse_lm_config, lm_stored_tensors, save_lm_checkpoint, load_lm_checkpoint; docs/training.md,
// "Checkpoints"): config.json with a "moekit_lm" object, every tensor under HF-style names (each
// MoE block in its family's layout, so load_moe_layer reads it like any checkpoint's) and the
// training state in the block checkpoint's format (src/io/checkpoint_files.hpp).
#include "moekit/checkpoint.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/checkpoint_files.hpp"
#include "util/error.hpp"

namespace moekit {

namespace fs = std::filesystem;

std::string lm_config_json(const LmConfig& config, const std::string& block_config_json) {
  nlohmann::json j = nlohmann::json::parse(block_config_json);
  j["moekit_lm"] = {{"vocab", config.vocab},
                    {"context", config.context},
                    {"norm_eps", config.norm_eps},
                    {"tokenizer", "bytes"}};
  return j.dump(2);
}

LmConfig parse_lm_config(const std::string& config_json) {
  LmConfig c;
  c.block = parse_hf_config(config_json);  // valid JSON from here on
  const nlohmann::json j = nlohmann::json::parse(config_json);
  if (!j.contains("moekit_lm") || !j.at("moekit_lm").is_object())
    throw std::invalid_argument(
        "[moekit::parse_lm_config] no \"moekit_lm\" object: not a language model written by "
        "moekit train");
  const nlohmann::json& m = j.at("moekit_lm");
  const auto integer = [&](const char* key) {
    if (!m.contains(key) || !m.at(key).is_number_integer())
      throw std::invalid_argument(
          MOEKIT_MSG("[moekit::parse_lm_config] moekit_lm." << key << " must be an integer"));
    return m.at(key).get<std::int64_t>();
  };
  c.vocab = integer("vocab");
  c.context = integer("context");
  if (!m.contains("norm_eps") || !m.at("norm_eps").is_number())
    throw std::invalid_argument("[moekit::parse_lm_config] moekit_lm.norm_eps must be a number");
  c.norm_eps = m.at("norm_eps").get<float>();
  if (m.value("tokenizer", std::string()) != "bytes")
    throw std::invalid_argument("[moekit::parse_lm_config] moekit_lm.tokenizer must be \"bytes\"");
  c.validate();
  return c;
}

std::vector<std::pair<std::string, Tensor>> lm_stored_tensors(
    const LmConfig& config, const LmParams& params, const std::vector<Tensor>& selection_biases) {
  NamedTensors out{{"model.embed_tokens.weight", params.embed},
                   {"model.context_proj.weight", params.context_proj}};
  for (std::int64_t l = 0; l < config.layers(); ++l) {
    const auto li = static_cast<std::size_t>(l);
    out.emplace_back("model.layers." + std::to_string(l) + ".post_attention_layernorm.weight",
                     params.norms.at(li));
    const StoredLayout where = natural_layout(config.block, l);
    NamedTensors block = stored_tensors(config.block, where, params.blocks.at(li));
    out.insert(out.end(), block.begin(), block.end());
    if (config.block.router.has_selection_bias)
      out.emplace_back(where.block + "." + config.block.names.selection_bias,
                       selection_biases.at(li));
  }
  out.emplace_back("model.norm.weight", params.final_norm);
  out.emplace_back("lm_head.weight", params.head);
  return out;
}

void save_lm_checkpoint(const std::string& dir, const std::string& config_json,
                        const LmConfig& config, const LmParams& params,
                        const std::vector<Tensor>& selection_biases, const Optimizer& optimizer,
                        const TrainingState& state) {
  if (!nlohmann::json::accept(state.user_json))
    throw std::invalid_argument("[moekit::save_lm_checkpoint] state.user_json is not valid JSON");
  const NamedTensors tensors =
      lm_stored_tensors(config, params, selection_biases);  // validates shapes first
  detail::write_folder(dir, "save_lm_checkpoint", [&](const fs::path& partial) {
    detail::write_text(partial / "config.json", config_json, "save_lm_checkpoint");
    detail::write_safetensors((partial / "model.safetensors").string(), tensors,
                              {{"format", "pt"}});
    detail::write_safetensors((partial / kTrainingStateFile).string(), optimizer.state(),
                              detail::state_meta(optimizer, state, "lm"));
  });
}

LmCheckpoint load_lm_checkpoint(const std::string& dir, const Optimizer& optimizer) {
  const fs::path config_path = fs::path(dir) / "config.json";
  std::ifstream in(config_path, std::ios::binary);
  if (!in)
    throw std::runtime_error(
        MOEKIT_MSG("[moekit::load_lm_checkpoint] cannot read '" << config_path.string() << "'"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LmCheckpoint ck{};
  try {
    ck.config = parse_lm_config(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(MOEKIT_MSG(config_path.string() << ": " << e.what()));
  }
  ck.config_json = text;
  const std::int64_t V = ck.config.vocab, D = ck.config.dim(), N = ck.config.context,
                     L = ck.config.layers();
  const std::string model_path = (fs::path(dir) / "model.safetensors").string();
  const auto file = SafetensorsFile::open(model_path);
  // Everything moekit train writes is f32; the blocks' names and shapes are checked by
  // load_moe_layer below, the rest here.
  for (const std::string& name : file->names())
    if (file->info(name).dtype_name != "F32")
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] "
                                          << model_path << ": '" << name << "' is "
                                          << file->info(name).dtype_name << ", expected F32"));
  const auto read = [&](const std::string& name, const Shape& shape) {
    if (!file->contains(name))
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] "
                                          << model_path << ": no tensor '" << name << "'"));
    if (file->info(name).shape != shape)
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] "
                                          << model_path << ": '" << name << "' is "
                                          << shape_str(file->info(name).shape) << ", expected "
                                          << shape_str(shape)));
    Tensor t = Tensor::uninitialized(shape, DType::f32);
    std::memcpy(t.data(), file->bytes(name), t.nbytes());
    return t;
  };
  ck.params.embed = read("model.embed_tokens.weight", {V, D});
  ck.params.context_proj = read("model.context_proj.weight", {D, N * D});
  ck.params.final_norm = read("model.norm.weight", {D});
  ck.params.head = read("lm_head.weight", {V, D});
  ck.selection_biases.resize(static_cast<std::size_t>(L));
  for (std::int64_t l = 0; l < L; ++l) {
    ck.params.norms.push_back(
        read("model.layers." + std::to_string(l) + ".post_attention_layernorm.weight", {D}));
    // The block through load_moe_layer (the loader every checkpoint goes through), widened back
    // into trainable f32 tensors.
    const MoeLayer layer = load_moe_layer(dir, ck.config.block, l);
    ck.params.blocks.push_back(trainable_parameters(layer));
    if (ck.config.block.router.has_selection_bias)
      ck.selection_biases[static_cast<std::size_t>(l)] = layer.weights().selection_bias.clone();
  }
  detail::StateFile st = detail::read_state_file(dir, optimizer, "load_lm_checkpoint");
  ck.optimizer = optimizer;
  ck.optimizer.load_state(st.tensors, st.optimizer_steps, ck.params.named());
  ck.state = st.state;
  return ck;
}

}  // namespace moekit
