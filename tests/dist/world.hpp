// What the dist tests ask of MPI_COMM_WORLD: this rank, the rank count, and whether every rank
// holds the same bytes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace moekit::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// Collective: whether every rank holds these `n` bytes.
inline bool same_bytes_on_every_rank(const void* data, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  const std::vector<std::uint8_t> bytes(p, p + n);
  std::vector<std::uint8_t> lo(n), hi(n);
  MPI_Allreduce(bytes.data(), lo.data(), static_cast<int>(n), MPI_UINT8_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(bytes.data(), hi.data(), static_cast<int>(n), MPI_UINT8_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

}  // namespace moekit::testing
