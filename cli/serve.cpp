// `moekit serve`: the OpenAI-compatible server, which is Python (moekit.serve: jinja2 renders the
// chat templates as transformers does; the engine's decode steps release the GIL) — this command
// checks its options as every command does and runs `python -m moekit.serve` with them, the build
// tree's package first on PYTHONPATH where moekit was built with its Python module (docs/serve.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"

namespace moekit::cli {

namespace {

// The interpreter: MOEKIT_PYTHON, else the one the Python module was built for, else python3.
std::string interpreter() {
  if (const char* env = std::getenv("MOEKIT_PYTHON"); env != nullptr && *env != '\0') return env;
#ifdef MOEKIT_SERVE_PYTHON
  if (std::filesystem::exists(MOEKIT_SERVE_PYTHON)) return MOEKIT_SERVE_PYTHON;
#endif
  return "python3";
}

// Runs `python -m <module> args...` in place of this process.
[[noreturn]] void run_python(const std::string& module, const std::vector<std::string>& args) {
#ifdef MOEKIT_SERVE_PYTHONPATH
  if (std::filesystem::exists(std::string(MOEKIT_SERVE_PYTHONPATH) + "/moekit/serve.py")) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path =
        std::string(MOEKIT_SERVE_PYTHONPATH) + (old != nullptr && *old != '\0' ? std::string(":") + old : "");
    setenv("PYTHONPATH", path.c_str(), 1);
  }
#endif
  const std::string python = interpreter();
  std::vector<std::string> argv = {python, "-m", module};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  execvp(raw[0], raw.data());
  throw std::runtime_error("cannot run " + python + " (" + std::strerror(errno) + "): " + module +
                           " is Python; set MOEKIT_PYTHON to an interpreter that has the moekit package and jinja2");
}

struct ChatTemplateOptions {
  std::string model, tmpl, messages, bos, eos;
  bool no_generation_prompt = false;
};

struct ServeOptions {
  std::string model, host = "127.0.0.1", mode = "auto", api_key;
  int port = 8080, parallel = 4, threads = 0;
  std::int64_t ctx = 0;
};

}  // namespace

void register_serve(CLI::App& app) {
  auto opt = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve a whole model over the OpenAI API (/v1/completions, /v1/chat/completions), batching requests");
  cmd->add_option("--model", opt->model, "GGUF file or release folder")->required();
  cmd->add_option("--host", opt->host, "address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", opt->port, "port (default 8080; 0: any free one)")->check(CLI::Range(0, 65535));
  cmd->add_option("--parallel", opt->parallel, "requests decoding together (default 4)")->check(CLI::Range(1, 256));
  cmd->add_option("--ctx", opt->ctx, "context of each request's sequence (default 0: the model's, up to 4096)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 24));
  cmd->add_option("--threads", opt->threads, "compute threads (default 0: moekit's default)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--mode", opt->mode, "compute mode: auto (the file's own), exact, int8 or bf16")
      ->check(CLI::IsMember({"auto", "exact", "int8", "bf16"}));
  cmd->add_option("--api-key", opt->api_key, "require 'Authorization: Bearer KEY' (default: none)");
  cmd->footer(
      "The server is Python (moekit.serve); this runs python -m moekit.serve with the interpreter in "
      "$MOEKIT_PYTHON, else the one moekit's Python module was built for, else python3.");
  cmd->callback([opt] {
    std::vector<std::string> args = {"--model",    opt->model,
                                     "--host",     opt->host,
                                     "--port",     std::to_string(opt->port),
                                     "--parallel", std::to_string(opt->parallel),
                                     "--ctx",      std::to_string(opt->ctx),
                                     "--threads",  std::to_string(opt->threads),
                                     "--mode",     opt->mode};
    if (!opt->api_key.empty()) {
      args.push_back("--api-key");
      args.push_back(opt->api_key);
    }
    run_python("moekit.serve", args);
  });
}

void register_chat_template(CLI::App& app) {
  auto opt = std::make_shared<ChatTemplateOptions>();
  auto* cmd = app.add_subcommand(
      "chat-template", "Print a conversation rendered by a model's chat template, as transformers renders it");
  auto* model = cmd->add_option("--model", opt->model, "GGUF file or release folder whose template to use");
  cmd->add_option("--template", opt->tmpl, "a Jinja template file instead of a model's")->excludes(model);
  cmd->add_option("--messages", opt->messages, "JSON file: a list of messages, or an object with messages (and tools)")
      ->required();
  cmd->add_flag("--no-generation-prompt", opt->no_generation_prompt,
                "render without the assistant's turn opened (add_generation_prompt false)");
  cmd->add_option("--bos-token", opt->bos, "bos_token's text (default: the model's; with --template none)");
  cmd->add_option("--eos-token", opt->eos, "eos_token's text (default: the model's; with --template none)");
  cmd->footer("Runs python -m moekit.chat (jinja2 in transformers' environment; docs/serve.md).");
  cmd->callback([opt] {
    if (opt->model.empty() && opt->tmpl.empty())
      throw std::invalid_argument("[moekit chat-template] give --model or --template");
    std::vector<std::string> args = {"--messages", opt->messages};
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--model", &opt->model},
                                      {"--template", &opt->tmpl},
                                      {"--bos-token", &opt->bos},
                                      {"--eos-token", &opt->eos}})
      if (!value->empty()) {
        args.push_back(flag);
        args.push_back(*value);
      }
    if (opt->no_generation_prompt) args.push_back("--no-generation-prompt");
    run_python("moekit.chat", args);
  });
}

}  // namespace moekit::cli
