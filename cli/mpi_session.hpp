// MPI for the life of one command (`--expert-parallel`): initialised here unless the caller
// already did, finalised on the way out. Built only with MOEKIT_HAVE_DIST.
#pragma once

#include <mpi.h>

namespace moekit::cli {

struct MpiSession {
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owns = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns && !finalized) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  bool owns = false;
  int rank = 0, size = 1;
};

}  // namespace moekit::cli
