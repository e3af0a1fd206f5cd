// gtest prints a JSON test parameter by its "name" (ctest lines and failure messages would
// otherwise carry the whole case). One definition for every test file with JSON parameters.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

namespace nlohmann {
inline void PrintTo(const json& j, std::ostream* os) {
  *os << (j.is_object() && j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>()
                                                                         : std::string("<json>"));
}
}  // namespace nlohmann
