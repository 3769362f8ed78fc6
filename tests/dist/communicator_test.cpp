// Communicator in one process: the MPI backend on a world of one, the backend choice, caller errors,
// and the NCCL backend on one GPU (skipped without CUDA).
#include <cstring>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "config/input_error.h"
#include "dist/communicator.h"
#include "dist/mpi_session.h"
#include "dist/run_device.h"
#ifdef DEEPEN_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace deepen {
namespace {

// MPI may be initialized once per process; ctest runs each test in its own process, and a
// singleton (no mpirun) world has one rank.
const MpiSession& session() {
  static MpiSession s;
  return s;
}

int cuda_devices() {
#ifdef DEEPEN_WITH_NCCL
  return c10::cuda::device_count();
#else
  return 0;
#endif
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(CommunicatorSingle, SendToSelfIsBitExactAndCollectivesAreIdentity) {
  auto comm = make_mpi_communicator(session());
  ASSERT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), Backend::kMpi);
  at::Tensor x = at::randn({1000});
  x[0] = std::numeric_limits<float>::quiet_NaN();
  at::Tensor y = at::empty({1000});
  auto r = comm->irecv(y, 0, 4);
  comm->send(x, 0, 4);
  r->wait();
  EXPECT_TRUE(r->test());
  EXPECT_TRUE(same_bits(x, y));
  at::Tensor z = x.clone();
  comm->all_reduce_avg(z);
  EXPECT_TRUE(same_bits(x, z));
  comm->broadcast(z, 0);
  EXPECT_TRUE(same_bits(x, z));
  EXPECT_EQ(comm->all_gather(int64_t{-5}), std::vector<int64_t>{-5});
  comm->barrier();
}

TEST(CommunicatorSingle, CallerMistakesAreRejectedBeforeAnythingIsPosted) {
  auto comm = make_mpi_communicator(session());
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW(comm->send(strided, 0, 0), std::invalid_argument);
  EXPECT_THROW(comm->send(at::zeros({4}), 1, 0), std::invalid_argument);       // no rank 1
  EXPECT_THROW(comm->send(at::zeros({4}), 0, 40000), std::invalid_argument);   // tag out of range
  EXPECT_THROW(comm->all_reduce_avg(at::zeros({4}, at::kLong)), std::invalid_argument);
  // The world still works afterwards.
  at::Tensor y = at::empty({2});
  auto r = comm->irecv(y, 0, 1);
  comm->send(at::ones({2}), 0, 1);
  r->wait();
  EXPECT_TRUE(at::equal(y, at::ones({2})));
}

TEST(CommunicatorSingle, SplitOutsideEveryGroupGivesNull) {
  auto comm = make_mpi_communicator(session());
  EXPECT_EQ(comm->split(-1, 0), nullptr);
  auto same = comm->split(0, 0);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(same->size(), 1);
  comm->abort();
  EXPECT_TRUE(same->aborted());  // aborting a parent reaches its children
  EXPECT_THROW(same->barrier(), CommError);
}

// parallel.backend = "auto" as a job resolves it (dist/run_device.h), then the communicator it makes.
TEST(CommunicatorSingle, AutoChoosesNcclOnlyWithAGpu) {
  const RunDevice device = resolve_run_device(RunDevice::kAuto, cuda_devices(), "x.toml");
  auto comm = make_communicator(world_backend(Backend::kAuto, device, nccl_available(), "x.toml"), session(), 300);
  EXPECT_EQ(comm->backend(), nccl_available() && cuda_devices() > 0 ? Backend::kNccl : Backend::kMpi);
  EXPECT_EQ(make_communicator(Backend::kMpi, session(), 300)->backend(), Backend::kMpi);
  if (!nccl_available() || cuda_devices() == 0)
    EXPECT_THROW(world_backend(Backend::kNccl, device, nccl_available(), "x.toml"), InputError);
}

TEST(CommunicatorNccl, OneRankOnOneGpu) {
  if (!nccl_available() || cuda_devices() == 0) GTEST_SKIP() << "no NCCL build or no CUDA device";
  auto comm = make_communicator(Backend::kNccl, session(), 300);
  ASSERT_EQ(comm->backend(), Backend::kNccl);
  const at::Device dev(at::kCUDA, 0);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor x = at::randn({4096}, at::TensorOptions().device(dev)).to(dtype);
    at::Tensor y = at::empty_like(x);
    auto r = comm->batch_isend_irecv({{Communicator::P2POp::kSend, x, 0, 0}, {Communicator::P2POp::kRecv, y, 0, 0}});
    r->wait();
    EXPECT_TRUE(same_bits(x.cpu(), y.cpu()));
    at::Tensor z = x.clone();
    comm->all_reduce_avg(z);
    EXPECT_TRUE(same_bits(x.cpu(), z.cpu()));
  }
  EXPECT_THROW(comm->send(at::zeros({4}), 0, 0), std::invalid_argument);  // a CPU tensor
  comm->abort();
  EXPECT_THROW(comm->barrier(), CommError);
}

}  // namespace
}  // namespace deepen
