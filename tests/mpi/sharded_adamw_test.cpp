// Sharded AdamW over real MPI ranks against one process's replicated AdamW on the mean gradient:
// through growth (a parameter inserted mid-order), a freeze (one dropped), a phase reset, gradient
// clipping, and checkpoints read back on the same layout (own shard) and on another (whole state).
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "model/tensor_bridge.h"
#include "run_folder/run_folder.h"
#include "tests/mpi/mpi_test_env.h"
#include "train/adamw.h"
#include "train/optimizer_state_files.h"
#include "train/sharded_adamw.h"

namespace deepen {
namespace {

using test::mpi;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

const AdamWOptions kOptions{.weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
constexpr double kLr = 1e-2;
// fp64 throughout: the sharded and replicated sides differ only in the order of the gradient
// sums over ranks (reduce-scatter vs one process's mean) and of the norm's partial sums, each a
// relative error of a few u = 2^-53 ≈ 1.1e-16. Adam's m/(sqrt(v)+eps) passes it on at O(1) and a
// step moves a value by at most ~lr, so after k steps the sides differ by ~k·lr·1e-15. 1e-12 is
// 1000x that, and 1000x below what any real fault moves (a wrong slice, step count or decay moves
// values by lr·wd = 1e-3 or more).
constexpr double kTol = 1e-12;

// Rank r's gradient of parameter `name` at `step` (every rank can compute every rank's).
at::Tensor grad_of(int rank, int64_t step, const std::string& name, at::IntArrayRef shape) {
  uint64_t seed = 1000003ull * static_cast<uint64_t>(step + 1) + 7919ull * static_cast<uint64_t>(rank + 1);
  for (char c : name) seed = seed * 131 + static_cast<uint64_t>(c);
  return at::randn(shape, at::detail::createCPUGenerator(seed), at::TensorOptions().dtype(at::kDouble));
}

struct Model {
  std::map<std::string, at::Tensor> params;  // by name
  Named ordered(const std::vector<std::string>& order) const {
    Named out;
    for (const auto& n : order) out.emplace_back(n, params.at(n));
    return out;
  }
};

at::Tensor leaf(at::IntArrayRef shape, uint64_t seed) {
  return at::randn(shape, at::detail::createCPUGenerator(seed), at::TensorOptions().dtype(at::kDouble))
      .requires_grad_(true);
}

// Both models get the same parameters; sharded gets rank r's gradients, replicated the mean
// (clipped as the trainer clips); then one step each.
void step_both(int64_t step, const std::vector<std::string>& order, Model& sharded_model, ShardedAdamW& sharded,
               Model& replicated_model, AdamW& replicated, int ranks, int rank, double max_norm) {
  std::vector<at::Tensor> mean_grads;
  for (const auto& n : order) {
    const at::Tensor& p = sharded_model.params.at(n);
    p.mutable_grad() = grad_of(rank, step, n, p.sizes());
    at::Tensor mean = at::zeros(p.sizes(), at::kDouble);
    for (int q = 0; q < ranks; ++q) mean += grad_of(q, step, n, p.sizes());
    mean_grads.push_back(mean / ranks);
  }
  double sq = 0;
  for (const auto& g : mean_grads) sq += g.pow(2).sum().item<double>();
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm)
    for (auto& g : mean_grads) g.mul_(max_norm / (norm + 1e-6));
  for (size_t i = 0; i < order.size(); ++i) replicated_model.params.at(order[i]).mutable_grad() = mean_grads[i];
  replicated.step(kLr);
  replicated.zero_grad();

  const double got = sharded.reduce_gradients();
  EXPECT_NEAR(got, norm, 1e-12 * norm) << "step " << step;
  sharded.update(kLr, max_norm, got);
  sharded.gather_parameters();
  for (const auto& n : order) EXPECT_FALSE(sharded_model.params.at(n).grad().defined()) << n;
}

void expect_same(const Model& a, const Model& b, const std::vector<std::string>& order, const std::string& when) {
  for (const auto& n : order) {
    const double diff = (a.params.at(n) - b.params.at(n)).abs().max().item<double>();
    EXPECT_LT(diff, kTol) << n << " " << when;
  }
}

TEST(ShardedAdamW, EqualsReplicatedAdamWThroughGrowthFreezeResetAndCheckpoints) {
  auto world = make_mpi_communicator(mpi());
  const int ranks = world->size(), rank = world->rank();
  CommStudentGroup group(*world, test::all_ranks(ranks));

  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"a", {5, 3}}, {"b", {7}}, {"c", {4, 4}}, {"d", {3, 6}}, {"e", {2}}};
  Model sm, rm;
  uint64_t seed = 11;
  for (const auto& [n, s] : shapes) {
    const at::Tensor init = leaf(s, seed++);
    sm.params[n] = init.detach().clone().requires_grad_(true);
    rm.params[n] = init.detach().clone().requires_grad_(true);
  }
  // 48 bytes = 6 doubles per bucket: several buckets, parameters split between ranks.
  ShardedAdamW sharded(kOptions, group, 48);
  AdamW replicated(kOptions);
  auto set_both = [&](const std::vector<std::string>& order) {
    sharded.set_parameters(sm.ordered(order));
    for (const auto& n : order) replicated.add(n, rm.params.at(n));
    replicated.keep_only(order);
  };

