// Device decisions of a run (pure): run.device, the world backend for it, each rank's GPU.
#include "dist/run_device.h"

#include "config/input_error.h"
#include "dist/rank_layout.h"

namespace deepen {

RunDevice resolve_run_device(RunDevice requested, int cuda_devices, const std::string& source) {
  if (requested == RunDevice::kAuto) return cuda_devices > 0 ? RunDevice::kCuda : RunDevice::kCpu;
  if (requested == RunDevice::kCuda && cuda_devices < 1)
    throw InputError(source + ": run.device: \"cuda\" but this process sees no CUDA device (no GPU, no "
                              "driver, or CUDA_VISIBLE_DEVICES hides them); use \"cpu\" or \"auto\"");
  return requested;
}

Backend world_backend(Backend backend, RunDevice device, bool nccl_built, const std::string& source) {
  if (backend == Backend::kAuto) return device == RunDevice::kCuda && nccl_built ? Backend::kNccl : Backend::kMpi;
  if (backend == Backend::kNccl) {
    if (device != RunDevice::kCuda)
      throw InputError(source + ": parallel.backend: \"nccl\" moves CUDA tensors, but run.device resolved to \"" +
                       option_name(device) + "\"; use parallel.backend = \"mpi\" (or \"auto\") for a CPU run");
    if (!nccl_built)
      throw InputError(source + ": parallel.backend: \"nccl\" but this build of deepen has no NCCL backend "
                                "(configure with CUDA and NCCL present); use \"mpi\" or \"auto\"");
  }
  return backend;
}

int rank_cuda_device(Backend backend, int local_rank, int cuda_devices) {
  (void)backend;  // one rule for both; the backend decides only whether sharing is then checked
  return choose_cuda_device(local_rank, cuda_devices);
}

int node_local_rank(const std::function<const char*(const char*)>& getenv, int mpi_local_rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* value = getenv(name);
    if (!value) continue;
    const std::string text = value;
    if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
      throw InputError(std::string("placement: ") + name + "=\"" + text + "\" is not a node-local rank "
                       "(a non-negative integer); the launcher's environment is broken");
    return std::stoi(text);
  }
  return mpi_local_rank;
}

}  // namespace deepen
