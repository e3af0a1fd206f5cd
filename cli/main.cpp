// The moekit command. Every subcommand turns any exception into a one-line
// "moekit: error: ..." on stderr and exit code 1; nothing escapes as a signal.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"moekit: Mixture-of-Experts layers, exact to each model family"};
  app.require_subcommand(1);
  moekit::cli::register_demo(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "moekit: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
