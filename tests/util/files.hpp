// A file's bytes and a JSON file, for the tests that read golden files.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace moekit::testing {

inline std::string slurp_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline nlohmann::json load_json(const std::string& path) { return nlohmann::json::parse(slurp_file(path)); }

}  // namespace moekit::testing
