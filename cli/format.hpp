// Small text and option helpers shared by the subcommands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/config.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace moekit::cli {

/// "98304 bytes (96.0 KiB)".
std::string format_bytes(std::size_t bytes);

/// Adds `--threads N` to `cmd`; returns the option so the callback can ask whether it was given.
CLI::Option* add_threads_option(CLI::App& cmd, int& threads);
/// Calls moekit::set_num_threads(threads) if `--threads` was given; otherwise moekit's default
/// (MOEKIT_NUM_THREADS, else all hardware threads) stays.
void apply_threads_option(const CLI::Option* option, int threads);

}  // namespace moekit::cli
