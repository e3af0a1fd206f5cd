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

/// Splits "a,b,c" at commas, trimming blanks around each item. Throws std::invalid_argument
/// naming `option` for an empty list or an empty item ("1,,2").
std::vector<std::string> split_list(const std::string& text, const std::string& option);

/// Parses "1,32,512" as integers in [lo, hi]. Throws std::invalid_argument naming `option` and
/// the offending item (not a number, trailing characters, out of range, a duplicate).
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& option,
                                         std::int64_t lo, std::int64_t hi);

/// Parses one integer in [lo, hi]; throws std::invalid_argument naming `option` and the text.
std::int64_t parse_int(const std::string& text, const std::string& option, std::int64_t lo,
                       std::int64_t hi);

/// Parses token ids "1,2,3" (blanks after an id allowed; "" gives none). Throws
/// std::invalid_argument "<what>: '<item>' is not a token id (ids: 1,2,3)" for an item that is not
/// an id in [0, INT32_MAX].
std::vector<std::int32_t> parse_token_ids(const std::string& text, const std::string& what);

/// Adds `--threads N` to `cmd`; returns the option so the callback can ask whether it was given.
CLI::Option* add_threads_option(CLI::App& cmd, int& threads);
/// Calls moekit::set_num_threads(threads) if `--threads` was given; otherwise moekit's default
/// (MOEKIT_NUM_THREADS, else all hardware threads) stays.
void apply_threads_option(const CLI::Option* option, int threads);

}  // namespace moekit::cli
