// libFuzzer target: untrusted bytes into the safetensors and .npy parsers. Any input must either
// parse or throw a std::exception (runtime_error by contract); a crash, sanitizer report, leak or
// any other exception type is a bug. Run through scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "moekit/npy.hpp"
#include "moekit/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto f = moekit::SafetensorsFile::from_bytes(std::vector<std::uint8_t>(data, data + size),
                                                       "fuzz.safetensors");
    // Touch every accepted tensor so ASan checks its byte range lies inside the image.
    volatile std::uint8_t sink = 0;
    for (const std::string& name : f->names()) {
      const moekit::TensorInfo& info = f->info(name);
      const std::uint8_t* p = f->bytes(name);
      if (info.end > info.begin)
        sink = static_cast<std::uint8_t>(sink ^ p[0] ^ p[info.end - info.begin - 1]);
      try {
        (void)f->view(name);
      } catch (const std::exception&) {
      }
    }
    (void)sink;
  } catch (const std::exception&) {
  }
  try {
    const moekit::Tensor t = moekit::parse_npy(data, size, "fuzz.npy");
    (void)t;
  } catch (const std::exception&) {
  }
  return 0;
}
