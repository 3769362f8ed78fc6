// The two-rank MPI set-up the point-to-point benches share: one compute thread and a communicator.
#pragma once

#include <iostream>
#include <memory>
#include <string>

#include <ATen/Parallel.h>

#include "dist/communicator.h"
#include "dist/mpi_session.h"

namespace deepen {

// The communicator of a two-rank job, or nullptr (after rank 0 says how to run `bench`) when the job
// has another size: the caller returns exit code 2. One intra-op thread per rank, so the two ranks
// on one machine do not fight over cores while a transfer is timed.
inline std::unique_ptr<Communicator> two_rank_communicator(const MpiSession& mpi, const std::string& bench) {
  if (mpi.size() != 2) {
    if (mpi.rank() == 0) std::cerr << bench << ": run with exactly 2 ranks (mpirun -np 2)\n";
    return nullptr;
  }
  at::set_num_threads(1);
  return make_mpi_communicator(mpi);
}

}  // namespace deepen
