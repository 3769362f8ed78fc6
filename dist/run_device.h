// Device decisions of a run: run.device resolved, the world backend that fits it, each rank's GPU.
#pragma once

#include <functional>
#include <string>

#include "config/options.h"

namespace deepen {

// run.device against the CUDA devices this process sees; returns kCpu or kCuda. Asking for CUDA
// where there is none is the user's mistake, not a reason to fall back silently to a CPU run a
// hundred times slower.
//   resolve_run_device(kAuto, 0, src) -> kCpu     resolve_run_device(kAuto, 8, src) -> kCuda
//   resolve_run_device(kCpu, 8, src)  -> kCpu     resolve_run_device(kCuda, 8, src) -> kCuda
//   resolve_run_device(kCuda, 0, src) -> InputError "<src>: run.device: \"cuda\" but this process
//                                        sees no CUDA device ..."
RunDevice resolve_run_device(RunDevice requested, int cuda_devices, const std::string& source);

// The world communicator's backend for parallel.backend when ranks compute on `device` (resolved);
// returns kMpi or kNccl. NCCL moves only device memory and MPI only host memory; code that talks to
// a communicator puts its tensors on the communicator's device (Communicator::device()) and copies
// to and from the compute device, so a CUDA run over MPI stages through host memory (slower, but it
// lets several ranks share one GPU, which NCCL forbids). A CPU run never sends through a GPU.
//   world_backend(kAuto, kCuda, true, src)  -> kNccl   world_backend(kAuto, kCpu, true, src) -> kMpi
//   world_backend(kAuto, kCuda, false, src) -> kMpi    world_backend(kMpi, kCuda, true, src) -> kMpi
//   world_backend(kNccl, kCpu, true, src)   -> InputError naming parallel.backend and run.device
//   world_backend(kNccl, kCuda, false, src) -> InputError: this build has no NCCL
Backend world_backend(Backend backend, RunDevice device, bool nccl_built, const std::string& source);

// The CUDA device of a rank from its node-local rank: local_rank mod cuda_devices
// (choose_cuda_device) for either resolved backend. Under kNccl the physical GPUs are then checked
// to be distinct (check_distinct_devices); under kMpi sharing is allowed (MPI never touches device
// memory).
//   rank_cuda_device(kMpi, 3, 2) -> 1     rank_cuda_device(kNccl, 3, 8) -> 3
//   rank_cuda_device(kNccl, 5, 4) -> 1    rank_cuda_device(kNccl, 3, 1) -> 0
//   rank_cuda_device(_, 0, 0) -> InputError "placement: no CUDA device visible to this rank"
int rank_cuda_device(Backend backend, int local_rank, int cuda_devices);

// This rank's place on its node, as the launcher numbered it (the site's GPU binding, e.g.
// CUDA_VISIBLE_DEVICES per task, was computed from the same number): OMPI_COMM_WORLD_LOCAL_RANK
// (mpirun) first, then SLURM_LOCALID (srun), else `mpi_local_rank` (MPI's shared-memory split).
// mpirun comes first because under mpirun inside a Slurm allocation every rank inherits the batch
// step's SLURM_LOCALID = 0. A value that is not a non-negative integer is an InputError naming the
// variable. `getenv` is injected (tests); nullptr = unset.
//   {OMPI_COMM_WORLD_LOCAL_RANK=3, SLURM_LOCALID=0}, 7 -> 3     {SLURM_LOCALID=2}, 7 -> 2
//   {}, 7 -> 7                                                  {SLURM_LOCALID=x}, 0 -> InputError
int node_local_rank(const std::function<const char*(const char*)>& getenv, int mpi_local_rank);

}  // namespace deepen
