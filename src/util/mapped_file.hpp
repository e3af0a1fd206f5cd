// A file mapped read-only into memory (the checkpoint readers: safetensors, GGUF). Internal.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "util/error.hpp"

namespace moekit::detail {

/// `path` opened and mapped (PROT_READ, MAP_PRIVATE). An empty file maps to no bytes (mmap of
/// length 0 is an error; the caller's parser reports the short file). The descriptor stays open
/// in `fd` when `keep_fd` (for pread of small tensors), else it is closed: the mapping stays valid.
struct MappedFile {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  int fd = -1;
};

/// Why `path` could not be mapped ("cannot open (No such file or directory)", "not a regular
/// file", "cannot mmap N bytes (...)"), or "" with `out` filled.
inline std::string map_file(const std::string& path, bool keep_fd, MappedFile& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MOEKIT_MSG("cannot open (" << std::strerror(errno) << ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return MOEKIT_MSG("cannot stat (" << std::strerror(err) << ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return "not a regular file";
  }
  out.size = static_cast<std::size_t>(st.st_size);
  if (out.size != 0) {
    void* p = ::mmap(nullptr, out.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return MOEKIT_MSG("cannot mmap " << out.size << " bytes (" << std::strerror(err) << ")");
    }
    out.data = static_cast<const std::uint8_t*>(p);
  }
  if (keep_fd) {
    out.fd = fd;
  } else {
    ::close(fd);
  }
  return {};
}

/// Undoes map_file.
inline void unmap_file(MappedFile& m) {
  if (m.data != nullptr) ::munmap(const_cast<std::uint8_t*>(m.data), m.size);
  if (m.fd >= 0) ::close(m.fd);
  m = MappedFile{};
}

}  // namespace moekit::detail
