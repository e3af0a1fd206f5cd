// The training checkpoint of one block (save_block_checkpoint / load_training_state: a trained
// block as a loadable checkpoint folder, and the optimizer/balancer/step state beside it), the
// checkpoint-folder parts the language model's checkpoint shares (checkpoint_files.hpp), and
// natural_layout (docs/training.md, "Checkpoints").
//
// The block's checkpoint stays here in io rather than in train: it is a file format (names,
// layouts, the state file's metadata) over the block's training types, as stored_tensors is.
#include "moekit/checkpoint.hpp"

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/checkpoint_files.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"

namespace moekit {

namespace fs = std::filesystem;

namespace detail {

namespace {

constexpr const char* kFormat = "moekit-training-state";
constexpr const char* kVersion = "1";

void fail_io(const char* who, const std::string& what, const fs::path& p, const std::error_code& ec) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::" << who << "] cannot " << what << " '" << p.string()
                                                 << "': " << ec.message()));
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& meta) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors)
    entries.push_back({name, t.dtype() == DType::i32 ? "I32" : "F32", t.shape(), t.nbytes()});
  SafetensorsWriter w(path, entries, meta);
  for (const auto& [name, t] : tensors) w.write(t.data(), t.nbytes());
  w.commit();
}

void write_text(const fs::path& path, const std::string& text, const char* who) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(MOEKIT_MSG("[moekit::" << who << "] cannot write '" << path.string() << "'"));
}

void write_folder(const std::string& dir, const char* who, const std::function<void(const fs::path& partial)>& fill) {
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

}  // namespace detail

void save_block_checkpoint(const std::string& dir, const std::string& config_json, const MoeConfig& config,
                           const StoredLayout& where, const MoeTensors& params, const Tensor& selection_bias,
                           const BlockTrainingState* training) {
  const std::int64_t E = config.router.num_experts;
  if (config.router.has_selection_bias)
    detail::expect_tensor("save_block_checkpoint", "selection_bias", selection_bias, {DType::f32}, {E});
  if (training && !training->optimizer)
    throw std::invalid_argument("[moekit::save_block_checkpoint] training state given without an optimizer");
  // Validated as JSON here, before anything is written, so that a bad string never fails a resume.
  if (training && !nlohmann::json::accept(training->state.user_json))
    throw std::invalid_argument("[moekit::save_block_checkpoint] state.user_json is not valid JSON");
  NamedTensors tensors = stored_tensors(config, where, params);  // validates shapes first
  if (config.router.has_selection_bias)
    tensors.emplace_back(where.block + "." + config.names.selection_bias, selection_bias);
  detail::write_folder(dir, "save_block_checkpoint", [&](const fs::path& partial) {
    detail::write_text(partial / "config.json", config_json, "save_block_checkpoint");
    detail::write_safetensors((partial / "model.safetensors").string(), tensors, {{"format", "pt"}});
    if (!training) return;
    const Optimizer& opt = *training->optimizer;
    NamedTensors st = opt.state();
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
    detail::write_safetensors((partial / kTrainingStateFile).string(), st, detail::state_meta(opt, training->state, balancer));
  });
}

void load_training_state(const std::string& dir, const MoeTensors& params, Optimizer& optimizer,
                         LoadBalancer* balancer, Tensor& selection_bias, TrainingState& state) {
  const std::string path = (fs::path(dir) / kTrainingStateFile).string();
  detail::StateFile file = detail::read_state_file(dir, optimizer, "load_training_state");
  const TrainingState& st = file.state;
  const std::int64_t opt_steps = file.optimizer_steps;
  NamedTensors opt_state;
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

}  // namespace moekit
