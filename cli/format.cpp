#include "format.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "moekit/threading.hpp"

namespace moekit::cli {

std::vector<std::string> split_list(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? std::string() : item.substr(b, e - b + 1);
    if (item.empty())
      throw std::invalid_argument(option + " '" + text +
                                  "': empty item (expected a comma-separated list, e.g. 1,2)");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

std::int64_t parse_int(const std::string& text, const std::string& option, std::int64_t lo,
                       std::int64_t hi) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(begin, &end, 10);
  if (text.empty() || end == begin || *end != '\0' || errno == ERANGE)
    throw std::invalid_argument(option + " '" + text + "' is not an integer");
  if (v < lo || v > hi)
    throw std::invalid_argument(option + " " + text + " is outside [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  return v;
}

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& option,
                                         std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> values;
  for (const std::string& item : split_list(text, option)) {
    const std::int64_t v = parse_int(item, option, lo, hi);
    if (std::find(values.begin(), values.end(), v) != values.end())
      throw std::invalid_argument(option + " '" + text + "' lists " + item + " twice");
    values.push_back(v);
  }
  return values;
}

std::vector<std::int32_t> parse_token_ids(const std::string& text, const std::string& what) {
  std::vector<std::int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    if (item.empty() || used != item.size() || v < 0 || v > INT32_MAX)
      throw std::invalid_argument(what + ": '" + item + "' is not a token id (ids: 1,2,3)");
    ids.push_back(static_cast<std::int32_t>(v));
  }
  return ids;
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
