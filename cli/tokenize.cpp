// `moekit tokenize`: text to a model's token ids (or ids back to text) with the model's own
// tokenizer (moekit/tokenizer.hpp). Reads only the GGUF metadata or the folder's tokenizer files,
// never the weights.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "format.hpp"
#include "moekit/tokenizer.hpp"

namespace moekit::cli {

namespace {

struct TokenizeOptions {
  std::string model, text, text_file, ids, output = "text";
  bool no_special = false;
  CLI::Option *text_option = nullptr, *file_option = nullptr, *ids_option = nullptr;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("[moekit tokenize] --text-file '" + path + "' cannot be read");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw std::runtime_error("[moekit tokenize] --text-file '" + path + "': read error");
  return os.str();
}

// JSON text: a byte sequence that is not UTF-8 (a piece inside a character) comes out with U+FFFD.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void run(const TokenizeOptions& opt) {
  const int given = static_cast<int>(opt.text_option->count() + opt.file_option->count() + opt.ids_option->count());
  if (given != 1) throw std::invalid_argument("[moekit tokenize] give one of --text, --text-file or --ids");
  // The command line is checked before the model is read.
  const std::vector<std::int32_t> ids =
      opt.ids_option->count() ? parse_token_ids(opt.ids, "[moekit tokenize] --ids") : std::vector<std::int32_t>();
  const std::string text = opt.file_option->count() ? read_file(opt.text_file) : opt.text;
  const std::shared_ptr<const Tokenizer> tok = Tokenizer::open(opt.model);
  const bool json = opt.output == "json";
  if (opt.ids_option->count()) {
    const std::string decoded = tok->decode(ids, /*skip_special=*/opt.no_special);
    if (json)
      std::cout << dump({{"text", decoded}}) << std::endl;
    else
      std::cout << decoded << std::endl;
    return;
  }
  const std::vector<std::int32_t> out = tok->encode(text, !opt.no_special, !opt.no_special);
  if (json) {
    std::vector<std::string> pieces;
    pieces.reserve(out.size());
    for (const std::int32_t id : out) pieces.push_back(tok->token_bytes(id));
    std::cout << dump({{"ids", out}, {"pieces", pieces}}) << std::endl;
    return;
  }
  std::string line;
  for (const std::int32_t id : out) line += (line.empty() ? "" : " ") + std::to_string(id);
  std::cout << line << std::endl;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Turn text into a model's token ids, or ids into text");
  cmd->add_option("--model", opt->model,
                  "GGUF file (any part of a split model; a vocabulary-only file will do) or a folder with "
                  "tokenizer.json")
      ->required();
  opt->text_option = cmd->add_option("--text", opt->text, "Text to tokenize");
  opt->file_option = cmd->add_option("--text-file", opt->text_file, "File whose bytes are tokenized (newlines too)");
  opt->ids_option = cmd->add_option("--ids", opt->ids, "Token ids to turn back into text: 1,2,3");
  opt->text_option->excludes(opt->file_option)->excludes(opt->ids_option);
  opt->file_option->excludes(opt->text_option)->excludes(opt->ids_option);
  opt->ids_option->excludes(opt->text_option)->excludes(opt->file_option);
  cmd->add_flag("--no-special", opt->no_special,
                "No BOS/EOS added, special tokens in the text read as text (with --ids: special tokens left out)");
  cmd->add_option("-o,--output", opt->output, "text (default: the ids on one line) or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([opt] { run(*opt); });
}

}  // namespace moekit::cli
