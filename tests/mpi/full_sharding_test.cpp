// Full sharding (parallel.sharding = "full") over real MPI ranks: a GrowableStudent trained with its
// blocks' parameters sharded, gathered block by block through the student's BlockGate (forward,
// recomputed backward, evaluation), against the same student trained in one process by plain AdamW
// on the mean gradient of every rank's micro-batches; through growth, a frozen prefix and a phase
// reset, with the blocks emptied between uses.
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dist/comm_student_group.h"
#include "dist/communicator.h"
#include "model/student.h"
#include "tests/mpi/mpi_test_env.h"
#include "train/adamw.h"
#include "train/sharded_adamw.h"

namespace deepen {
namespace {

using test::mpi;

// eps = 1e-4 instead of AdamW's usual 1e-8: Adam's update m/(sqrt(v)+eps) amplifies a gradient
// difference by up to 1/eps where the gradient is near zero, and with 1e-8 that turns rounding
// differences into parameter differences no tolerance below a real fault could bound (observed
// 1.2e-6 on one element of a freshly grown block). The code under test is the same for any eps.
const AdamWOptions kOptions{.weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-4};
constexpr double kLr = 1e-3;
constexpr double kClip = 0.5;
constexpr int64_t kMicro = 2, kBatch = 2, kSeq = 6, kVocab = 32;
// fp64 parameters and activations (spec.dtype), except inside the RMSNorms, which normalize in
// fp32 as HF's do. The two sides differ only in the order in which gradients are summed (per-rank
// means reduce-scattered vs one process's running sum over all micro-batches): ~1e-16 relative,
// which the fp32 normalization turns into differences of up to u = 2^-24 ≈ 6e-8 relative wherever
// it flips a rounding (observed: gradient norms 1e-8 apart relative on S = 3; bit-equal on S = 2
// and 4, where the averages divide exactly). With gradient elements at most the gradient norm
// (~1 here), a gradient element moves by at most ~6e-8, and an update by at most lr·6e-8/eps =
// 6e-7; the 7 steps by ~4e-6. kTol = 1e-5 is above that and 100x below what a fault moves: a wrong
// slice, a lost micro-batch or a stale block changes parameters by ~lr·|g|/(|g|+eps) ≈ 1e-3.
constexpr double kTol = 1e-5;

StudentSpec tiny_spec() {
  StudentSpec s;
  s.decoder.hidden = 16;
  s.decoder.heads = 2;
  s.decoder.kv_heads = 1;
  s.decoder.head_dim = 8;
  s.decoder.intermediate = 24;
  s.decoder.cpu_kernels = CpuKernels::kAten;  // one op sequence on every rank and side
  s.decoder.recompute = Recompute::kLayer;
  s.vocab_size = kVocab;
  s.max_depth = 4;
  s.tie_embeddings = false;
  s.dtype = at::kDouble;
  return s;
}

// Rank r's micro-batch m of step `step` (every process can make every rank's).
at::Tensor ids_of(int rank, int64_t step, int64_t micro) {
  const uint64_t seed = 7919ull * static_cast<uint64_t>(step + 1) + 104729ull * static_cast<uint64_t>(rank + 1) +
                        static_cast<uint64_t>(micro);
  return at::randint(kVocab, {kBatch, kSeq}, at::detail::createCPUGenerator(seed), at::kLong);
}

at::Tensor loss_of(GrowableStudent& s, const at::Tensor& ids) {
  const at::Tensor logits = s.forward(ids.narrow(1, 0, kSeq - 1));
  return at::cross_entropy_loss(logits.reshape({-1, kVocab}), ids.narrow(1, 1, kSeq - 1).reshape({-1}));
}

std::vector<int64_t> units_of(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<int64_t> out;
  for (const auto& [name, p] : params) out.push_back(block_of_parameter(name));
  return out;
}

struct Sides {
  GrowableStudent sharded_model{tiny_spec(), 2, 5};
  GrowableStudent whole_model{tiny_spec(), 2, 5};
  ShardedAdamW& sharded;
  AdamW whole{kOptions};

