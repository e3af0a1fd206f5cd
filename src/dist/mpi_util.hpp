// Small helpers shared by the dist layer's files (not part of the public API): MPI's ranks and
// counts, and copying chosen rows of an f32 matrix.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "moekit/tensor.hpp"
#include "util/error.hpp"

namespace moekit::dist::mpi_util {

inline int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

inline int comm_size(MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  return n;
}

// A count of elements as MPI's int, or an error naming what overflowed.
inline int mpi_count(std::int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    throw std::length_error(MOEKIT_MSG(
        "[moekit::dist] " << what << " of " << n << " elements exceeds one MPI message (INT_MAX)"));
  return static_cast<int>(n);
}

template <class T>
MPI_Datatype mpi_type();
template <>
inline MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
inline MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

// Σ over the ranks of data[0, n), added in rank order 0, 1, … on rank 0 and broadcast: the same
// bits everywhere, and the data itself at one rank.
template <class T>
void sum_in_rank_order(MPI_Comm comm, T* data, std::int64_t n) {
  const int P = comm_size(comm), rank = comm_rank(comm);
  if (P == 1 || n == 0) return;
  const int count = mpi_count(n, "a sum");
  std::vector<T> all(rank == 0 ? static_cast<std::size_t>(n) * static_cast<std::size_t>(P) : 0);
  MPI_Gather(data, count, mpi_type<T>(), all.data(), count, mpi_type<T>(), 0, comm);
  if (rank == 0)
    for (int r = 1; r < P; ++r) {
      const T* p = all.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      for (std::int64_t i = 0; i < n; ++i) data[i] = data[i] + p[i];
    }
  MPI_Bcast(data, count, mpi_type<T>(), 0, comm);
}

// Rows `ids` of the f32 matrix `from` into the rows 0, 1, ... of `to` (as many rows as ids).
inline void copy_rows(const Tensor& from, const std::vector<std::int64_t>& ids, Tensor& to) {
  const std::int64_t n = from.dim(1);
  for (std::size_t i = 0; i < ids.size(); ++i)
    std::memcpy(to.data_as<float>() + static_cast<std::int64_t>(i) * n, from.data_as<const float>() + ids[i] * n,
                static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace moekit::dist::mpi_util
