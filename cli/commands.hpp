// Subcommand registration. Each register_* adds a subcommand whose callback does the work;
// exceptions propagate to main(), which prints them.
#pragma once

namespace CLI {
class App;
}

namespace moekit::cli {

void register_demo(CLI::App& app);

}  // namespace moekit::cli
