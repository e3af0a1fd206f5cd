#include "format.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>

#include "moekit/threading.hpp"

namespace moekit::cli {

std::string format_bytes(std::size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  std::ostringstream os;
  os << bytes << " bytes";
  if (unit > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " (%.1f %s)", v, kUnits[unit]);
    os << buf;
  }
  return os.str();
}

CLI::Option* add_threads_option(CLI::App& cmd, int& threads) {
  return cmd
      .add_option(
          "--threads", threads,
          "Worker threads; 0 = all hardware threads (default: MOEKIT_NUM_THREADS, else all)")
      ->check(CLI::Range(0, 4096));
}

void apply_threads_option(const CLI::Option* option, int threads) {
  if (option != nullptr && option->count() > 0) set_num_threads(threads);
}

}  // namespace moekit::cli
