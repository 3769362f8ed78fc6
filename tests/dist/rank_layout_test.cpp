// Rank layout: roles, groups, layer split, rejections and placement checks, without MPI or a GPU.
#include <algorithm>
#include <functional>
#include <tuple>

#include <gtest/gtest.h>

#include "config/config.h"
#include "config/input_error.h"
#include "dist/rank_layout.h"
#include "dist/run_device.h"
#include "model/layer_split.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

ParallelConfig parallel(int64_t T, int64_t P, int64_t S, RankOrder rank_order = RankOrder::kRoles) {
  ParallelConfig c;
  c.teacher_pipelines = T;
  c.teacher_stages = P;
  c.students = S;
  c.rank_order = rank_order;
  return c;
}

using test::error_of;

TEST(RankLayout, TheStageCarryingTheHeadGetsFewerLayersUnlessTheStudentsHoldIt) {
  // Qwen3-8B (36 layers, head ≈ 3.23 layers) on 4 stages: full or top-k logits, the last stage
  // runs the head and gets 6 layers; the hidden-state channel (head_layers 0) splits 9 each.
  const double head = lm_head_layer_equivalents(151936, 4096, 32, 8, 128, 12288);
  const RankLayout with_head = make_rank_layout(parallel(1, 4, 4), 8, 36, head);
  const RankLayout hidden = make_rank_layout(parallel(1, 4, 4), 8, 36, 0);
  const int first_with_head[] = {0, 10, 20, 30}, first_hidden[] = {0, 9, 18, 27};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(with_head.ranks[r].first_layer, first_with_head[r]) << r;
    EXPECT_EQ(hidden.ranks[r].first_layer, first_hidden[r]) << r;
  }
  EXPECT_EQ(with_head.ranks[3].last_layer, 36);
  EXPECT_EQ(hidden.ranks[3].last_layer, 36);
}

TEST(RankLayout, TwoPipelinesOfTwoStagesAndFourStudents) {
  // The worked example of rank_layout.h.
  const RankLayout l = make_rank_layout(parallel(2, 2, 4), 8, 36);
  ASSERT_EQ(l.ranks.size(), 8u);
  const int pipeline[] = {0, 0, 1, 1, 0, 0, 1, 1};
  const int stage[] = {0, 1, 0, 1, -1, -1, -1, -1};
  const int student[] = {-1, -1, -1, -1, 0, 1, 2, 3};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(l.ranks[r].is_teacher(), r < 4) << r;
    EXPECT_EQ(l.ranks[r].pipeline, pipeline[r]) << r;
    EXPECT_EQ(l.ranks[r].stage, stage[r]) << r;
    EXPECT_EQ(l.ranks[r].student, student[r]) << r;
  }
  EXPECT_EQ(l.ranks[0].first_layer, 0);
  EXPECT_EQ(l.ranks[0].last_layer, 18);
  EXPECT_EQ(l.ranks[3].first_layer, 18);
  EXPECT_EQ(l.ranks[3].last_layer, 36);
  EXPECT_EQ(l.ranks[5].last_layer - l.ranks[5].first_layer, 0);
  EXPECT_EQ(l.group_ranks(GroupKind::kTeacherPipeline, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.group_ranks(GroupKind::kTeacherPipeline, 1), (std::vector<int>{2, 3}));
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{1, 4, 5}));
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 1), (std::vector<int>{3, 6, 7}));
  EXPECT_EQ(l.group_ranks(GroupKind::kStudents), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(l.teacher_rank(1, 0), 2);
  EXPECT_EQ(l.student_rank(2), 6);
}