  int64_t step = 0;
  std::vector<std::string> order = {"a", "b", "c"};
  set_both(order);
  for (; step < 3; ++step) step_both(step, order, sm, sharded, rm, replicated, ranks, rank, 0.0);
  expect_same(sm, rm, order, "after 3 steps");

  order = {"a", "d", "b", "c", "e"};  // growth: new parameters in the middle and at the end
  set_both(order);
  for (; step < 5; ++step) step_both(step, order, sm, sharded, rm, replicated, ranks, rank, 0.5);  // clipped
  expect_same(sm, rm, order, "after growth");

  order = {"d", "b", "c", "e"};  // freeze: "a" stops training and drops its state
  set_both(order);
  step_both(step++, order, sm, sharded, rm, replicated, ranks, rank, 0.0);
  expect_same(sm, rm, order, "after a freeze");
  EXPECT_EQ(sharded.names(), order);

  sharded.clear();  // phase reset: fresh moments and step counts everywhere
  replicated.clear();
  set_both(order);
  step_both(step++, order, sm, sharded, rm, replicated, ranks, rank, 0.0);
  expect_same(sm, rm, order, "after a phase reset");

  // Every rank's parameters are the same bits: they were all-gathered, not recomputed.
  for (const auto& n : order) {
    const auto sums = world->all_gather(test::bytes_checksum(sm.params.at(n)));
    for (int r = 1; r < ranks; ++r) EXPECT_EQ(sums[r], sums[0]) << n << " on rank " << r;
  }

  // 1/S of the moments per rank, up to one padding element per bucket.
  int64_t whole = 0;
  for (const auto& n : order) whole += 2 * sm.params.at(n).numel() * 8;
  EXPECT_LE(sharded.state_bytes(), whole / ranks + 2 * 8 * static_cast<int64_t>(sharded.layout().buckets.size()));

  // Checkpoint: each rank's shard file in one folder; read back (a) by the same layout from its own
  // file, (b) as whole state by another bucket size and by the replicated optimizer.
  const std::string dir = (std::filesystem::temp_directory_path() / "deepen_sharded_adamw_test").string();
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world->barrier();
  write_tensors(RunFolder::checkpoint_optimizer_shard(dir, rank, ranks), sharded.shard_state());
  world->barrier();
  ASSERT_EQ(optimizer_shard_count(dir), ranks);

  ShardedAdamW same_layout(kOptions, group, 48);
  same_layout.set_parameters(sm.ordered(order));
  EXPECT_TRUE(same_layout.load_shard_state(read_tensors(RunFolder::checkpoint_optimizer_shard(dir, rank, ranks))));

  std::map<std::string, std::vector<int64_t>> trained;
  for (const auto& n : order) trained[n] = shapes.at(n);
  const auto state = read_whole_optimizer_state(dir, trained);
  for (const auto& [key, t] : replicated.state_tensors()) {
    ASSERT_TRUE(state.count(key)) << key;
    EXPECT_LT((state.at(key).to(at::kDouble) - t.to(at::kDouble)).abs().max().item<double>(), kTol) << key;
  }
  ShardedAdamW other_layout(kOptions, group, 1 << 20);  // one bucket: another split
  other_layout.set_parameters(sm.ordered(order));
  if (ranks > 1)
    EXPECT_FALSE(other_layout.load_shard_state(read_tensors(RunFolder::checkpoint_optimizer_shard(dir, rank, ranks))));
  other_layout.load_full_state(state);

  // One more step from each restored optimizer equals the uninterrupted one (each on its own copy).
  Model a = sm, b = sm, c = sm;
  for (Model* m : {&a, &b, &c})
    for (auto& [n, p] : m->params) p = p.detach().clone().requires_grad_(true);
  same_layout.set_parameters(a.ordered(order));
  other_layout.set_parameters(b.ordered(order));
  sharded.set_parameters(c.ordered(order));
  for (auto* opt : {&same_layout, &other_layout, &sharded}) {
    Model& m = opt == &same_layout ? a : opt == &other_layout ? b : c;
    for (const auto& n : order) m.params.at(n).mutable_grad() = grad_of(rank, step, n, m.params.at(n).sizes());
    const double norm = opt->reduce_gradients();
    opt->update(kLr, 0.0, norm);
    opt->gather_parameters();
  }
  expect_same(a, c, order, "resumed from its own shard vs uninterrupted");
  expect_same(b, c, order, "resumed from the whole state on another layout vs uninterrupted");
  world->barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deepen
