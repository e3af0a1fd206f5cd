// Which sanitizer the test binary was built with (GCC's __SANITIZE_*__ macros, clang's
// __has_feature), for the few tests that behave or cost differently under one.
#pragma once

namespace moekit::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

/// A test that makes the same claim as a cheaper one (the same code on the same threads, only
/// longer) skips under the sanitizers, with this reason; it runs in the Release build.
inline constexpr const char* kLongerTwinUnderSanitizers =
    "sanitizer build: a longer run of the code a shorter test checks (it runs in the Release build)";

}  // namespace moekit::testing
