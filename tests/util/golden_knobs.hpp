// A golden case's router "overrides" (mlx-lm quirks) applied as set_router_knob calls. One
// helper for the layer and gradient golden tests.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "moekit/routing.hpp"

namespace moekit::testing {

inline void apply_overrides(RouterConfig& r, const nlohmann::json& o) {
  for (const auto& [key, v] : o.items()) set_router_knob(r, key, v.is_string() ? v.get<std::string>() : v.dump());
}

}  // namespace moekit::testing
