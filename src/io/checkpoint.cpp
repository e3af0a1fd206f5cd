// save_block_checkpoint / load_training_state: a trained block as a loadable checkpoint folder,
// and the optimizer/balancer/step state beside it (docs/training.md, "Checkpoints").
#include "moekit/checkpoint.hpp"

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "util/error.hpp"

namespace moekit {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "moekit-training-state";
constexpr const char* kVersion = "1";

using Named = std::vector<std::pair<std::string, Tensor>>;

void write_safetensors(const std::string& path, const Named& tensors, const std::map<std::string, std::string>& meta) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors)
    entries.push_back({name, t.dtype() == DType::i32 ? "I32" : "F32", t.shape(), t.nbytes()});
  SafetensorsWriter w(path, entries, meta);
  for (const auto& [name, t] : tensors) w.write(t.data(), t.nbytes());
  w.commit();
}

void fail_io(const char* who, const std::string& what, const fs::path& p, const std::error_code& ec) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::" << who << "] cannot " << what << " '" << p.string()
                                                 << "': " << ec.message()));
}

void write_text(const fs::path& path, const std::string& text, const char* who) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(MOEKIT_MSG("[moekit::" << who << "] cannot write '" << path.string() << "'"));
}

// Writes folder `dir` atomically: fill(partial) writes every file under `<dir>.partial`; an
// existing `dir` is moved to `<dir>.old`, the new folder renamed into place, then `<dir>.old`
// removed. The last complete checkpoint is under dir or dir.old at every instant.
template <class Fill>
void write_folder(const std::string& dir, const char* who, Fill&& fill) {
  const fs::path final_dir(dir), partial(dir + ".partial"), old(dir + ".old");
  std::error_code ec;
  fs::remove_all(partial, ec);
  if (!fs::create_directories(partial, ec) && ec) fail_io(who, "create", partial, ec);
  try {
    fill(partial);
  } catch (...) {
    fs::remove_all(partial, ec);
    throw;
  }
  fs::remove_all(old, ec);
  const bool had = fs::exists(final_dir, ec);
  if (had) {
    fs::rename(final_dir, old, ec);
    if (ec) fail_io(who, "move the previous checkpoint aside from", final_dir, ec);
  }
  fs::rename(partial, final_dir, ec);
  if (ec) {
    std::error_code ec2;
    if (had) fs::rename(old, final_dir, ec2);
    fail_io(who, "move the new checkpoint into place at", final_dir, ec);
  }
  if (had) fs::remove_all(old, ec);
}

// The training state's metadata (kTrainingStateFile).
std::map<std::string, std::string> state_meta(const Optimizer& opt, const TrainingState& st, const std::string& balancer) {
  return {{"format", kFormat},
          {"version", kVersion},
          {"step", std::to_string(st.step)},
          {"rng_state", std::to_string(st.rng_state)},
          {"optimizer", opt.kind() == Optimizer::Kind::adamw ? "adamw" : "sgd"},
          {"optimizer_steps", std::to_string(opt.steps())},
          {"balancer", balancer},
          {"user", st.user_json}};
}

// A training state file read and checked against `optimizer`'s kind: its tensors, step, RNG
// state, optimizer steps and user JSON.
struct StateFile {
  Named tensors;
  TrainingState state;
  std::int64_t optimizer_steps = 0;
};

StateFile read_state_file(const std::string& dir, const Optimizer& optimizer, const char* who) {
  const std::string path = (fs::path(dir) / kTrainingStateFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    const bool old = fs::exists(fs::path(dir + ".old") / kTrainingStateFile, ec);
    throw std::runtime_error(MOEKIT_MSG("[moekit::" << who << "] '" << path << "' does not exist"
                                                    << (old ? " (an interrupted save left the previous checkpoint at '" +
                                                                  dir + ".old')"
                                                            : "")));
  }
  const auto file = SafetensorsFile::open(path);  // a truncated or malformed file throws here, naming it
  const auto& meta = file->metadata();
  const auto get = [&](const std::string& key) -> const std::string& {
    const auto it = meta.find(key);
    if (it == meta.end())
      throw std::invalid_argument(MOEKIT_MSG("[moekit::" << who << "] " << path << ": no '" << key
                                                         << "' in its metadata: not a moekit training state"));
    return it->second;
  };
  if (get("format") != kFormat)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << who << "] " << path << ": format '" << get("format")
                                                       << "', expected '" << kFormat
                                                       << "': not a moekit training state"));
  if (get("version") != kVersion)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << who << "] " << path << ": version " << get("version")
                                                       << ", this moekit reads version " << kVersion));
  const std::string kind = optimizer.kind() == Optimizer::Kind::adamw ? "adamw" : "sgd";
  if (get("optimizer") != kind)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::" << who << "] " << path << ": saved with optimizer '"
                                                       << get("optimizer") << "', resuming with '" << kind << "'"));
  const auto number = [&](const std::string& key) {
    const std::string& v = get(key);
    std::size_t used = 0;
    unsigned long long n = 0;
    try {
      n = std::stoull(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v.size())
      throw std::invalid_argument(MOEKIT_MSG("[moekit::" << who << "] " << path << ": '" << key << "' is '" << v
                                                         << "', not a number"));
    return n;
  };
  StateFile out;
  out.state.step = static_cast<std::int64_t>(number("step"));
  out.state.rng_state = number("rng_state");
  out.optimizer_steps = static_cast<std::int64_t>(number("optimizer_steps"));
  out.state.user_json = get("user");
  for (const std::string& name : file->names()) {
    const TensorInfo& info = file->info(name);
    const bool is_counts = name.rfind("balancer.counts", 0) == 0;
    if (info.dtype_name != (is_counts ? "I32" : "F32"))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::" << who << "] " << path << ": tensor '" << name
                                                         << "' has dtype " << info.dtype_name));
    Tensor t(info.shape, is_counts ? DType::i32 : DType::f32);
    if (t.nbytes() > 0) std::memcpy(t.data(), file->bytes(name), t.nbytes());
    out.tensors.emplace_back(name, t);
  }
  return out;
}

}  // namespace

