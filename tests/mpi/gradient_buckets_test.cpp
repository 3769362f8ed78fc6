// Gradient buckets over real MPI ranks: launched from inside the backward pass (hooks) they give
// the same bits as launched after it, the students' mean gradient, and the launches really happen
// during the backward; both for the replicated all-reduce and the sharded reduce-scatter.
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "tests/mpi/mpi_test_env.h"
#include "train/gradient_buckets.h"
#include "train/shard_layout.h"

namespace deepen {
namespace {

using test::mpi;
using test::same_bits;

constexpr int kLayers = 4;

std::vector<at::Tensor> chain_params() {
  std::vector<at::Tensor> out;
  for (int i = 0; i < kLayers; ++i)
    out.push_back((at::randn({8, 8}, at::detail::createCPUGenerator(50 + i), at::TensorOptions().dtype(at::kDouble)) * 0.3)
                      .requires_grad_(true));
  return out;
}

// Two micro-batches of rank r's data through a chain of matrices; `arm` before the second
// backward (the last micro-batch), as the trainer does.
void backward(const std::vector<at::Tensor>& params, int rank, GradientBuckets* arm_me) {
  for (int micro = 0; micro < 2; ++micro) {
    at::Tensor h = at::randn({3, 8}, at::detail::createCPUGenerator(900 + 10 * rank + micro),
                             at::TensorOptions().dtype(at::kDouble));
    for (const at::Tensor& w : params) h = at::tanh(at::matmul(h, w));
    if (micro == 1 && arm_me) arm_me->arm();
    h.pow(2).sum().backward();
  }
}

// The students' mean gradient, made here from every rank's data.
std::vector<at::Tensor> mean_gradient(int ranks) {
  std::vector<at::Tensor> mean;
  for (int r = 0; r < ranks; ++r) {
    const auto params = chain_params();
    backward(params, r, nullptr);
    for (size_t i = 0; i < params.size(); ++i) {
      if (r == 0) mean.push_back(params[i].grad().clone());
      else mean[i] += params[i].grad();
    }
  }
  for (auto& m : mean) m /= ranks;
  return mean;
}

// fp64 sums of S values in another order: a few u = 2^-53 relative; 1e-12 of values ~1 is 1000x that.
constexpr double kTol = 1e-12;

TEST(GradientBuckets, AverageLaunchedDuringTheBackwardEqualsAfterItAndTheMean) {
  auto world = make_mpi_communicator(mpi());
  const int ranks = world->size(), rank = world->rank();
  CommStudentGroup group(*world, test::all_ranks(ranks));
  const auto mean = mean_gradient(ranks);

  std::vector<std::vector<at::Tensor>> results;
  for (bool overlap : {true, false}) {
    const auto params = chain_params();
    GradientBuckets buckets(group, GradientBuckets::Mode::kAverage);
    buckets.set_parameters(params, make_shard_layout(std::vector<int64_t>(kLayers, 64), 1, 64));  // one per matrix
    backward(params, rank, overlap ? &buckets : nullptr);
    const std::vector<bool> had = buckets.finish();
    EXPECT_EQ(had, std::vector<bool>(kLayers, true));
    // Armed, every bucket completes inside the backward (the last at the first matrix's gradient).
    EXPECT_EQ(buckets.launched_during_backward(), overlap ? kLayers : 0);
    std::vector<at::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad().clone());
    results.push_back(grads);
  }
  for (int i = 0; i < kLayers; ++i) {
    EXPECT_TRUE(same_bits(results[0][i], results[1][i])) << "matrix " << i;
    EXPECT_LT((results[0][i] - mean[i]).abs().max().item<double>(), kTol) << "matrix " << i;
  }
}

TEST(GradientBuckets, ReduceScatterLaunchedDuringTheBackwardEqualsAfterItAndTheMean) {
  auto world = make_mpi_communicator(mpi());
  const int ranks = world->size(), rank = world->rank();
  CommStudentGroup group(*world, test::all_ranks(ranks));
  const auto mean = mean_gradient(ranks);
  // 100 doubles per bucket: a matrix (64) per bucket, each split among the ranks.
  const ShardLayout layout = make_shard_layout(std::vector<int64_t>(kLayers, 64), ranks, 100);

  std::vector<at::Tensor> shards;
  for (bool overlap : {true, false}) {
    const auto params = chain_params();
    GradientBuckets buckets(group, GradientBuckets::Mode::kReduceScatter);
    buckets.set_parameters(params, layout);
    const at::Tensor shard = at::zeros({layout.shard_numel()}, at::kDouble);
    buckets.set_shard(shard);
    backward(params, rank, overlap ? &buckets : nullptr);
    buckets.finish();
    EXPECT_EQ(buckets.launched_during_backward(), overlap ? kLayers : 0);
    for (const auto& p : params) EXPECT_FALSE(p.grad().defined()) << "the bucket took the gradient";
    shards.push_back(shard);
  }
  EXPECT_TRUE(same_bits(shards[0], shards[1]));
  for (const ShardLayout::Owned& o : layout.owned(rank)) {
    const at::Tensor want = mean[static_cast<size_t>(o.param)].reshape({-1}).narrow(0, o.param_offset, o.numel);
    EXPECT_LT((shards[0].narrow(0, o.shard_offset, o.numel) - want).abs().max().item<double>(), kTol)
        << "matrix " << o.param;
  }
}

}  // namespace
}  // namespace deepen
