#include "format.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>

#include "moekit/threading.hpp"

namespace moekit::cli {

std::string compact_ranges(const std::vector<std::int64_t>& values) {
  if (values.empty()) return "none";
  std::ostringstream os;
  std::size_t i = 0;
  while (i < values.size()) {
    std::size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (i > 0) os << ", ";
    os << values[i];
    if (j > i) os << "-" << values[j];
    i = j + 1;
  }
  return os.str();
}

const char* body_name(BodyKind kind) noexcept {
  switch (kind) {
    case BodyKind::swiglu:
      return "swiglu";
    case BodyKind::swiglu_clamped:
      return "swiglu_clamped";
    case BodyKind::geglu:
      return "geglu";
    case BodyKind::geglu_tanh:
      return "geglu_tanh";
    case BodyKind::mlp_relu:
      return "mlp_relu";
    case BodyKind::mlp_relu2:
      return "mlp_relu2";
    case BodyKind::mlp_silu:
      return "mlp_silu";
  }
  return "unknown";
}

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
