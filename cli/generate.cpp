// `moekit generate`: a whole model continues a prompt (moekit/causal_lm.hpp). Text streams to
// stdout as it is made; -o json prints one object at the end.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "format.hpp"
#include "moekit/causal_lm.hpp"
#include "moekit/tokenizer.hpp"

namespace moekit::cli {

namespace {

struct GenerateOptions {
  std::string model, prompt, prompt_ids, output = "text";
  std::int64_t max_tokens = 128, ctx = 0;
  SamplingParams sampling;
  bool int8 = false, bf16 = false, exact = false;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

std::vector<std::int32_t> parse_ids(const std::string& text) {
  std::vector<std::int32_t> ids = parse_token_ids(text, "[moekit generate] --prompt-ids");
  if (ids.empty()) throw std::invalid_argument("[moekit generate] --prompt-ids: no ids");
  return ids;
}

void run(const GenerateOptions& opt) {
  apply_threads_option(opt.threads_option, opt.threads);
  LmOptions lo;
  lo.ctx = opt.ctx;
  if (opt.exact) lo.mode = ComputeMode::exact;
  if (opt.int8) lo.mode = ComputeMode::int8;
  if (opt.bf16) lo.mode = ComputeMode::bf16;  // none of the three: the file's own (LmOptions::mode)
  validate(opt.sampling);
  std::vector<std::int32_t> prompt;
  if (!opt.prompt_ids.empty()) prompt = parse_ids(opt.prompt_ids);
  const std::shared_ptr<CausalLm> lm = CausalLm::open(opt.model, lo);
  const std::shared_ptr<const Tokenizer> tok = lm->tokenizer();
  if (prompt.empty()) {
    if (!tok)
      throw std::invalid_argument("[moekit generate] --prompt needs the model's tokenizer; " + opt.model + " has " +
                                  lm->info().tokenizer + " (give --prompt-ids)");
    prompt = tok->encode(opt.prompt);
    if (prompt.empty()) throw std::invalid_argument("[moekit generate] --prompt: the text gives no tokens");
  }
  const bool json = opt.output == "json";
  // Text output: the generated text as it is made, whole UTF-8 characters at a time (ids, space
  // separated, for a model without a tokenizer).
  std::optional<TextStream> stream;
  if (tok) stream.emplace(tok);
  std::string text;
  GenerateTimings tm;
  const std::vector<std::int32_t> ids = lm->generate(
      prompt, opt.max_tokens, opt.sampling,
      [&](std::int32_t id) {
        if (stream) {
          const std::string piece = stream->push(id);
          text += piece;
          if (!json) std::cout << piece << std::flush;
        } else if (!json) {
          std::cout << id << ' ' << std::flush;
        }
        return true;
      },
      &tm);
  if (stream) {
    const std::string rest = stream->flush();
    text += rest;
    if (!json) std::cout << rest;
  }
  if (json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["ids"] = ids;
    if (tok) j["text"] = text;
    j["timings"] = {
        {"prefill_ms", tm.prefill_ms},
        {"prefill_tokens_per_s", tm.prefill_ms > 0 ? 1e3 * tm.prompt_tokens / tm.prefill_ms : 0.0},
        {"decode_tokens_per_s",
         tm.decode_ms > 0 && tm.generated_tokens > 1 ? 1e3 * (tm.generated_tokens - 1) / tm.decode_ms : 0.0}};
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << std::endl;
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a whole model (GGUF or release folder)");
  cmd->add_option("--model", opt->model, "GGUF file (a split model from any part) or a release folder")->required();
  auto* text = cmd->add_option("--prompt", opt->prompt, "Prompt text (tokenized with the model's tokenizer)");
  auto* ids = cmd->add_option("--prompt-ids", opt->prompt_ids, "Prompt as token ids: 1,2,3");
  text->excludes(ids);
  ids->excludes(text);
  cmd->add_option("--max-tokens", opt->max_tokens, "Tokens to generate at most (default 128)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 24));
  cmd->add_option("--temperature", opt->sampling.temperature, "0: greedy (default)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", opt->sampling.top_k, "0: off")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", opt->sampling.top_p, "1: off")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", opt->sampling.min_p, "0: off")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", opt->sampling.repetition_penalty, "1: off")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--seed", opt->sampling.seed, "Sampling seed (default 0)");
  cmd->add_option("--ctx", opt->ctx, "Context length (default: the model's, at most 4096)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  auto* exact = cmd->add_flag("--exact", opt->exact,
                              "Exact mode: every weight decoded to f32 exactly (default for a release folder)");
  auto* int8 = cmd->add_flag("--int8", opt->int8,
                             "int8 activations against quantized weights, as ggml computes (default for a GGUF)");
  auto* bf16 = cmd->add_flag("--bf16-activations", opt->bf16, "bf16 compute mode for the experts");
  int8->excludes(bf16);
  exact->excludes(int8);
  exact->excludes(bf16);
  bf16->excludes(exact);
  int8->excludes(exact);
  cmd->add_option("-o,--output", opt->output, "text (default) or json")->check(CLI::IsMember({"text", "json"}));
  opt->threads_option = add_threads_option(*cmd, opt->threads);
  cmd->callback([opt] {
    if (opt->prompt.empty() && opt->prompt_ids.empty())
      throw std::invalid_argument("[moekit generate] give --prompt or --prompt-ids");
    run(*opt);
  });
}

}  // namespace moekit::cli