TEST(RankLayout, OnePipelineOfThreeStagesAndTwoStudents) {
  const RankLayout l = make_rank_layout(parallel(1, 3, 2), 5, 10);
  EXPECT_EQ(l.group_ranks(GroupKind::kTeacherPipeline, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(l.group_ranks(GroupKind::kStudents), (std::vector<int>{3, 4}));
  EXPECT_EQ(l.ranks[1].first_layer, 4);  // 10 layers over 3 stages: [0,4) [4,7) [7,10)
  EXPECT_EQ(l.ranks[1].last_layer, 7);
}

// The header's pipelines-order example: each pipeline's stages, then the students it feeds.
TEST(RankLayout, PipelinesOrderPutsEachPipelineBesideItsStudents) {
  const RankLayout l = make_rank_layout(parallel(2, 2, 4, RankOrder::kPipelines), 8, 36);
  EXPECT_EQ(l.order, RankOrder::kPipelines);
  const int pipeline[] = {0, 0, 0, 0, 1, 1, 1, 1};
  const int stage[] = {0, 1, -1, -1, 0, 1, -1, -1};
  const int student[] = {-1, -1, 0, 1, -1, -1, 2, 3};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(l.ranks[r].is_teacher(), stage[r] >= 0) << r;
    EXPECT_EQ(l.ranks[r].pipeline, pipeline[r]) << r;
    EXPECT_EQ(l.ranks[r].stage, stage[r]) << r;
    EXPECT_EQ(l.ranks[r].student, student[r]) << r;
  }
  // The layer split follows the stage, not the rank: rank 5 is pipeline 1's last stage.
  EXPECT_EQ(l.ranks[5].first_layer, 18);
  EXPECT_EQ(l.ranks[5].last_layer, 36);
  EXPECT_EQ(l.group_ranks(GroupKind::kTeacherPipeline, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.group_ranks(GroupKind::kTeacherPipeline, 1), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 1), (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(l.group_ranks(GroupKind::kStudents), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(l.teacher_rank(1, 0), 4);
  EXPECT_EQ(l.student_rank(2), 6);
}

// The header's 2-node example: with 8 tasks per node, each node holds one logit channel whole.
TEST(RankLayout, PipelinesOrderOnTwoNodesOfEightKeepsEachChannelOnItsNode) {
  const RankLayout l = make_rank_layout(parallel(2, 4, 8, RankOrder::kPipelines), 16, 36);
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{3, 4, 5, 6, 7}));
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 1), (std::vector<int>{11, 12, 13, 14, 15}));
  EXPECT_EQ(l.group_ranks(GroupKind::kStudents), (std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15}));
  for (int t = 0; t < 2; ++t)
    for (int r : l.group_ranks(GroupKind::kLogitChannel, t)) EXPECT_EQ(r / 8, t) << "channel " << t << " rank " << r;
  // The paper config's T=8, P=1, S=8: teacher and student alternate.
  const RankLayout paper = make_rank_layout(parallel(8, 1, 8, RankOrder::kPipelines), 16, 36);
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(paper.teacher_rank(t, 0), 2 * t);
    EXPECT_EQ(paper.student_rank(t), 2 * t + 1);
  }
}

// One pipeline: nothing to interleave, the two orders are the same layout.
TEST(RankLayout, OnePipelineGivesTheSameRanksInBothOrders) {
  const RankLayout roles = make_rank_layout(parallel(1, 3, 4), 7, 12);
  const RankLayout pipes = make_rank_layout(parallel(1, 3, 4, RankOrder::kPipelines), 7, 12);
  for (int r = 0; r < 7; ++r) {
    EXPECT_EQ(roles.ranks[r].stage, pipes.ranks[r].stage) << r;
    EXPECT_EQ(roles.ranks[r].student, pipes.ranks[r].student) << r;
  }
}

TEST(RankLayout, AnUnknownRankOrderNamesTheKey) {
  const std::string e = error_of([] { parse_config("[parallel]\nrank_order = \"mixed\"\n", "x.toml"); });
  EXPECT_NE(e.find("parallel.rank_order"), std::string::npos) << e;
  EXPECT_NE(e.find("\"mixed\""), std::string::npos) << e;
}

