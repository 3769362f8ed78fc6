// Device decisions of a run: run.device resolved, the world backend that fits it, each rank's GPU.
#pragma once

#include <functional>
#include <string>

namespace deepen {

// run.device ("auto" | "cpu" | "cuda") against the CUDA devices this process sees; returns "cpu"
// or "cuda". Asking for CUDA where there is none is the user's mistake, not a reason to fall back
// silently to a CPU run a hundred times slower.
//   resolve_run_device("auto", 0, src) -> "cpu"     resolve_run_device("auto", 8, src) -> "cuda"
//   resolve_run_device("cpu", 8, src)  -> "cpu"     resolve_run_device("cuda", 8, src) -> "cuda"
//   resolve_run_device("cuda", 0, src) -> InputError "<src>: run.device: \"cuda\" but this process
//                                         sees no CUDA device ..."
std::string resolve_run_device(const std::string& requested, int cuda_devices, const std::string& source);

// The world communicator's backend for parallel.backend when ranks compute on `device` (resolved).
// NCCL moves only device memory and MPI only host memory; code that talks to a communicator puts
// its tensors on the communicator's device (Communicator::device()) and copies to and from the
// compute device, so a CUDA run over MPI stages through host memory (slower, but it lets several
// ranks share one GPU, which NCCL forbids). A CPU run never sends through a GPU.
//   world_backend("auto", "cuda", true, src)  -> "nccl"   world_backend("auto", "cpu", true, src) -> "mpi"
//   world_backend("auto", "cuda", false, src) -> "mpi"    world_backend("mpi", "cuda", true, src)  -> "mpi"
//   world_backend("nccl", "cpu", true, src)   -> InputError naming parallel.backend and run.device
//   world_backend("nccl", "cuda", false, src) -> InputError: this build has no NCCL
std::string world_backend(const std::string& backend, const std::string& device, bool nccl_built,
                          const std::string& source);

// The CUDA device of a rank from its node-local rank, for a resolved world backend: local_rank mod
// cuda_devices (choose_cuda_device) for both. Under "nccl" the physical GPUs are then checked to be
// distinct (check_distinct_devices); under "mpi" sharing is allowed (MPI never touches device memory).
//   rank_cuda_device("mpi", 3, 2) -> 1     rank_cuda_device("nccl", 3, 8) -> 3
//   rank_cuda_device("nccl", 5, 4) -> 1    rank_cuda_device("nccl", 3, 1) -> 0
//   rank_cuda_device(_, 0, 0) -> InputError "placement: no CUDA device visible to this rank"
int rank_cuda_device(const std::string& backend, int local_rank, int cuda_devices);

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