  // Both optimizers take the models' trainable parameters (the sharded one inside a WholeScope).
  void set_parameters() {
    const auto params = sharded_model.named_trainable_parameters();
    sharded.set_parameters(params, units_of(params));
    std::vector<std::string> names;
    for (const auto& [name, p] : whole_model.named_trainable_parameters()) {
      whole.add(name, p);
      names.push_back(name);
    }
    whole.keep_only(names);
  }
};

// One step of each side; returns the sharded side's gradient norm (the whole side's is checked).
void step_both(Sides& s, int64_t step, int ranks, int rank, bool overlap) {
  for (int64_t m = 0; m < kMicro; ++m) {
    if (overlap) s.sharded.arm_reduction();
    (loss_of(s.sharded_model, ids_of(rank, step, m)) / kMicro).backward();
    s.sharded.accumulate_reduction();
  }
  const double norm = s.sharded.reduce_gradients();
  s.sharded.update(kLr, kClip, norm);
  s.sharded.gather_parameters();

  for (int r = 0; r < ranks; ++r)
    for (int64_t m = 0; m < kMicro; ++m) (loss_of(s.whole_model, ids_of(r, step, m)) / (kMicro * ranks)).backward();
  std::vector<at::Tensor> grads;
  double sq = 0;
  for (const auto& [name, p] : s.whole_model.named_trainable_parameters()) {
    grads.push_back(p.grad());
    sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  const double whole_norm = std::sqrt(sq);
  EXPECT_NEAR(norm, whole_norm, 1e-6 * whole_norm) << "step " << step;
  if (whole_norm > kClip)
    for (auto& g : grads) g.mul_(kClip / (whole_norm + 1e-6));
  s.whole.step(kLr);
  s.whole.zero_grad();
}

// Between steps a sharded block holds no values, and the rank keeps its slices of them.
void expect_blocks_emptied(GrowableStudent& model, const std::string& when) {
  for (const auto& [name, p] : model.named_trainable_parameters())
    if (block_of_parameter(name) >= 0) EXPECT_EQ(p.numel(), 0) << name << " " << when;
}

void expect_same(Sides& s, const std::string& when) {
  const ShardedAdamW::WholeScope whole(&s.sharded);
  const auto a = s.sharded_model.named_parameters(), b = s.whole_model.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : b) {
    const at::Tensor& x = a[item.key()];
    ASSERT_EQ(x.sizes(), item.value().sizes()) << item.key() << " " << when;
    EXPECT_LT((x - item.value()).abs().max().item<double>(), kTol) << item.key() << " " << when;
  }
}

TEST(FullSharding, EqualsOneProcessAdamWThroughGrowthFreezeAndResetWithBlocksGatheredOnUse) {
  auto world = make_mpi_communicator(mpi());
  const int ranks = world->size(), rank = world->rank();
  CommStudentGroup group(*world, test::all_ranks(ranks));
  // 256 bytes = 32 doubles per bucket: a block (~2 k parameters) spans many buckets, most split.
  ShardedAdamW sharded(kOptions, group, 256, ShardedAdamW::Mode::kFull);
  Sides s{.sharded = sharded};
  s.sharded_model.set_block_gate(&sharded);
  s.set_parameters();
  expect_blocks_emptied(s.sharded_model, "after set_parameters");

  int64_t step = 0;
  for (; step < 3; ++step) step_both(s, step, ranks, rank, /*overlap=*/step % 2 == 0);
  expect_blocks_emptied(s.sharded_model, "after 3 steps");
  expect_same(s, "after 3 steps");

  // Evaluation outside a WholeScope: each block gathered for its forward and emptied after.
  {
    at::NoGradGuard no_grad;
    const at::Tensor ids = ids_of(0, 99, 0);
    const at::Tensor got = s.sharded_model.forward(ids), want = s.whole_model.forward(ids);
    EXPECT_LT((got - want).abs().max().item<double>(), kTol) << "evaluation logits";
    expect_blocks_emptied(s.sharded_model, "after an evaluation forward");
  }

  // Growth inside a WholeScope, as the trainer grows: the new block starts whole everywhere.
  {
    const ShardedAdamW::WholeScope whole(&sharded);
    s.sharded_model.grow_to(3, GrowInit::kRandom);
    s.whole_model.grow_to(3, GrowInit::kRandom);
    s.set_parameters();
  }
  expect_blocks_emptied(s.sharded_model, "after growth");
  for (; step < 5; ++step) step_both(s, step, ranks, rank, true);
  expect_same(s, "after growth");

  // A frozen prefix: block 0 and the ends stop training; their tensors stay whole.
  {
    const ShardedAdamW::WholeScope whole(&sharded);
    s.sharded_model.freeze_prefix(1);
    s.whole_model.freeze_prefix(1);
    s.set_parameters();
  }
  EXPECT_GT(s.sharded_model.block(0)->self_attn->q_proj->weight.numel(), 0) << "a frozen block is never sharded";
  step_both(s, step++, ranks, rank, false);
  expect_same(s, "after a freeze");

  // A phase reset: fresh moments and step counts.
  s.whole.clear();
  {
    const ShardedAdamW::WholeScope whole(&sharded);
    sharded.clear();
    s.set_parameters();
  }
  step_both(s, step++, ranks, rank, true);
  expect_same(s, "after a phase reset");
  EXPECT_THROW(sharded.clear(), std::logic_error) << "clearing emptied blocks outside a WholeScope loses them";

  // The values a rank holds: its slices of the trained blocks, not the blocks.
  int64_t whole_bytes = 0;
  for (const auto& [name, p] : s.whole_model.named_trainable_parameters()) whole_bytes += p.numel() * 8;
  if (ranks > 1) EXPECT_LT(sharded.parameter_bytes(), whole_bytes * 3 / 4 + 4096) << "ranks " << ranks;

  // Inside a WholeScope every rank holds the same bits.
  const ShardedAdamW::WholeScope whole(&sharded);
  for (const auto& item : s.sharded_model.named_parameters()) {
    const auto sums = world->all_gather(test::bytes_checksum(item.value()));
    for (int r = 1; r < ranks; ++r) EXPECT_EQ(sums[r], sums[0]) << item.key() << " on rank " << r;
  }
}

}  // namespace
}  // namespace deepen
