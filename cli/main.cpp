// The moekit command. Every subcommand turns any exception into a one-line
// "moekit: error: ..." on stderr and exit code 1; nothing escapes as a signal. CLI11's own
// parse errors (unknown option, missing argument, --help) keep CLI11's exit codes.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <string>

#include "commands.hpp"

// Library messages are one line, but a path or a JSON excerpt may carry a newline; the contract
// is one line on stderr (cli::one_line).
using moekit::cli::one_line;

int main(int argc, char** argv) {
  CLI::App app{"moekit: Mixture-of-Experts layers, exact to each model family"};
  app.require_subcommand(1);
  moekit::cli::register_forward(app);
  moekit::cli::register_backward(app);
  moekit::cli::register_inspect(app);
  moekit::cli::register_quantize(app);
  moekit::cli::register_demo(app);
  moekit::cli::register_bench(app);
  moekit::cli::register_train(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const moekit::cli::ReportedElsewhere&) {
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "moekit: error: " << one_line(e.what()) << std::endl;
    return 1;
  } catch (...) {
    std::cerr << "moekit: error: unknown exception" << std::endl;
    return 1;
  }
  return 0;
}
