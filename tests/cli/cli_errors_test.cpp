// The command line's contract, run as a child process: every error of every subcommand, a
// command line that does not parse included, is exit code 1, nothing on stdout and exactly one
// line "moekit: error: <command>: ..." on stderr naming the offending word. An unknown command is
// named with the commands and the closest one; `moekit` alone lists the commands on stderr and
// exits 1; `--help` and `--version` print on stdout and exit 0.
//
// The subcommands are read from `moekit --help`, and their options from `moekit <command> --help`:
// a subcommand added without its cases here, or an option the generated cases do not reach, fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/run_cli.hpp"
#include "io/safetensors_writer.hpp"

namespace moekit {
namespace {

using testing::RunResult;
using testing::TempDir;

RunResult run(const std::vector<std::string>& args) {
  const TempDir scratch("cli_errors");
  return testing::run_cli(args, scratch.path());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string joined(const std::vector<std::string>& args) {
  std::string s = "moekit";
  for (const std::string& a : args) s += " " + a;
  return s;
}

// Exit code 1 (not a signal), nothing on stdout, and stderr exactly one line that starts with
// `prefix` and names every word of `named`.
void expect_one_error_line(const RunResult& r, const std::string& prefix, const std::vector<std::string>& named,
                           const std::string& what) {
  EXPECT_TRUE(r.exited) << what << ": killed by a signal";
  EXPECT_EQ(r.exit_code, 1) << what << "\n" << r.err;
  EXPECT_EQ(r.out, "") << what;
  EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << what << ": " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << what << ": " << r.err;
  for (const std::string& word : named) EXPECT_NE(r.err.find(word), std::string::npos) << what << ": " << r.err;
}

// The subcommands `moekit --help` lists (CLI11's "Subcommands:" section), sorted.
std::vector<std::string> commands_in_help() {
  const RunResult help = run({"--help"});
  std::vector<std::string> commands;
  bool in_section = false;
  for (const std::string& line : lines_of(help.out)) {
    if (line == "Subcommands:") {
      in_section = true;
    } else if (in_section && line.rfind("  ", 0) == 0) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      commands.push_back(name);
    } else if (in_section && !line.empty()) {
      break;
    }
  }
  std::sort(commands.begin(), commands.end());
  return commands;
}

// One option of a subcommand as its --help line states it: `--name TYPE[=default] [in [lo - hi]]
// [REQUIRED] [...] [Needs: ...] [Excludes: ...]` (CLI11's layout; a flag has no TYPE).
struct HelpOption {
  std::string name;
  std::string type;  // INT, UINT, FLOAT, TEXT; "" for a flag
  bool required = false;
  bool ranged = false;
  long long lo = 0, hi = 0;
};

std::vector<HelpOption> options_in_help(const std::string& command) {
  const RunResult help = run({command, "--help"});
  EXPECT_EQ(help.exit_code, 0) << command;
  const std::regex type_word("([A-Z]+)(:[A-Z]+)?(=.*)?");
  std::vector<HelpOption> options;
  for (const std::string& line : lines_of(help.out)) {
    if (line.rfind("  -", 0) != 0) continue;
    std::istringstream words(line);
    std::string names, word;
    words >> names;
    HelpOption o;
    o.name = names.substr(names.rfind(',') == std::string::npos ? 0 : names.rfind(',') + 1);
    if (o.name == "--help") continue;
    std::smatch m;
    if (words >> word && std::regex_match(word, m, type_word)) {
      o.type = m[1];
      if (m[2] == ":NONNEGATIVE") {
        o.ranged = true;
        o.lo = 0;
        o.hi = -1;  // no upper bound
      }
      while (words >> word) {
        if (word == "in") {  // "in [lo - hi]"
          std::string lo, dash, hi;
          words >> lo >> dash >> hi;
          o.ranged = true;
          o.lo = std::stoll(lo.substr(1));
          o.hi = std::stoll(hi.substr(0, hi.size() - 1));
        } else if (word == "REQUIRED") {
          o.required = true;
        } else if (word != "...") {
          break;  // Needs:, Excludes: or the description
        }
      }
    }
    options.push_back(o);
  }
  return options;
}

// The subcommand's required options with a value each (that no check reaches: the command line
// fails before), except `but`.
std::vector<std::string> required_args(const std::vector<HelpOption>& options, const std::string& but = "") {
  std::vector<std::string> args;
  for (const HelpOption& o : options)
    if (o.required && o.name != but) {
      args.push_back(o.name);
      args.push_back(o.type == "TEXT" ? "x" : "1");
    }
  return args;
}

// Every kind of parse error, for every subcommand: an unknown option, a missing value, a missing
// required option (forward, backward, inspect, quantize), an out-of-range value (the ranged
// options; bench and train check their own too), a value that is not a number, an extra
// positional argument, an option given twice, an option needing or excluding another.
struct ErrorCase {
  std::string command, kind;
  std::vector<std::string> args;   // after the command
  std::vector<std::string> named;  // the words the message names
  bool own_check = false;          // checked by the command ("[moekit <command>] ..."), not the parser
};

std::vector<ErrorCase> error_cases() {
  const std::vector<std::string> fwd = {"--model", "m", "--layer", "1", "--input", "x.npy", "--output", "y.npy"};
  const std::vector<std::string> bwd = {"--model", "m",        "--layer",      "1", "--input", "x.npy", "--grad-output",
                                        "dy.npy",  "--output", "g.safetensors"};
  const auto with = [](std::vector<std::string> base, const std::vector<std::string>& more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  return {
      {"backward", "unknown option", with(bwd, {"--frobnicate"}), {"--frobnicate"}},
      {"backward", "missing value", with(bwd, {"--router"}), {"--router"}},
      {"backward",
       "missing required option",
       {"--model", "m", "--layer", "1", "--input", "x.npy", "--output", "g"},
       {"--grad-output"}},
      {"backward", "out of range", with(bwd, {"--threads", "4097"}), {"--threads", "4097"}},
      {"backward", "not a number", with(bwd, {"--threads", "many"}), {"--threads", "many"}},
      {"backward", "extra positional", with(bwd, {"extra"}), {"extra"}},
      {"backward", "given twice", with(bwd, {"--layer", "2"}), {"--layer"}},
      {"backward",
       "needs another option",
       with(bwd, {"--placement", "contiguous"}),
       {"--placement", "--expert-parallel"}},

      {"bench", "unknown option", {"--frobnicate"}, {"--frobnicate"}},
      {"bench", "missing value", {"--shape"}, {"--shape"}},
      {"bench", "out of range", {"--shape", "tiny", "--tokens", "0"}, {"--tokens", "0"}, true},
      {"bench", "not a number", {"--shape", "tiny", "--reps", "many"}, {"--reps", "many"}, true},
      {"bench", "extra positional", {"extra"}, {"extra"}},
      {"bench", "given twice", {"--shape", "tiny", "--shape", "tiny"}, {"--shape"}},

      {"demo", "unknown option", {"--frobnicate"}, {"--frobnicate"}},
      {"demo", "unknown option with a value", {"--frobnicate=3"}, {"--frobnicate"}},
      {"demo", "missing value", {"--tokens"}, {"--tokens"}},
      {"demo", "out of range", {"--tokens", "0"}, {"--tokens", "0", "1048576"}},
      {"demo", "out of range", {"--runs", "1001"}, {"--runs", "1001"}},
      {"demo", "out of range", {"--threads", "-1"}, {"--threads", "-1"}},
      {"demo", "not a number", {"--seed", "abc"}, {"--seed", "abc"}},
      {"demo", "extra positional", {"extra"}, {"extra"}},
      {"demo", "a command as an extra positional", {"forward"}, {"forward"}},
      {"demo", "given twice", {"--seed", "1", "--seed", "2"}, {"--seed"}},
      {"demo", "the top-level --version", {"--version"}, {"--version"}},

      {"generate", "unknown option", {"--model", "m", "--prompt-ids", "1", "--frobnicate"}, {"--frobnicate"}},
      {"generate", "missing value", {"--model", "m", "--prompt-ids"}, {"--prompt-ids"}},
      {"generate", "missing required option", {"--prompt-ids", "1"}, {"--model"}},
      {"generate", "out of range", {"--model", "m", "--prompt-ids", "1", "--top-p", "1.5"}, {"--top-p", "1.5"}},
      {"generate", "not a number", {"--model", "m", "--prompt-ids", "1", "--max-tokens", "many"}, {"--max-tokens"}},
      {"generate", "extra positional", {"--model", "m", "--prompt-ids", "1", "extra"}, {"extra"}},
      {"generate", "excludes another option", {"--model", "m", "--prompt-ids", "1", "--prompt", "hi"}, {"--prompt"}},
      {"generate", "not a token id", {"--model", "m", "--prompt-ids", "1,x"}, {"--prompt-ids", "'x'"}, true},

      {"forward", "unknown option", with(fwd, {"--frobnicate"}), {"--frobnicate"}},
      {"forward", "missing value", {"--model"}, {"--model"}},
      {"forward", "missing required option", {"--layer", "1", "--input", "x.npy", "--output", "y.npy"}, {"--model"}},
      {"forward", "out of range", with(fwd, {"--threads", "5000"}), {"--threads", "5000"}},
      {"forward",
       "not a number",
       {"--model", "m", "--layer", "one", "--input", "x.npy", "--output", "y.npy"},
       {"--layer", "one"}},
      {"forward", "extra positional", with(fwd, {"extra"}), {"extra"}},
      {"forward", "given twice", with(fwd, {"--output", "z.npy"}), {"--output"}},
      {"forward", "needs another option", with(fwd, {"--placement", "0,1"}), {"--placement", "--expert-parallel"}},
      {"forward",
       "excludes another option",
       with(fwd, {"--int8", "--bf16-activations"}),
       {"--int8", "--bf16-activations"}},

      {"inspect", "unknown option", {"--model", "m", "--frobnicate"}, {"--frobnicate"}},
      {"inspect", "missing value", {"--model"}, {"--model"}},
      {"inspect", "missing required option", {"--layer", "0"}, {"--model"}},
      {"inspect", "out of range", {"--model", "m", "--layer", "-1"}, {"--layer", "-1"}},
      {"inspect", "not a number", {"--model", "m", "--layer", "one"}, {"--layer", "one"}},
      {"inspect", "extra positional", {"--model", "m", "extra"}, {"extra"}},
      {"inspect", "given twice", {"--model", "m", "--model", "n"}, {"--model"}},

      {"quantize", "unknown option", {"--model", "m", "--out", "q", "--frobnicate"}, {"--frobnicate"}},
      {"quantize", "missing value", {"--model", "m", "--out"}, {"--out"}},
      {"quantize", "missing required option", {"--model", "m"}, {"--out"}},
      {"quantize", "out of range", {"--model", "m", "--out", "q", "--threads", "4097"}, {"--threads", "4097"}},
      {"quantize", "not a number", {"--model", "m", "--out", "q", "--bits", "four"}, {"--bits", "four"}},
      {"quantize", "extra positional", {"--model", "m", "--out", "q", "extra"}, {"extra"}},
      {"quantize", "given twice", {"--model", "m", "--out", "q", "--bits", "4", "--bits", "8"}, {"--bits"}},

      {"chat-template", "unknown option", {"--template", "t", "--messages", "m", "--frobnicate"}, {"--frobnicate"}},
      {"chat-template", "missing value", {"--template", "t", "--messages"}, {"--messages"}},
      {"chat-template", "missing required option", {"--template", "t"}, {"--messages"}},
      {"chat-template", "extra positional", {"--template", "t", "--messages", "m", "extra"}, {"extra"}},
      {"chat-template", "given twice", {"--template", "t", "--messages", "m", "--messages", "n"}, {"--messages"}},
      {"chat-template",
       "excludes another option",
       {"--template", "t", "--model", "m", "--messages", "m"},
       {"--template", "--model"}},
      {"serve", "unknown option", {"--model", "m", "--frobnicate"}, {"--frobnicate"}},
      {"serve", "missing value", {"--model", "m", "--port"}, {"--port"}},
      {"serve", "missing required option", {"--port", "9000"}, {"--model"}},
      {"serve", "out of range", {"--model", "m", "--parallel", "0"}, {"--parallel", "0"}},
      {"serve", "not a number", {"--model", "m", "--port", "http"}, {"--port", "http"}},
      {"serve", "extra positional", {"--model", "m", "extra"}, {"extra"}},
      {"serve", "given twice", {"--model", "m", "--port", "1", "--port", "2"}, {"--port"}},
      {"tokenize", "unknown option", {"--model", "m", "--text", "hi", "--frobnicate"}, {"--frobnicate"}},
      {"tokenize", "missing value", {"--model", "m", "--text"}, {"--text"}},
      {"tokenize", "missing required option", {"--text", "hi"}, {"--model"}},
      {"tokenize", "out of range", {"--model", "m", "--text", "hi", "-o", "xml"}, {"--output", "xml"}},
      {"tokenize", "not a number", {"--model", "m", "--ids", "1,x"}, {"--ids", "'x'"}, true},
      {"tokenize", "extra positional", {"--model", "m", "--text", "hi", "extra"}, {"extra"}},
      {"tokenize", "given twice", {"--model", "m", "--text", "a", "--text", "b"}, {"--text"}},
      {"tokenize", "excludes another option", {"--model", "m", "--text", "hi", "--ids", "1"}, {"--text", "--ids"}},

      {"train", "unknown option", {"--frobnicate"}, {"--frobnicate"}},
      {"train", "missing value", {"--dim"}, {"--dim"}},
      {"train", "out of range", {"--threads", "4097"}, {"--threads", "4097"}},
      {"train", "out of range", {"--dim", "0"}, {"--dim", "0"}, true},
      {"train", "not a number", {"--dim", "abc"}, {"--dim", "abc"}},
      {"train", "extra positional", {"extra"}, {"extra"}},
      {"train", "needs another option", {"--placement", "contiguous"}, {"--placement", "--expert-parallel"}},
  };
}

TEST(CliErrors, EveryKindOfParseErrorOfEverySubcommandIsOneErrorLineAndExitOne) {
  const std::vector<ErrorCase> cases = error_cases();
  std::map<std::string, std::set<std::string>> kinds;
  for (const ErrorCase& c : cases) {
    std::vector<std::string> args = {c.command};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const std::string prefix =
        c.own_check ? "moekit: error: [moekit " + c.command + "] " : "moekit: error: " + c.command + ": ";
    expect_one_error_line(run(args), prefix, c.named, c.kind + ": " + joined(args));
    kinds[c.command].insert(c.kind);
  }
  // Every subcommand has its cases, and each kind that its options allow.
  const std::vector<std::string> commands = commands_in_help();
  ASSERT_FALSE(commands.empty());
  for (const std::string& command : commands) {
    const std::set<std::string>& k = kinds[command];
    const std::vector<HelpOption> options = options_in_help(command);
    // A range or a number to get wrong only where some option takes a number or a choice.
    const bool numbers = std::any_of(options.begin(), options.end(), [](const HelpOption& o) {
      return o.type == "INT" || o.type == "UINT" || o.type == "FLOAT" || o.ranged;
    });
    const bool choices = std::any_of(options.begin(), options.end(), [](const HelpOption& o) { return o.ranged; });
    for (const char* kind : {"unknown option", "missing value", "extra positional", "out of range", "not a number"}) {
      if (std::string(kind) == "not a number" && !numbers) continue;
      if (std::string(kind) == "out of range" && !numbers && !choices) continue;
      EXPECT_TRUE(k.count(kind)) << command << " has no '" << kind << "' case";
    }
    if (std::any_of(options.begin(), options.end(), [](const HelpOption& o) { return o.required; })) {
      EXPECT_TRUE(k.count("missing required option")) << command << " has a required option but no case for it";
    }
  }
  for (const auto& [command, k] : kinds)
    EXPECT_TRUE(std::count(commands.begin(), commands.end(), command)) << command << " is not a command";
}

// Generated from each subcommand's --help: every option that takes a value without it, every
// required option left out, both bounds of every ranged option crossed, a word for every number.
TEST(CliErrors, EveryOptionOfEverySubcommandsHelpFailsByTheContract) {
  const std::vector<std::string> commands = commands_in_help();
  ASSERT_FALSE(commands.empty());
  int cases = 0;
  for (const std::string& command : commands) {
    const std::vector<HelpOption> options = options_in_help(command);
    EXPECT_FALSE(options.empty()) << command;
    const std::string prefix = "moekit: error: " + command + ": ";
    const auto expect = [&](const std::string& kind, const std::vector<std::string>& more,
                            const std::vector<std::string>& named, const std::string& but = "") {
      std::vector<std::string> args = {command};
      const std::vector<std::string> required = required_args(options, but);
      args.insert(args.end(), required.begin(), required.end());
      args.insert(args.end(), more.begin(), more.end());
      expect_one_error_line(run(args), prefix, named, kind + ": " + joined(args));
      ++cases;
    };
    for (const HelpOption& o : options) {
      if (o.type.empty()) continue;  // a flag
      expect("missing value", {o.name}, {o.name}, o.name);
      if (o.required) expect("missing required option", {}, {o.name}, o.name);
      if (o.ranged) {
        expect("below the range", {o.name, std::to_string(o.lo - 1)}, {o.name, std::to_string(o.lo - 1)}, o.name);
        if (o.hi >= o.lo)
          expect("above the range", {o.name, std::to_string(o.hi + 1)}, {o.name, std::to_string(o.hi + 1)}, o.name);
      }
      if (o.type == "INT" || o.type == "UINT" || o.type == "FLOAT")
        expect("not a number", {o.name, "abc"}, {o.name, "abc"}, o.name);
    }
    expect("unknown option", {"--no-such-option"}, {"--no-such-option"});
    expect("extra positional", {"stray"}, {"stray"});
  }
  EXPECT_GT(cases, 100);
}

TEST(CliErrors, AnUnknownCommandIsNamedWithTheCommandsAndTheClosestOne) {
  const std::string all =
      "(commands: backward, bench, chat-template, demo, forward, generate, inspect, quantize, "
      "serve, tokenize, train)";
  for (const auto& [word, closest] : std::vector<std::pair<std::string, std::string>>{{"frobnicate", "forward"},
                                                                                      {"trian", "train"},
                                                                                      {"inpsect", "inspect"},
                                                                                      {"benchmark", "bench"},
                                                                                      {"quant", "quantize"},
                                                                                      {"Demo", "demo"}}) {
    const RunResult r = run({word, "--model", "m"});
    expect_one_error_line(r, "moekit: error: unknown command '" + word + "' " + all,
                          {"did you mean '" + closest + "'?"}, word);
    EXPECT_EQ(r.err, "moekit: error: unknown command '" + word + "' " + all + "; did you mean '" + closest + "'?\n");
  }
  // Nothing close: no suggestion.
  const RunResult far = run({"xyz"});
  EXPECT_EQ(far.err, "moekit: error: unknown command 'xyz' " + all + "\n");
  EXPECT_EQ(far.exit_code, 1);
  EXPECT_EQ(far.out, "");
}

TEST(CliErrors, AnOptionBeforeTheCommandIsHelpOrVersion) {
  for (const std::string option : {"--frobnicate", "-x", "--version=2", "--tokens"}) {
    const RunResult r = run({option, "demo"});
    expect_one_error_line(r, "moekit: error: unknown option '" + option + "'", {"--help", "--version", "demo"}, option);
  }
}

TEST(CliErrors, NoArgumentsListsTheCommandsOnStderrAndExitsOne) {
  const RunResult r = run({});
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  const std::vector<std::string> lines = lines_of(r.err);
  ASSERT_FALSE(lines.empty());
  // The listing, one line per command with its description, then the one error line.
  for (const std::string& command : commands_in_help()) {
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                            [&](const std::string& l) { return l.rfind("  " + command + " ", 0) == 0; }))
        << command << " is not listed:\n"
        << r.err;
  }
  EXPECT_EQ(lines.back(),
            "moekit: error: no command given (commands: backward, bench, chat-template, demo, forward, generate, "
            "inspect, quantize, serve, tokenize, train)");
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const std::string& l) { return l.rfind("moekit: error: ", 0) == 0; }),
            1);
}

TEST(CliErrors, VersionPrintsTheVersionAndTheCommit) {
  const RunResult r = run({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(std::regex_match(
      r.out, std::regex(std::string("moekit ") + MOEKIT_VERSION + " \\(commit ([0-9a-f]{7,40}(-dirty)?|unknown)\\)\n")))
      << r.out;
}

TEST(CliErrors, HelpOfTheCommandAndOfEverySubcommandExitsZeroOnStdout) {
  for (const char* help : {"--help", "-h"}) {
    const RunResult r = run({help});
    EXPECT_EQ(r.exit_code, 0) << help;
    EXPECT_EQ(r.err, "") << help;
    EXPECT_NE(r.out.find("--version"), std::string::npos) << r.out;
  }
  const std::vector<std::string> commands = commands_in_help();
  EXPECT_EQ(commands, (std::vector<std::string>{"backward", "bench", "chat-template", "demo", "forward", "generate",
                                                "inspect", "quantize", "serve", "tokenize", "train"}));
  for (const std::string& command : commands) {
    const RunResult r = run({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_EQ(r.err, "") << command;
    EXPECT_NE(r.out.find("Usage: moekit " + command), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace moekit
