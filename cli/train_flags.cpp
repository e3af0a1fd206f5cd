// `moekit train`'s flags: the options they make, the flags a checkpoint keeps and restores on
// --resume, and every check of flags, data and output paths, made before anything is computed
// or written.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "train_parts.hpp"

namespace moekit::cli::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

template <class T>
void bind_flag(std::vector<Saved>& out, const std::string& flag, T& var) {
  out.push_back({flag, [&var] { return json(var); }, [&var](const json& j) { var = j.get<T>(); }});
}

const char* const kModelFlags[] = {"--family", "--layers",       "--dim",    "--experts",
                                   "--top-k",  "--expert-width", "--shared", "--context"};

}  // namespace

std::vector<Saved> saved_flags(TrainFlags& f) {
  std::vector<Saved> s;
  bind_flag(s, "data", f.data);
  bind_flag(s, "steps", f.steps);
  bind_flag(s, "batch-tokens", f.batch_tokens);
  bind_flag(s, "micro-batches", f.micro_batches);
  bind_flag(s, "seq-len", f.seq_len);
  bind_flag(s, "lr", f.lr);
  bind_flag(s, "warmup", f.warmup);
  bind_flag(s, "optimizer", f.optimizer);
  bind_flag(s, "balance", f.balance);
  bind_flag(s, "bias-rate", f.bias_rate);
  bind_flag(s, "bias-freeze-step", f.bias_freeze_step);
  bind_flag(s, "aux-coef", f.aux_coef);
  bind_flag(s, "z-loss", f.z_loss);
  bind_flag(s, "clip", f.clip);
  bind_flag(s, "init-collapsed", f.init_collapsed);
  bind_flag(s, "recompute", f.recompute);
  bind_flag(s, "eval-every", f.eval_every);
  bind_flag(s, "eval-tokens", f.eval_tokens);
  bind_flag(s, "save-every", f.save_every);
  bind_flag(s, "seed", f.seed);
  return s;
}

LmTrainOptions train_options(const TrainFlags& f) {
  LmTrainOptions o;
  o.steps = f.steps;
  o.batch_tokens = f.batch_tokens;
  o.seq_len = f.seq_len;
  o.micro_batches = f.micro_batches;
  o.lr.lr = f.lr;
  o.lr.warmup = f.warmup;
  o.lr.total_steps = f.steps;
  o.lr.min_lr = f.lr / 10;
  o.lr.decay = f.steps > f.warmup ? LrSchedule::Decay::cosine : LrSchedule::Decay::constant;
  if (f.optimizer == "adamw") {
    o.optimizer = Optimizer::Kind::adamw;
  } else if (f.optimizer == "sgd") {
    o.optimizer = Optimizer::Kind::sgd;
  } else {
    throw std::invalid_argument(kPrefix + "--optimizer '" + f.optimizer +
                                "' is not one of adamw, sgd");
  }
  try {
    o.balance = parse_balance_mode(f.balance);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(kPrefix + "--balance: " + e.what());
  }
  o.bias_rate.rate = f.bias_rate;
  o.bias_rate.freeze_step = f.bias_freeze_step;
  o.aux_coef = f.aux_coef;
  o.z_coef = f.z_loss;
  o.clip = f.clip;
  o.init_collapsed = f.init_collapsed;
  o.keep_pre_activations = !f.recompute;
  o.eval_every = f.eval_every;
  o.eval_tokens = f.eval_tokens;
  o.seed = f.seed;
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(kPrefix + e.what());
  }
  return o;
}

bool loss_free(const std::string& balance) { return balance.rfind("loss_free", 0) == 0; }

namespace {

// The block's config.json for the model flags (a selection bias added for loss-free balancing).
std::string block_json(const TrainFlags& f) {
  BlockShape s;
  s.hidden_size = f.dim;
  s.num_experts = f.experts;
  s.top_k = f.top_k;
  s.expert_width = f.expert_width;
  s.shared_experts = f.shared;
  s.num_layers = f.layers;
  s.selection_bias = loss_free(f.balance);
  try {
    return preset_config_json(f.family, s);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(kPrefix + e.what());
  }
}

void check_parent_exists(const std::string& path, const char* option) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw std::invalid_argument(kPrefix + option + " '" + path + "': folder '" + parent.string() +
                                "' does not exist");
  if (fs::is_directory(path, ec) && std::string(option) == "--csv")
    throw std::invalid_argument(kPrefix + "--csv '" + path + "' is a folder");
}

