// Building error messages without <format> (GCC 12): MOEKIT_MSG("a " << b) -> std::string.
#pragma once

#include <sstream>
#include <string>

#define MOEKIT_MSG(stream_expr) \
  ([&]() -> std::string {       \
    std::ostringstream moekit_os_; \
    moekit_os_ << stream_expr;  \
    return moekit_os_.str();    \
  }())
