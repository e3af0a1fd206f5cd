// What the whole-model tests share: the tiny models' folder (tests/goldens/models, made by
// make_model_goldens.py there), a golden's prompt, and an error's message.
#pragma once

#include <exception>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moekit::testing {

inline const std::string kModelsDir = std::string(MOEKIT_TEST_DATA_DIR) + "/models/";

/// The 12 prompt ids of `family`'s reference (<family>.ref.json).
inline std::vector<std::int32_t> golden_prompt(const std::string& family) {
  std::ifstream f(kModelsDir + family + ".ref.json");
  return nlohmann::json::parse(f)["prompt_ids"].get<std::vector<std::int32_t>>();
}

/// The message `fn` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace moekit::testing
