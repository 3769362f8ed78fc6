// Multi-rank tests of the MPI communicator: bit-exact point-to-point, broadcast, all-reduce against
// the single-process result, the layout's groups, and abort unblocking a stuck rank.
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "dist/communicator.h"
#include "dist/rank_layout.h"
#include "tests/mpi/mpi_test_env.h"

namespace deepen {
namespace {

using test::mpi;
using test::same_bits;

// The tensor rank `r` contributes: random values plus the fp32 values that a lossy path would
// change (NaN with a payload, infinities, a denormal, -0), seeded by rank and salt.
at::Tensor rank_tensor(int r, int64_t n, at::ScalarType dtype, int salt = 0) {
  at::Generator gen = at::detail::createCPUGenerator(1000 * r + salt + 1);
  at::Tensor t = at::randn({n}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  if (dtype == at::kFloat && n >= 5) {
    float* p = t.data_ptr<float>();
    uint32_t nan_bits = 0x7fc01234u;  // quiet NaN with a payload
    std::memcpy(&p[0], &nan_bits, 4);
    p[1] = std::numeric_limits<float>::infinity();
    p[2] = -std::numeric_limits<float>::infinity();
    p[3] = std::numeric_limits<float>::denorm_min();
    p[4] = -0.0f;
  }
  return t;
}

class Comm : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(Comm, SendRecvAroundARingIsBitExact) {
  auto world = make_mpi_communicator(mpi());
  const int r = world->rank(), n = world->size();
  const at::ScalarType dtype = GetParam();
  for (int64_t numel : {int64_t{1}, int64_t{1000}, int64_t{300'000}}) {
    const at::Tensor mine = rank_tensor(r, numel, dtype);
    at::Tensor got = at::zeros({numel}, at::TensorOptions().dtype(dtype));
    auto sending = world->isend(mine, (r + 1) % n, 3);
    world->recv(got, (r + n - 1) % n, 3);
    sending->wait();
    EXPECT_TRUE(same_bits(got, rank_tensor((r + n - 1) % n, numel, dtype))) << numel << " elements";
  }
}

// A streaming sender with two buffers in flight (the pipeline's back-pressure pattern): rank 0
// sends 12 micro-batches of varying size to every other rank, reusing a buffer only after test()
// or wait() said its previous send finished.
TEST_P(Comm, BoundedInFlightStreamArrivesInOrderAndIntact) {
  auto world = make_mpi_communicator(mpi());
  const at::ScalarType dtype = GetParam();
  constexpr int kBatches = 12, kInFlight = 2;
  auto numel_of = [](int i) { return int64_t{1000} * (1 + i % 3) + i; };
  if (world->rank() == 0) {
    for (int dst = 1; dst < world->size(); ++dst) {
      std::vector<std::unique_ptr<Request>> slots(kInFlight);
      for (int i = 0; i < kBatches; ++i) {
        auto& slot = slots[i % kInFlight];
        if (slot && !slot->test()) slot->wait();
        slot = world->isend(rank_tensor(0, numel_of(i), dtype, i), dst, 7);
      }
      for (auto& s : slots) s->wait();
    }
  } else {
    std::vector<at::Tensor> got;
    std::vector<std::unique_ptr<Request>> recvs;
    for (int i = 0; i < kBatches; ++i) {
      got.push_back(at::empty({numel_of(i)}, at::TensorOptions().dtype(dtype)));
      recvs.push_back(world->irecv(got.back(), 0, 7));
    }
    for (int i = 0; i < kBatches; ++i) {
      recvs[i]->wait();
      EXPECT_TRUE(same_bits(got[i], rank_tensor(0, numel_of(i), dtype, i))) << "micro-batch " << i;
    }
  }
  world->barrier();
}

TEST_P(Comm, BroadcastFromEveryRootIsBitExact) {
  auto world = make_mpi_communicator(mpi());
  for (int root = 0; root < world->size(); ++root) {
    at::Tensor t = world->rank() == root ? rank_tensor(root, 5000, GetParam())
                                         : at::zeros({5000}, at::TensorOptions().dtype(GetParam()));
    world->broadcast(t, root);
    EXPECT_TRUE(same_bits(t, rank_tensor(root, 5000, GetParam()))) << "root " << root;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Comm, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// Messages above max_message_bytes travel as several MPI messages; the result must not show it.
TEST(CommPieces, LargeMessagesInPiecesAreBitExact) {
  auto world = make_mpi_communicator(mpi(), /*max_message_bytes=*/1000);
  const int r = world->rank(), n = world->size();
  const at::Tensor mine = rank_tensor(r, 12'345, at::kFloat);  // 49380 bytes: 50 pieces, last short
  at::Tensor got = at::empty({12'345}, at::kFloat);
  auto sending = world->isend(mine, (r + 1) % n, 0);
  world->recv(got, (r + n - 1) % n, 0);
  sending->wait();
  EXPECT_TRUE(same_bits(got, rank_tensor((r + n - 1) % n, 12'345, at::kFloat)));

  at::Tensor b = r == 0 ? rank_tensor(0, 4001, at::kFloat) : at::zeros({4001}, at::kFloat);
  world->broadcast(b, 0);
  EXPECT_TRUE(same_bits(b, rank_tensor(0, 4001, at::kFloat)));

  at::Tensor x = at::full({3001}, static_cast<double>(r + 1), at::kDouble);
  world->all_reduce_sum(x);
  EXPECT_TRUE(at::all(x == n * (n + 1) / 2.0).item<bool>());
}

// A receiver expecting another shape than the sender's fails loudly instead of training on garbage.
TEST(CommPieces, ASizeMismatchIsACommErrorNamingTheSizes) {
  auto world = make_mpi_communicator(mpi());
  if (world->rank() == 0) {
    world->send(at::ones({100}, at::kFloat), 1, 1);
    world->send(at::ones({100}, at::kFloat), 1, 2);
  } else if (world->rank() == 1) {
    at::Tensor bigger = at::empty({200}, at::kFloat);
    try {
      world->recv(bigger, 0, 1);
      ADD_FAILURE() << "a 400-byte message filled an 800-byte tensor";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("carried 400 bytes, expected 800"), std::string::npos) << e.what();
    }
    at::Tensor smaller = at::empty({50}, at::kFloat);
    EXPECT_THROW(world->recv(smaller, 0, 2), CommError);  // MPI: message truncated
  }
  world->barrier();
}

TEST(CommCollectives, AllReduceAverageEqualsTheSingleProcessAverage) {
  auto world = make_mpi_communicator(mpi());
  const int n = world->size();
  for (int64_t numel : {int64_t{7}, int64_t{100'003}}) {
    at::Tensor x = at::randn({numel}, at::detail::createCPUGenerator(17 + world->rank()));
    std::vector<at::Tensor> all;
    for (int r = 0; r < n; ++r) all.push_back(at::randn({numel}, at::detail::createCPUGenerator(17 + r)));
    const at::Tensor expected = at::stack(all).to(at::kDouble).mean(0).to(at::kFloat);
    // Derived, for any reduction order (ring, tree, any lane count): an fp32 sum of n values errs
    // by at most γ_{n−1}·Σ|x_r| (γ_k = k·u/(1 − k·u), u = 2^-24); the ÷n and the expected value's own
    // rounding to fp32 add u·|mean| each. Elementwise, not a fitted rtol/atol.
    const double u = 0x1p-24;
    const at::Tensor abs_mean = at::stack(all).to(at::kDouble).abs().mean(0);
    const at::Tensor bound = ((n - 1) * u / (1 - (n - 1) * u)) * abs_mean + 2 * u * expected.to(at::kDouble).abs();
    world->all_reduce_avg(x);
    EXPECT_TRUE(((x - expected).to(at::kDouble).abs() <= bound).all().item<bool>())
        << "max abs diff " << (x - expected).abs().max().item<float>();

    at::Tensor xb = at::randn({numel}, at::detail::createCPUGenerator(17 + world->rank())).to(at::kBFloat16);
    std::vector<at::Tensor> allb;
    for (int r = 0; r < n; ++r)
      allb.push_back(at::randn({numel}, at::detail::createCPUGenerator(17 + r)).to(at::kBFloat16).to(at::kFloat));
    const at::Tensor expected_b = at::stack(allb).to(at::kDouble).mean(0);
    world->all_reduce_avg(xb);
    // The average is summed in fp32 (the bound above) and rounded to bf16 once: half a bf16 ulp,
    // ≤ 2^-9 of the value (taken of the exact value plus the fp32 error: 2^-8 covers both).
    const at::Tensor abs_mean_b = at::stack(allb).to(at::kDouble).abs().mean(0);
    const at::Tensor bound_b = 0x1p-8 * expected_b.abs() + 2 * ((n + 1) * u) * abs_mean_b;
    EXPECT_TRUE(((xb.to(at::kDouble) - expected_b).abs() <= bound_b).all().item<bool>())
        << "max abs diff " << (xb.to(at::kDouble) - expected_b).abs().max().item<double>();
  }
}

// Sharded data parallelism's two collectives, whole and in pieces (a 64-byte message limit splits
// every chunk), against the single-process result: rank r's chunk of the mean, and every rank's
// chunk gathered. The bounds are the all-reduce's (same sum of n values, any order).
TEST(CommCollectives, ReduceScatterGivesEachRankItsChunkOfTheMeanAndAllGatherReassembles) {
  const int n = mpi().size();
  for (int64_t max_bytes : {int64_t{1} << 30, int64_t{64}}) {
    auto world = make_mpi_communicator(mpi(), max_bytes);
    const int r = world->rank();
    for (int64_t chunk : {int64_t{1}, int64_t{37}, int64_t{10'001}}) {
      std::vector<at::Tensor> all;
      for (int q = 0; q < n; ++q) all.push_back(at::randn({n * chunk}, at::detail::createCPUGenerator(31 + q)));
      const at::Tensor expected = at::stack(all).to(at::kDouble).mean(0).narrow(0, r * chunk, chunk);
      at::Tensor mine = at::empty({chunk});
      world->ireduce_scatter_avg(all[r].clone(), mine)->wait();
      const double u = 0x1p-24;
      const at::Tensor abs_mean = at::stack(all).to(at::kDouble).abs().mean(0).narrow(0, r * chunk, chunk);
      const at::Tensor bound = ((n - 1) * u / (1 - (n - 1) * u)) * abs_mean + 2 * u * expected.abs();
      EXPECT_TRUE(((mine.to(at::kDouble) - expected).abs() <= bound).all().item<bool>())
          << chunk << " per rank, max message " << max_bytes;

      // bf16: summed in fp32, rounded once (the all-reduce's bf16 bound).
      at::Tensor mine_b = at::empty({chunk}, at::kBFloat16);
      world->reduce_scatter_avg(all[r].to(at::kBFloat16), mine_b);
      std::vector<at::Tensor> all_b;
      for (const at::Tensor& t : all) all_b.push_back(t.to(at::kBFloat16).to(at::kDouble));
      const at::Tensor expected_b = at::stack(all_b).mean(0).narrow(0, r * chunk, chunk);
      const at::Tensor bound_b =
          0x1p-8 * expected_b.abs() + 2 * ((n + 1) * u) * at::stack(all_b).abs().mean(0).narrow(0, r * chunk, chunk);
      EXPECT_TRUE(((mine_b.to(at::kDouble) - expected_b).abs() <= bound_b).all().item<bool>()) << chunk << " bf16";

      // All-gather is bytes: every rank's chunk, bit for bit (NaN payloads included).
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
        at::Tensor whole = at::empty({n * chunk}, at::TensorOptions().dtype(dtype));
        world->all_gather_into(rank_tensor(r, chunk, dtype, 5), whole);
        for (int q = 0; q < n; ++q)
          EXPECT_TRUE(same_bits(whole.narrow(0, q * chunk, chunk), rank_tensor(q, chunk, dtype, 5)))
              << "chunk of rank " << q << ", " << chunk << " elements, max message " << max_bytes;
      }
    }
    EXPECT_THROW(world->reduce_scatter_avg(at::zeros({n * 3}), at::zeros({4})), std::invalid_argument);
    EXPECT_THROW(world->all_gather_into(at::zeros({3}), at::zeros({n * 3 + 1})), std::invalid_argument);
  }
}

// Students stay identical only if every rank gets the same bits from the all-reduce.
TEST(CommCollectives, AllReduceResultIsBitIdenticalOnEveryRank) {
  auto world = make_mpi_communicator(mpi());
  for (int64_t numel : {int64_t{3}, int64_t{1'000'003}}) {
    at::Tensor x = at::randn({numel}, at::detail::createCPUGenerator(99 + world->rank()));
    world->all_reduce_avg(x);
    const auto sums = world->all_gather(test::bytes_checksum(x));
    for (int r = 1; r < world->size(); ++r) EXPECT_EQ(sums[r], sums[0]) << "rank " << r << ", " << numel;
  }
}

TEST(CommCollectives, IntegerSumsAndScalarGathersAreExact) {
  auto world = make_mpi_communicator(mpi());
  const int n = world->size(), r = world->rank();
  at::Tensor x = at::full({4}, int64_t{1} << 40, at::kLong) + r;
  world->all_reduce_sum(x);
  EXPECT_EQ(x[0].item<int64_t>(), n * (int64_t{1} << 40) + n * (n - 1) / 2);
  const auto ints = world->all_gather(int64_t{-1000} * r - 7);
  const auto uints = world->all_gather(~uint64_t{0} - static_cast<uint64_t>(r));
  ASSERT_EQ(static_cast<int>(ints.size()), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(ints[i], int64_t{-1000} * i - 7);
    EXPECT_EQ(uints[i], ~uint64_t{0} - static_cast<uint64_t>(i));
  }
}

ParallelConfig parallel(int T, int P, int S, RankOrder rank_order = RankOrder::kRoles) {
  ParallelConfig c;
  c.teacher_pipelines = T;
  c.teacher_stages = P;
  c.students = S;
  c.rank_order = rank_order;
  return c;
}

// Every group communicator holds exactly the layout's members, in the layout's order, and carries
// messages: all-reduce within it sums its members, and the last teacher stage reaches each student.
// Both rank orders (parallel.rank_order): in "pipelines" the students' ranks are not contiguous.
TEST(RankGroups, GroupCommunicatorsHoldTheLayoutsMembers) {
  const std::vector<std::tuple<int, int, int>> layouts = {
      {1, 1, 1}, {1, 1, 2}, {1, 2, 1}, {2, 1, 2}, {1, 2, 2}, {1, 1, 3},
      {2, 2, 4}, {1, 4, 4}, {2, 1, 6}, {1, 3, 5}};
  auto world = make_mpi_communicator(mpi());
  int tried = 0;
  for (const RankOrder order : {RankOrder::kRoles, RankOrder::kPipelines})
  for (auto [T, P, S] : layouts) {
    if (T * P + S != world->size()) continue;
    ++tried;
    SCOPED_TRACE(std::string(option_name(order)) + " T=" + std::to_string(T) + " P=" + std::to_string(P) + " S=" + std::to_string(S));
    const RankLayout layout = make_rank_layout(parallel(T, P, S, order), world->size(), 8);
    RankGroups groups = make_rank_groups(*world, layout);
    const std::pair<GroupKind, Communicator*> kinds[] = {
        {GroupKind::kTeacherPipeline, groups.teacher_pipeline.get()},
        {GroupKind::kLogitChannel, groups.logit_channel.get()},
        {GroupKind::kStudents, groups.students.get()}};
    for (auto [kind, comm] : kinds) {
      const GroupSlot slot = layout.slot(world->rank(), kind);
      ASSERT_EQ(comm != nullptr, slot.member()) << "kind " << static_cast<int>(kind);
      if (!comm) continue;
      const std::vector<int> expected = layout.group_ranks(kind, slot.color);
      EXPECT_EQ(comm->rank(), slot.key);
      const auto members = comm->all_gather(int64_t{world->rank()});
      EXPECT_EQ(std::vector<int>(members.begin(), members.end()), expected);
      at::Tensor x = at::full({1}, static_cast<double>(world->rank()), at::kDouble);
      comm->all_reduce_sum(x);
      double sum = 0;
      for (int m : expected) sum += m;
      EXPECT_EQ(x.item<double>(), sum);
    }
    // Logit channel: its rank 0 (the last teacher stage) sends each student its own index.
    if (Communicator* ch = groups.logit_channel.get()) {
      if (ch->rank() == 0) {
        for (int i = 1; i < ch->size(); ++i) {
          const int student = layout.ranks[layout.group_ranks(GroupKind::kLogitChannel,
                                                               layout.ranks[world->rank()].pipeline)[i]].student;
          ch->send(at::full({3}, student, at::kInt), i, 5);
        }
      } else {
        at::Tensor got = at::empty({3}, at::kInt);
        ch->recv(got, 0, 5);
        EXPECT_EQ(got[2].item<int>(), layout.ranks[world->rank()].student);
      }
    }
    world->barrier();
  }
  if (tried == 0) GTEST_SKIP() << "no layout for a world of " << world->size();
}

// The watchdog's path: a rank blocked in recv from a peer that never sends is released by abort()
// from another thread, with a CommError, and so are ranks blocked in a collective.
TEST(CommAbort, AbortUnblocksARankBlockedInRecv) {
  auto world = make_mpi_communicator(mpi());
  if (world->rank() == 1) {
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      world->abort();
    });
    at::Tensor never = at::empty({1000}, at::kFloat);
    try {
      world->recv(never, 0, 9);
      ADD_FAILURE() << "recv returned without a message";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
    }
    watchdog.join();
    EXPECT_TRUE(world->aborted());
    EXPECT_THROW(world->send(at::ones({1}), 0, 0), CommError);  // later calls fail too
  } else {
    world->abort();  // nobody frees a communicator with an unmatched receive pending
  }
  auto fresh = make_mpi_communicator(mpi());
  fresh->barrier();
}

TEST(CommAbort, AbortingTheWorldReleasesARankBlockedInAGroupCollective) {
  auto world = make_mpi_communicator(mpi());
  auto group = world->split(world->rank() == 0 ? -1 : 0, world->rank());
  EXPECT_EQ(group == nullptr, world->rank() == 0);
  if (group && group->size() > 1 && group->rank() == 0) {
    // This rank waits in a barrier its group peers never enter; aborting the parent releases it.
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      world->abort();
    });
    EXPECT_THROW(group->barrier(), CommError);
    watchdog.join();
    EXPECT_TRUE(group->aborted());
  } else {
    world->abort();
  }
  EXPECT_TRUE(!group || group->aborted());  // the abort reached the child on every rank
  auto fresh = make_mpi_communicator(mpi());
  fresh->barrier();
}

TEST(MpiSessionInfo, EveryRankKnowsItsNodeAndAllHostnames) {
  EXPECT_EQ(static_cast<int>(mpi().hostnames().size()), mpi().size());
  EXPECT_GE(mpi().local_rank(), 0);
  EXPECT_LT(mpi().local_rank(), mpi().local_size());
  EXPECT_FALSE(mpi().hostnames()[mpi().rank()].empty());
}

}  // namespace
}  // namespace deepen