// A folder that is created with its missing parents when the run starts: what exists of its
// path must be folders.
void check_folder_creatable(const std::string& path, const char* option) {
  std::error_code ec;
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec))
        throw std::invalid_argument(kPrefix + option + " '" + path + "': '" + p.string() +
                                    "' is not a folder");
      return;
    }
    if (p == p.parent_path()) return;
  }
}

// --resume: the checkpoint's config.json, and the flags of the run that wrote it restored into
// `f` where `app` was not given them again.
std::string resumed_config_json(TrainFlags& f, const CLI::App* app) {
  for (const char* flag : kModelFlags)
    if (app && app->count(flag) > 0)
      throw std::invalid_argument(kPrefix + std::string(flag) +
                                  " cannot be given with --resume: the model comes "
                                  "from the checkpoint's config.json");
  std::ifstream in(fs::path(f.resume) / "config.json");
  if (!in)
    throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': no config.json there");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json saved_user = [&] {
    // The flags of the run that wrote the checkpoint, restored unless given again.
    const std::string state_path = (fs::path(f.resume) / kTrainingStateFile).string();
    if (!fs::exists(state_path))
      throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': no " +
                                  kTrainingStateFile + " there");
    const auto file = SafetensorsFile::open(state_path);
    const auto it = file->metadata().find("user");
    if (it == file->metadata().end() || !json::accept(it->second))
      throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': " + kTrainingStateFile +
                                  " holds no flags of moekit train");
    return json::parse(it->second);
  }();
  if (!saved_user.contains("flags") || !saved_user.at("flags").is_object())
    throw std::invalid_argument(kPrefix + "--resume '" + f.resume +
                                "': not written by moekit train");
  for (const Saved& s : saved_flags(f))
    if ((!app || app->count("--" + s.flag) == 0) && saved_user.at("flags").contains(s.flag)) {
      try {
        s.set(saved_user.at("flags").at(s.flag));
      } catch (const json::exception&) {
        throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': saved flag --" +
                                    s.flag + " is malformed");
      }
    }
  return text;
}

}  // namespace

std::string user_json(TrainFlags& f, const TextCorpus& corpus) {
  json j;
  json opts;
  for (const Saved& s : saved_flags(f)) opts[s.flag] = s.get();
  j["flags"] = opts;
  j["data_files"] = corpus.files;
  j["data_bytes"] = corpus.bytes;
  return j.dump();
}

RunPaths paths_for(const TrainFlags& f) {
  RunPaths p;
  p.csv = f.csv;
  p.save = f.save;
  if (!f.plot.empty()) {
    p.plot_dir = f.plot;
    if (p.csv.empty()) p.csv = (fs::path(f.plot) / "train.csv").string();
    p.load = (fs::path(f.plot) / "load.csv").string();
    p.bias = (fs::path(f.plot) / "bias.csv").string();
  }
  return p;
}

RunSetup prepare_run(TrainFlags& f, const CLI::App* app, const RunPaths& paths) {
  RunSetup r;
  if (!f.resume.empty()) {
    r.config_json = resumed_config_json(f, app);
    try {
      r.config = parse_lm_config(r.config_json);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': " + e.what());
    }
  }
  r.options = train_options(f);
  if (f.resume.empty()) {
    const std::string bj = block_json(f);
    r.config.block = parse_hf_config(bj);
    r.config.vocab = 256;
    r.config.context = f.context;
    try {
      r.config.validate();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(kPrefix + e.what());
    }
    r.config_json = lm_config_json(r.config, bj);
  }
  if (f.data.empty()) f.data = {kDefaultCorpus};
  try {
    r.corpus = load_text_corpus(f.data);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(
        kPrefix + "--data: " + e.what() +
        (f.data.size() == 1 && f.data[0] == kDefaultCorpus
             ? std::string(" (the default text; pass --data FILE_OR_FOLDER)")
             : std::string()));
  }
  if (!paths.plot_dir.empty()) check_folder_creatable(paths.plot_dir, "--plot");
  if (!paths.csv.empty() && fs::path(paths.csv).parent_path() != fs::path(paths.plot_dir))
    check_parent_exists(paths.csv, "--csv");
  if (!paths.save.empty()) check_parent_exists(paths.save, "--save");
  return r;
}

}  // namespace moekit::cli::train