void save_block_checkpoint(const std::string& dir, const std::string& config_json, const MoeConfig& config,
                           const StoredLayout& where, const MoeTensors& params, const Tensor& selection_bias,
                           const BlockTrainingState* training) {
  const std::int64_t E = config.router.num_experts;
  if (config.router.has_selection_bias &&
      (selection_bias.dtype() != DType::f32 || selection_bias.shape() != Shape{E}))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::save_block_checkpoint] selection_bias must be f32 [" << E
                                                                                                        << "], got "
                                                                                                        << shape_str(selection_bias.shape())));
  if (training && !training->optimizer)
    throw std::invalid_argument("[moekit::save_block_checkpoint] training state given without an optimizer");
  // Validated as JSON here, before anything is written, so that a bad string never fails a resume.
  if (training && !nlohmann::json::accept(training->state.user_json))
    throw std::invalid_argument("[moekit::save_block_checkpoint] state.user_json is not valid JSON");
  Named tensors = stored_tensors(config, where, params);  // validates shapes first
  if (config.router.has_selection_bias)
    tensors.emplace_back(where.block + "." + config.names.selection_bias, selection_bias);
  write_folder(dir, "save_block_checkpoint", [&](const fs::path& partial) {
    write_text(partial / "config.json", config_json, "save_block_checkpoint");
    write_safetensors((partial / "model.safetensors").string(), tensors, {{"format", "pt"}});
    if (!training) return;
    const Optimizer& opt = *training->optimizer;
    Named st = opt.state();
    if (training->balancer) {
      const auto& c = training->balancer->counts();
      Tensor counts({static_cast<std::int64_t>(c.size())}, DType::i32);
      for (std::size_t i = 0; i < c.size(); ++i) {
        if (c[i] > INT32_MAX)
          throw std::invalid_argument("[moekit::save_block_checkpoint] a balancer count exceeds int32");
        counts.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(c[i]);
      }
      st.emplace_back("balancer.counts", counts);
    }
    if (training->selection_bias.numel() > 0) st.emplace_back("selection_bias", training->selection_bias);
    const std::string balancer =
        training->balancer ? (training->balancer->rule() == BalanceRule::sign ? "sign" : "proportional") : "none";
    write_safetensors((partial / kTrainingStateFile).string(), st, state_meta(opt, training->state, balancer));
  });
}

void load_training_state(const std::string& dir, const MoeTensors& params, Optimizer& optimizer,
                         LoadBalancer* balancer, Tensor& selection_bias, TrainingState& state) {
  const std::string path = (fs::path(dir) / kTrainingStateFile).string();
  StateFile file = read_state_file(dir, optimizer, "load_training_state");
  const TrainingState& st = file.state;
  const std::int64_t opt_steps = file.optimizer_steps;
  Named opt_state;
  Tensor counts, bias;
  for (auto& [name, t] : file.tensors) {
    if (name == "balancer.counts") {
      counts = t;
    } else if (name == "selection_bias") {
      bias = t;
    } else {
      opt_state.emplace_back(name, t);
    }
  }
  if (balancer && counts.numel() != balancer->num_experts())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::load_training_state] " << path << ": "
                                                                            << (counts.numel() ? "balancer counts for " +
                                                                                                     std::to_string(counts.numel()) +
                                                                                                     " experts"
                                                                                               : std::string("no balancer counts"))
                                                                            << ", the balancer has "
                                                                            << balancer->num_experts()));
  // Validates the optimizer state against params (throws before changing anything) ...
  Optimizer loaded = optimizer;
  loaded.load_state(opt_state, opt_steps, params);
  // ... then everything is applied.
  optimizer = loaded;
  if (balancer) {
    std::vector<std::int64_t> c(static_cast<std::size_t>(counts.numel()));
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = counts.data_as<std::int32_t>()[i];
    LoadBalancer fresh(balancer->num_experts(), balancer->rule(), balancer->schedule());
    fresh.add_counts(c);
    *balancer = fresh;
  }
  if (bias.numel() > 0) selection_bias = bias;
  state = st;
}

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
    throw std::invalid_argument("[moekit::parse_lm_config] no \"moekit_lm\" object: not a language model written by "
                                "moekit train");
  const nlohmann::json& m = j.at("moekit_lm");
  const auto integer = [&](const char* key) {
    if (!m.contains(key) || !m.at(key).is_number_integer())
      throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_lm_config] moekit_lm." << key << " must be an integer"));
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