// Every world rank has exactly one role, and teacher_rank/student_rank are that map's inverse.
TEST(RankLayout, TeacherAndStudentRanksCoverTheWorldOnceInBothOrders) {
  for (const RankOrder order : {RankOrder::kRoles, RankOrder::kPipelines}) {
    for (auto [T, P, S] : {std::tuple{1, 1, 1}, {2, 1, 4}, {2, 3, 2}, {3, 2, 6}, {4, 1, 8}}) {
      const RankLayout l = make_rank_layout(parallel(T, P, S, order), T * P + S, 12);
      std::vector<int> seen(l.world_size, 0);
      for (int t = 0; t < T; ++t)
        for (int p = 0; p < P; ++p) {
          const int r = l.teacher_rank(t, p);
          ++seen.at(r);
          EXPECT_EQ(l.ranks[r].pipeline, t);
          EXPECT_EQ(l.ranks[r].stage, p);
        }
      for (int s = 0; s < S; ++s) {
        const int r = l.student_rank(s);
        ++seen.at(r);
        EXPECT_EQ(l.ranks[r].student, s);
        EXPECT_EQ(l.ranks[r].pipeline, s / (S / T));
      }
      EXPECT_EQ(seen, std::vector<int>(l.world_size, 1)) << order << " " << T << "x" << P << "+" << S;
    }
  }
}

// The slots handed to Communicator::split must reproduce group_ranks exactly: for every kind and
// every rank, membership, color = group index and key = position in the group, in both orders.
TEST(RankLayout, SplitSlotsReproduceTheGroups) {
  for (auto [T, P, S] : {std::tuple{1, 1, 1}, {2, 1, 2}, {1, 2, 2}, {2, 2, 4}, {3, 2, 6}, {2, 3, 2}})
  for (const RankOrder order : {RankOrder::kRoles, RankOrder::kPipelines}) {
    const RankLayout l = make_rank_layout(parallel(T, P, S, order), T * P + S, 12);
    for (GroupKind kind : {GroupKind::kTeacherPipeline, GroupKind::kLogitChannel, GroupKind::kStudents}) {
      std::vector<std::vector<int>> from_slots(l.group_count(kind));
      for (int r = 0; r < l.world_size; ++r) {
        const GroupSlot s = l.slot(r, kind);
        if (!s.member()) continue;
        ASSERT_LT(s.color, l.group_count(kind));
        auto& g = from_slots[s.color];
        if (static_cast<int>(g.size()) <= s.key) g.resize(s.key + 1, -1);
        EXPECT_EQ(g[s.key], -1) << "two ranks with one key";
        g[s.key] = r;
      }
      for (int i = 0; i < l.group_count(kind); ++i)
        EXPECT_EQ(from_slots[i], l.group_ranks(kind, i)) << order << " " << T << "x" << P << "+" << S;
    }
  }
}

TEST(RankLayout, EachStudentIsFedByExactlyOneLogitChannel) {
  const RankLayout l = make_rank_layout(parallel(3, 1, 6), 9, 4);
  for (int s = 0; s < 6; ++s) {
    int channels = 0;
    for (int t = 0; t < 3; ++t) {
      const auto g = l.group_ranks(GroupKind::kLogitChannel, t);
      channels += std::count(g.begin(), g.end(), l.student_rank(s));
    }
    EXPECT_EQ(channels, 1);
    EXPECT_EQ(l.ranks[l.student_rank(s)].pipeline, s / 2);
  }
}

