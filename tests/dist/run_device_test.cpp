// Device decisions without a GPU: run.device, the world backend that fits it, each rank's GPU.
#include <functional>

#include <gtest/gtest.h>

#include "config/config.h"
#include "config/input_error.h"
#include "dist/run_device.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

using test::error_of;

TEST(RunDevice, AutoIsCudaExactlyWhenAGpuIsVisible) {
  EXPECT_EQ(resolve_run_device("auto", 0, "x.toml"), "cpu");
  EXPECT_EQ(resolve_run_device("auto", 8, "x.toml"), "cuda");
  EXPECT_EQ(resolve_run_device("cpu", 8, "x.toml"), "cpu");
  EXPECT_EQ(resolve_run_device("cuda", 1, "x.toml"), "cuda");
}

TEST(RunDevice, CudaWithoutAGpuNamesTheFileAndKey) {
  const std::string e = error_of([] { resolve_run_device("cuda", 0, "x.toml"); });
  EXPECT_NE(e.find("x.toml: run.device"), std::string::npos) << e;
  EXPECT_NE(e.find("no CUDA device"), std::string::npos) << e;
}

TEST(RunDevice, ConfigAcceptsTheThreeValuesAndRejectsOthers) {
  EXPECT_EQ(parse_config("", "d.toml").run.device, "auto");
  EXPECT_EQ(parse_config("[run]\ndevice = \"cuda\"\n", "d.toml").run.device, "cuda");
  const std::string e = error_of([] { parse_config("[run]\ndevice = \"gpu\"\n", "d.toml"); });
  EXPECT_NE(e.find("run.device"), std::string::npos) << e;
  EXPECT_NE(e.find("\"gpu\""), std::string::npos) << e;
}

TEST(WorldBackend, NcclForCudaRunsMpiForCpuRunsAndHostStagingOnRequest) {
  EXPECT_EQ(world_backend("auto", "cuda", true, "x.toml"), "nccl");
  EXPECT_EQ(world_backend("auto", "cuda", false, "x.toml"), "mpi");
  EXPECT_EQ(world_backend("auto", "cpu", true, "x.toml"), "mpi");
  EXPECT_EQ(world_backend("mpi", "cuda", true, "x.toml"), "mpi");
  EXPECT_EQ(world_backend("nccl", "cuda", true, "x.toml"), "nccl");
}

TEST(WorldBackend, NcclWithoutCudaTensorsOrWithoutNcclIsAnInputError) {
  const std::string cpu = error_of([] { world_backend("nccl", "cpu", true, "x.toml"); });
  EXPECT_NE(cpu.find("x.toml: parallel.backend"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("run.device"), std::string::npos) << cpu;
  const std::string unbuilt = error_of([] { world_backend("nccl", "cuda", false, "x.toml"); });
  EXPECT_NE(unbuilt.find("no NCCL backend"), std::string::npos) << unbuilt;
}

TEST(RankCudaDevice, NcclNeedsAGpuPerRankMpiMayShare) {
  EXPECT_EQ(rank_cuda_device("nccl", 3, 4, 8), 3);
  EXPECT_EQ(rank_cuda_device("nccl", 3, 4, 1), 0);  // each task sees only its own GPU
  EXPECT_THROW(rank_cuda_device("nccl", 3, 4, 2), InputError);
  EXPECT_EQ(rank_cuda_device("mpi", 3, 4, 2), 1);
  EXPECT_EQ(rank_cuda_device("mpi", 0, 1, 8), 0);
  EXPECT_THROW(rank_cuda_device("mpi", 0, 1, 0), InputError);
}

}  // namespace
}  // namespace deepen