StoredLayout natural_layout(const MoeConfig& config, std::int64_t layer) {
  StoredLayout w;
  w.block = config.names.block;
  const auto at = w.block.find("{L}");
  if (at != std::string::npos) w.block.replace(at, 3, std::to_string(layer));
  w.layout = !config.names.fused_transposed      ? "per_expert"
             : config.names.fused_interleaved ? "fused_gate_up_transposed_interleaved"
                                              : "fused_gate_up_transposed";
  return w;
}

std::vector<std::pair<std::string, Tensor>> lm_stored_tensors(const LmConfig& config, const LmParams& params,
                                                              const std::vector<Tensor>& selection_biases) {
  Named out{{"model.embed_tokens.weight", params.embed}, {"model.context_proj.weight", params.context_proj}};
  for (std::int64_t l = 0; l < config.layers(); ++l) {
    const auto li = static_cast<std::size_t>(l);
    out.emplace_back("model.layers." + std::to_string(l) + ".post_attention_layernorm.weight", params.norms.at(li));
    const StoredLayout where = natural_layout(config.block, l);
    Named block = stored_tensors(config.block, where, params.blocks.at(li));
    out.insert(out.end(), block.begin(), block.end());
    if (config.block.router.has_selection_bias)
      out.emplace_back(where.block + "." + config.block.names.selection_bias, selection_biases.at(li));
  }
  out.emplace_back("model.norm.weight", params.final_norm);
  out.emplace_back("lm_head.weight", params.head);
  return out;
}

void save_lm_checkpoint(const std::string& dir, const std::string& config_json, const LmConfig& config,
                        const LmParams& params, const std::vector<Tensor>& selection_biases,
                        const Optimizer& optimizer, const TrainingState& state) {
  if (!nlohmann::json::accept(state.user_json))
    throw std::invalid_argument("[moekit::save_lm_checkpoint] state.user_json is not valid JSON");
  const Named tensors = lm_stored_tensors(config, params, selection_biases);  // validates shapes first
  write_folder(dir, "save_lm_checkpoint", [&](const fs::path& partial) {
    write_text(partial / "config.json", config_json, "save_lm_checkpoint");
    write_safetensors((partial / "model.safetensors").string(), tensors, {{"format", "pt"}});
    write_safetensors((partial / kTrainingStateFile).string(), optimizer.state(), state_meta(optimizer, state, "lm"));
  });
}

LmCheckpoint load_lm_checkpoint(const std::string& dir, const Optimizer& optimizer) {
  const fs::path config_path = fs::path(dir) / "config.json";
  std::ifstream in(config_path, std::ios::binary);
  if (!in)
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] cannot read '" << config_path.string() << "'"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LmCheckpoint ck{};
  try {
    ck.config = parse_lm_config(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(MOEKIT_MSG(config_path.string() << ": " << e.what()));
  }
  ck.config_json = text;
  const std::int64_t V = ck.config.vocab, D = ck.config.dim(), N = ck.config.context, L = ck.config.layers();
  const std::string model_path = (fs::path(dir) / "model.safetensors").string();
  const auto file = SafetensorsFile::open(model_path);
  // Everything moekit train writes is f32; the blocks' names and shapes are checked by
  // load_moe_layer below, the rest here.
  for (const std::string& name : file->names())
    if (file->info(name).dtype_name != "F32")
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] " << model_path << ": '" << name << "' is "
                                                                          << file->info(name).dtype_name
                                                                          << ", expected F32"));
  const auto read = [&](const std::string& name, const Shape& shape) {
    if (!file->contains(name))
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] " << model_path << ": no tensor '" << name
                                                                          << "'"));
    if (file->info(name).shape != shape)
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_lm_checkpoint] " << model_path << ": '" << name << "' is "
                                                                          << shape_str(file->info(name).shape)
                                                                          << ", expected " << shape_str(shape)));
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
    ck.params.norms.push_back(read("model.layers." + std::to_string(l) + ".post_attention_layernorm.weight", {D}));
    // The block through load_moe_layer (the loader every checkpoint goes through), widened back
    // into trainable f32 tensors.
    const MoeLayer layer = load_moe_layer(dir, ck.config.block, l);
    ck.params.blocks.push_back(trainable_parameters(layer));
    if (ck.config.block.router.has_selection_bias)
      ck.selection_biases[static_cast<std::size_t>(l)] = layer.weights().selection_bias.clone();
  }
  StateFile st = read_state_file(dir, optimizer, "load_lm_checkpoint");
  ck.optimizer = optimizer;
  ck.optimizer.load_state(st.tensors, st.optimizer_steps, ck.params.named());
  ck.state = st.state;
  return ck;
}

}  // namespace moekit
