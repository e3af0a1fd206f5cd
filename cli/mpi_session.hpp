// MPI for the life of one command (`--expert-parallel`): initialised here unless the caller
// already did, finalised on the way out. Built only with MOEKIT_HAVE_DIST.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <string>

#include "commands.hpp"
#include "moekit/dist.hpp"

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

/// Ends an MPI job that failed on some rank: rank 0 prints the one message now ("moekit:
/// error: ..."), every rank waits until it has, then each throws ReportedElsewhere (exit 1,
/// nothing more printed) — so no rank's exit can make mpirun kill rank 0 before it printed.
[[noreturn]] inline void end_failed_job(const MpiSession& mpi, const std::string& message) {
  if (mpi.rank == 0) {
    std::fprintf(stderr, "moekit: error: %s\n", one_line(message).c_str());
    std::fflush(stderr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  throw ReportedElsewhere(message);
}

[[noreturn]] inline void end_failed_job(const MpiSession& mpi, const dist::RankError& e,
                                        const std::string& prefix) {
  end_failed_job(mpi, prefix + e.what());
}

}  // namespace moekit::cli
