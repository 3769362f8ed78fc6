// Device decisions without a GPU: run.device, the world backend that fits it, each rank's GPU.
#include <functional>
#include <map>

#include <gtest/gtest.h>

#include "config/config.h"
#include "config/input_error.h"
#include "dist/run_device.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

using test::error_of;

TEST(RunDevice, AutoIsCudaExactlyWhenAGpuIsVisible) {
  EXPECT_EQ(resolve_run_device(RunDevice::kAuto, 0, "x.toml"), RunDevice::kCpu);
  EXPECT_EQ(resolve_run_device(RunDevice::kAuto, 8, "x.toml"), RunDevice::kCuda);
  EXPECT_EQ(resolve_run_device(RunDevice::kCpu, 8, "x.toml"), RunDevice::kCpu);
  EXPECT_EQ(resolve_run_device(RunDevice::kCuda, 1, "x.toml"), RunDevice::kCuda);
}

TEST(RunDevice, CudaWithoutAGpuNamesTheFileAndKey) {
  const std::string e = error_of([] { resolve_run_device(RunDevice::kCuda, 0, "x.toml"); });
  EXPECT_NE(e.find("x.toml: run.device"), std::string::npos) << e;
  EXPECT_NE(e.find("no CUDA device"), std::string::npos) << e;
}

TEST(RunDevice, ConfigAcceptsTheThreeValuesAndRejectsOthers) {
  EXPECT_EQ(parse_config("", "d.toml").run.device, RunDevice::kAuto);
  EXPECT_EQ(parse_config("[run]\ndevice = \"cuda\"\n", "d.toml").run.device, RunDevice::kCuda);
  const std::string e = error_of([] { parse_config("[run]\ndevice = \"gpu\"\n", "d.toml"); });
  EXPECT_NE(e.find("run.device"), std::string::npos) << e;
  EXPECT_NE(e.find("\"gpu\""), std::string::npos) << e;
}

TEST(WorldBackend, NcclForCudaRunsMpiForCpuRunsAndHostStagingOnRequest) {
  EXPECT_EQ(world_backend(Backend::kAuto, RunDevice::kCuda, true, "x.toml"), Backend::kNccl);
  EXPECT_EQ(world_backend(Backend::kAuto, RunDevice::kCuda, false, "x.toml"), Backend::kMpi);
  EXPECT_EQ(world_backend(Backend::kAuto, RunDevice::kCpu, true, "x.toml"), Backend::kMpi);
  EXPECT_EQ(world_backend(Backend::kMpi, RunDevice::kCuda, true, "x.toml"), Backend::kMpi);
  EXPECT_EQ(world_backend(Backend::kNccl, RunDevice::kCuda, true, "x.toml"), Backend::kNccl);
}

TEST(WorldBackend, NcclWithoutCudaTensorsOrWithoutNcclIsAnInputError) {
  const std::string cpu = error_of([] { world_backend(Backend::kNccl, RunDevice::kCpu, true, "x.toml"); });
  EXPECT_NE(cpu.find("x.toml: parallel.backend"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("run.device"), std::string::npos) << cpu;
  const std::string unbuilt = error_of([] { world_backend(Backend::kNccl, RunDevice::kCuda, false, "x.toml"); });
  EXPECT_NE(unbuilt.find("no NCCL backend"), std::string::npos) << unbuilt;
}

TEST(RankCudaDevice, LocalRankModuloVisibleDevicesForBothBackends) {
  EXPECT_EQ(rank_cuda_device(Backend::kNccl, 3, 8), 3);
  EXPECT_EQ(rank_cuda_device(Backend::kNccl, 3, 1), 0);  // each task sees only its own GPU
  EXPECT_EQ(rank_cuda_device(Backend::kNccl, 5, 4), 1);  // each task sees the 4 GPUs of its socket
  EXPECT_EQ(rank_cuda_device(Backend::kMpi, 3, 2), 1);
  EXPECT_EQ(rank_cuda_device(Backend::kMpi, 0, 8), 0);
  EXPECT_THROW(rank_cuda_device(Backend::kMpi, 0, 0), InputError);
  EXPECT_THROW(rank_cuda_device(Backend::kNccl, 0, 0), InputError);
}

// An environment for node_local_rank: name -> value; absent = unset.
std::function<const char*(const char*)> env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(NodeLocalRank, MpirunsNumberFirstThenSlurmsThenMpis) {
  // mpirun inside an allocation: every rank inherited the batch step's SLURM_LOCALID = 0.
  EXPECT_EQ(node_local_rank(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_LOCALID", "0"}}), 7), 3);
  EXPECT_EQ(node_local_rank(env({{"SLURM_LOCALID", "2"}}), 7), 2);  // srun
  EXPECT_EQ(node_local_rank(env({}), 7), 7);                         // neither: MPI's shared-memory split
}

TEST(NodeLocalRank, AMalformedValueNamesTheVariable) {
  const std::string e = error_of([] { node_local_rank(env({{"SLURM_LOCALID", "x"}}), 0); });
  EXPECT_NE(e.find("SLURM_LOCALID=\"x\""), std::string::npos) << e;
  EXPECT_THROW(node_local_rank(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}}), 0), InputError);
  EXPECT_THROW(node_local_rank(env({{"OMPI_COMM_WORLD_LOCAL_RANK", ""}}), 0), InputError);
}

}  // namespace
}  // namespace deepen