TEST(RankLayout, RejectsAWorldSizeThatDoesNotMatch) {
  const std::string e = error_of([] { make_rank_layout(parallel(2, 2, 4), 6, 36); });
  EXPECT_NE(e.find("world size 6"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.teacher_pipelines"), std::string::npos) << e;
  EXPECT_NE(e.find("= 8"), std::string::npos) << e;
}

TEST(RankLayout, RejectsStudentsNotDivisibleByPipelines) {
  const std::string e = error_of([] { make_rank_layout(parallel(2, 1, 3), 5, 36); });
  EXPECT_NE(e.find("parallel.students = 3"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.teacher_pipelines = 2"), std::string::npos) << e;
}

TEST(RankLayout, RejectsMoreStagesThanTeacherLayers) {
  const std::string e = error_of([] { make_rank_layout(parallel(1, 5, 1), 6, 4); });
  EXPECT_NE(e.find("parallel.teacher_stages"), std::string::npos) << e;
  EXPECT_NE(e.find("4 layers"), std::string::npos) << e;
}

TEST(RankLayout, RejectsCountsBelowOne) {
  EXPECT_NE(error_of([] { make_rank_layout(parallel(0, 1, 1), 1, 4); }).find("parallel.teacher_pipelines"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_rank_layout(parallel(1, 1, 0), 1, 4); }).find("parallel.students"),
            std::string::npos);
}

TEST(RankLayout, DescribeNamesEveryRankAndGroup) {
  const std::string d = make_rank_layout(parallel(2, 2, 4), 8, 36).describe();
  EXPECT_NE(d.find("rank 3: teacher pipeline 1 stage 1, layers [18, 36)"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 6: student 2, fed by pipeline 1"), std::string::npos) << d;
  EXPECT_NE(d.find("logit channel 1 = {3,6,7}"), std::string::npos) << d;
  EXPECT_NE(d.find("students = {4,5,6,7}"), std::string::npos) << d;
}

TEST(Placement, OneNodeMayHoldEverything) {
  const RankLayout l = make_rank_layout(parallel(1, 2, 2), 4, 8);
  EXPECT_TRUE(check_placement(l, {"a", "a", "a", "a"}).empty());
}

TEST(Placement, TeachersAndStudentsOnSeparateNodesPass) {
  const RankLayout l = make_rank_layout(parallel(2, 2, 4), 8, 8);
  EXPECT_TRUE(check_placement(l, {"t1", "t1", "t1", "t1", "s1", "s1", "s2", "s2"}).empty());
}

TEST(Placement, ANodeWithTeachersAndStudentsIsRejectedOnSeveralNodes) {
  // 3 tasks per node do not divide the 4 teacher ranks: node b gets teacher 3 and students 4,5.
  const RankLayout l = make_rank_layout(parallel(2, 2, 2), 6, 8);
  const std::string e = error_of([&] { check_placement(l, {"a", "a", "a", "b", "b", "b"}); });
  EXPECT_NE(e.find("node b hosts teacher ranks {3} and student ranks {4,5}"), std::string::npos) << e;
}

TEST(Placement, TheRolesErrorPointsToThePipelinesOrder) {
  const RankLayout l = make_rank_layout(parallel(2, 2, 2), 6, 8);
  const std::string e = error_of([&] { check_placement(l, {"a", "a", "a", "b", "b", "b"}); });
  EXPECT_NE(e.find("parallel.rank_order = \"pipelines\""), std::string::npos) << e;
  EXPECT_NE(e.find("= 3"), std::string::npos) << e;  // P + S/T = 2 + 1: the tasks per node that fit
}

// The intended pipelines layout: each node holds whole pipelines with their students (here the
// same 3 tasks per node that the roles order rejects above).
TEST(Placement, PipelinesOrderWithEachChannelOnOneNodePasses) {
  const RankLayout l = make_rank_layout(parallel(2, 2, 2, RankOrder::kPipelines), 6, 8);
  EXPECT_TRUE(check_placement(l, {"a", "a", "a", "b", "b", "b"}).empty());
  const RankLayout two = make_rank_layout(parallel(2, 4, 8, RankOrder::kPipelines), 16, 36);
  std::vector<std::string> hosts(16, "n0");
  for (int r = 8; r < 16; ++r) hosts[r] = "n1";
  EXPECT_TRUE(check_placement(two, hosts).empty());
  // Two pipelines per node is as good: 1 stage + 2 students each, 6 tasks per node.
  const RankLayout pairs = make_rank_layout(parallel(4, 1, 8, RankOrder::kPipelines), 12, 8);
  EXPECT_TRUE(check_placement(pairs, {"a", "a", "a", "a", "a", "a", "b", "b", "b", "b", "b", "b"}).empty());
}

// The header's example: students away from their last stage are named, per channel.
TEST(Placement, PipelinesOrderWarnsAboutStudentsAwayFromTheirLastStage) {
  const RankLayout l = make_rank_layout(parallel(2, 1, 4, RankOrder::kPipelines), 6, 8);
  const auto w = check_placement(l, {"a", "a", "b", "b", "c", "c"});
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("logit channel 0: student ranks {2} are on b, not on a with pipeline 0's last stage (rank 0)"),
            std::string::npos)
      << w[0];
  EXPECT_NE(w[1].find("logit channel 1: student ranks {4,5} are on c, not on b with pipeline 1's last stage (rank 3)"),
            std::string::npos)
      << w[1];
  EXPECT_NE(w[1].find("a multiple of parallel.teacher_stages + students per pipeline = 3"), std::string::npos) << w[1];
}

// A pipeline spanning nodes still warns in the pipelines order; its channel, on the last stage's
// node with the students, does not.
TEST(Placement, PipelinesOrderStillWarnsAboutAPipelineSpanningNodes) {
  const RankLayout l = make_rank_layout(parallel(1, 4, 2, RankOrder::kPipelines), 6, 8);
  const auto w = check_placement(l, {"a", "a", "b", "b", "b", "b"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("teacher pipeline 0 spans nodes a, b"), std::string::npos) << w[0];
}

TEST(Placement, APipelineSpanningNodesIsAWarning) {
  const RankLayout l = make_rank_layout(parallel(1, 4, 4), 8, 8);
  const auto w = check_placement(l, {"a", "a", "b", "b", "c", "c", "c", "c"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("teacher pipeline 0 spans nodes a, b"), std::string::npos) << w[0];
}

TEST(Placement, DeviceIsTheLocalRankModuloTheVisibleDevices) {
  // Every task sees all 8 GPUs of its node: local rank i -> device i.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(choose_cuda_device(r, 8), r);
  // Each task sees only its own GPU (--gpus-per-task=1): device 0 everywhere.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(choose_cuda_device(r, 1), 0);
  // Each task sees the 4 GPUs of its socket: local ranks 4..7 take devices 0..3 of theirs.
  EXPECT_EQ(choose_cuda_device(3, 4), 3);
  EXPECT_EQ(choose_cuda_device(5, 4), 1);
  EXPECT_EQ(choose_cuda_device(7, 4), 3);
  EXPECT_NE(error_of([] { choose_cuda_device(0, 0); }).find("no CUDA device"), std::string::npos);
}

TEST(Placement, EightRanksThatAllSeeTheSameFourGpusCollideAndAreNamed) {
  // The physical id (host/PCI bus) of each rank's device decides: local ranks 0 and 4 both take
  // device 0 = the same GPU, which the collision check names.
  std::vector<std::string> ids;
  for (int r = 0; r < 8; ++r) ids.push_back("n1/0000:0" + std::to_string(choose_cuda_device(r, 4)) + ":00.0");
  const std::string e = error_of([&] { check_distinct_devices(ids); });
  EXPECT_NE(e.find("ranks 0 and 4"), std::string::npos) << e;
  EXPECT_NE(e.find("local_rank mod"), std::string::npos) << e;
}

TEST(Placement, TwoRanksOnOneGpuAreNamed) {
  EXPECT_NO_THROW(check_distinct_devices({"a/0000:01:00.0", "a/0000:02:00.0", "b/0000:01:00.0"}));
  const std::string e =
      error_of([] { check_distinct_devices({"a/0000:01:00.0", "b/0000:01:00.0", "a/0000:01:00.0"}); });
  EXPECT_NE(e.find("ranks 0 and 2"), std::string::npos) << e;
}

// parallel.backend as a job resolves it (launch/job_plan.cpp): the device first, then the backend.
TEST(Placement, AutoBackendPicksNcclOnlyWithDevicesAndNccl) {
  auto backend = [](Backend b, bool nccl_built, int devices) {
    return world_backend(b, resolve_run_device(RunDevice::kAuto, devices, "x.toml"), nccl_built, "x.toml");
  };
  EXPECT_EQ(backend(Backend::kAuto, true, 8), Backend::kNccl);
  EXPECT_EQ(backend(Backend::kAuto, true, 0), Backend::kMpi);
  EXPECT_EQ(backend(Backend::kAuto, false, 8), Backend::kMpi);
  EXPECT_EQ(backend(Backend::kMpi, true, 8), Backend::kMpi);
  EXPECT_EQ(backend(Backend::kNccl, true, 1), Backend::kNccl);
  EXPECT_NE(error_of([&] { backend(Backend::kNccl, false, 8); }).find("parallel.backend"), std::string::npos);
  EXPECT_NE(error_of([&] { backend(Backend::kNccl, true, 0); }).find("run.device"), std::string::npos);
  EXPECT_NE(error_of([] { parse_config("[parallel]\nbackend = \"gloo\"\n", "x.toml"); }).find("parallel.backend"),
            std::string::npos);
}

}  // namespace
}  // namespace deepen

namespace deepen {
namespace {

// The shared-teacher examples of rank_layout.h: R runs' students follow the teachers, run-major.
TEST(SharedTeacherLayout, FourRunsOfOneStudentBehindATwoStagePipeline) {
  const RankLayout l = make_rank_layout(parallel(1, 2, 1), 6, 4, 0, /*runs=*/4);
  ASSERT_EQ(l.world_size, 6);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(l.student_rank(0, r), 2 + r);
    EXPECT_EQ(l.ranks[2 + r].run, r);
    EXPECT_EQ(l.ranks[2 + r].student, 0);
    EXPECT_EQ(l.group_ranks(GroupKind::kStudents, r), (std::vector<int>{2 + r}));
    EXPECT_EQ(l.channel_rank(0, r), 1 + r);
  }
  EXPECT_EQ(l.ranks[0].run, -1);
  EXPECT_EQ(l.group_count(GroupKind::kStudents), 4);
  EXPECT_EQ(l.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{1, 2, 3, 4, 5}));
}

TEST(SharedTeacherLayout, TwoRunsOfTwoStudentsInBothOrders) {
  const RankLayout roles = make_rank_layout(parallel(2, 1, 2), 6, 4, 0, 2);
  EXPECT_EQ(roles.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(roles.group_ranks(GroupKind::kLogitChannel, 1), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(roles.group_ranks(GroupKind::kStudents, 0), (std::vector<int>{2, 3}));
  EXPECT_EQ(roles.group_ranks(GroupKind::kStudents, 1), (std::vector<int>{4, 5}));
  const RankLayout pipes = make_rank_layout(parallel(2, 1, 2, RankOrder::kPipelines), 6, 4, 0, 2);
  EXPECT_EQ(pipes.group_ranks(GroupKind::kLogitChannel, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(pipes.group_ranks(GroupKind::kLogitChannel, 1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(pipes.group_ranks(GroupKind::kStudents, 0), (std::vector<int>{1, 4}));
  EXPECT_EQ(pipes.group_ranks(GroupKind::kStudents, 1), (std::vector<int>{2, 5}));
  // Every rank's slots reproduce the groups, and the channel rank of run r's student s is its key.
  for (const RankLayout* l : {&roles, &pipes})
    for (int r = 0; r < 2; ++r)
      for (int s = 0; s < 2; ++s) {
        const int rank = l->student_rank(s, r);
        EXPECT_EQ(l->slot(rank, GroupKind::kLogitChannel).key, l->channel_rank(s, r));
        EXPECT_EQ(l->slot(rank, GroupKind::kStudents), (GroupSlot{r, s}));
      }
}

TEST(SharedTeacherLayout, TheWorldMustBeTeachersPlusEveryRunsStudents) {
  const std::string e = test::error_of([] { make_rank_layout(parallel(1, 2, 1), 5, 4, 0, 4); });
  EXPECT_NE(e.find("parallel."), std::string::npos) << e;
  EXPECT_NE(e.find("6"), std::string::npos) << e;
}

}  // namespace
}  // namespace deepen
