// The moekit command. Every error, a command line that does not parse included, is one line
// "moekit: error: ..." on stderr and exit code 1; nothing escapes as a signal. Parse errors name the
// subcommand ("moekit: error: demo: --tokens: value 0 not in range 1 to 1048576"), an unknown
// command is named with the commands and the closest one. `--help` prints help on stdout and exits
// 0, as does `--version` (the version and the commit); `moekit` alone lists the commands on stderr
// and exits 1. `moekit train` stopped by Ctrl-C exits 130 (it throws CLI::RuntimeError(130)).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "git_commit.hpp"  // MOEKIT_GIT_COMMIT, generated at build time (cli/CMakeLists.txt)

// Library messages are one line, but a path or a JSON excerpt may carry a newline; the contract
// is one line on stderr (cli::one_line).
using moekit::cli::one_line;

namespace {

int error(const std::string& message) {
  std::cerr << "moekit: error: " << one_line(message) << std::endl;
  return 1;
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The command closest to `word` by edit distance among those close to it (at most 3 edits, or
// the same first letter); "" when none is.
std::string closest(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = 0;
  for (const std::string& n : names) {
    const std::size_t d = edit_distance(word, n);
    const bool close = d <= 3 || (!word.empty() && word[0] == n[0]);
    if (close && (best.empty() || d < best_distance)) {
      best = n;
      best_distance = d;
    }
  }
  return best;
}

// CLI11's message as the rest of the line: its leading capitalised word lowered, after an option
// prefix ("--tokens: Value 0 not in range ..." -> "--tokens: value 0 not in range ...").
std::string parse_message(std::string m) {
  std::size_t at = 0;
  if (!m.empty() && m[0] == '-') {
    const std::size_t colon = m.find(": ");
    at = colon == std::string::npos ? m.size() : colon + 2;
  }
  const auto is_upper = [&](std::size_t i) { return i < m.size() && std::isupper(static_cast<unsigned char>(m[i])); };
  const auto is_lower = [&](std::size_t i) { return i < m.size() && std::islower(static_cast<unsigned char>(m[i])); };
  std::size_t end = at + 1;
  while (is_lower(end)) ++end;
  // "At Most 1 required" stays as written: only a word followed by a lower-case one is lowered.
  if (is_upper(at) && end > at + 1 && end < m.size() && m[end] == ' ' && !is_upper(end + 1))
    m[at] = static_cast<char>(std::tolower(static_cast<unsigned char>(m[at])));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moekit: Mixture-of-Experts layers, exact to each model family", "moekit"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moekit ") + MOEKIT_VERSION + " (commit " + MOEKIT_GIT_COMMIT + ")",
                       "Print the version and the commit moekit was built from, and exit");
  moekit::cli::register_forward(app);
  moekit::cli::register_backward(app);
  moekit::cli::register_inspect(app);
  moekit::cli::register_generate(app);
  moekit::cli::register_serve(app);
  moekit::cli::register_chat_template(app);
  moekit::cli::register_quantize(app);
  moekit::cli::register_tokenize(app);
  moekit::cli::register_demo(app);
  moekit::cli::register_bench(app);
  moekit::cli::register_train(app);
  const std::vector<std::string> commands = command_names(app);

  // The first argument is the command, or one of the options before it (--help, --version).
  if (argc < 2) {
    std::cerr << app.help();
    return error("no command given (commands: " + joined(commands) + ")");
  }
  const std::string first = argv[1];
  const bool is_command = std::find(commands.begin(), commands.end(), first) != commands.end();
  if (!first.empty() && first[0] == '-') {
    if (first != "-h" && first != "--help" && first != "--version")
      return error("unknown option '" + first + "' (options: --help, --version; then a command: " + joined(commands) +
                   ")");
  } else if (!is_command) {
    std::string message = "unknown command '";
    message += first;
    message += "' (commands: " + joined(commands) + ")";
    const std::string suggestion = closest(first, commands);
    if (!suggestion.empty()) message += "; did you mean '" + suggestion + "'?";
    return error(message);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version: on stdout, exit 0
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // `train` stopped by Ctrl-C, reported by train: 130
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {  // the command line: named with its command
    return error((is_command ? first + ": " : std::string()) + parse_message(e.what()));
  } catch (const moekit::cli::ReportedElsewhere&) {
    return 1;
  } catch (const std::exception& e) {
    return error(e.what());
  } catch (...) {
    return error("unknown exception");
  }
  return 0;
}
