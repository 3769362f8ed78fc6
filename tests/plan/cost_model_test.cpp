// Cost model: parameter and FLOP counts against hand arithmetic and transformers' Qwen3-8B size,
// logit bytes, one layout's rates worked by hand, the ranking, and the printed paper plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "config/input_error.h"
#include "dist/rank_layout.h"
#include "model/hf_config.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

// A tiny pair whose numbers are easy to check by hand:
//   block matmul = 8·4·(2 + 2·1) + 2·4·8 (attention) + 3·8·16 (MLP) = 128 + 64 + 384 = 576
//   block params = 576 + 2·8 + 2·4 = 600; teacher total (tied) = 4·600 + 32·8 + 8 = 2664
//   attention per layer at seq 8 = 4·(2·4)·(8+1)/2 = 144; forward per layer = 2·576 + 144 = 1296
//   head = 2·8·32 = 512; teacher forward = 4·1296 + 512 = 5696
//   student train at depth 2 = 3·(2·1296 + 512) = 9312, at depth 1 = 3·(1296 + 512) = 5424
ModelShape tiny(int64_t layers) { return {"tiny", layers, 8, 2, 1, 4, 16, 32, true}; }

PlanInput tiny_input() {
  PlanInput in;
  in.teacher = tiny(4);
  in.student = tiny(2);
  in.seq_len = 8;
  in.micro_batch = 2;
  in.grad_accum = 1;
  in.distill.logits = TeacherOutput::kFull;
  in.distill.channel_dtype = FloatDtype::kFp32;
  in.stage_depths = {2};
  in.stage_tokens = {1};
  return in;
}

ClusterSpec tiny_cluster() {
  ClusterSpec c;
  c.nodes = 1;
  c.gpus_per_node = 4;
  c.flops = 1e6;
  c.mfu = c.teacher_mfu = 1;
  c.intra_bw = c.inter_bw = 1e9;
  c.memory = 1e12;
  return c;
}

TEST(CostModel, TinyModelCountsByHand) {
  EXPECT_EQ(block_matmul_params(tiny(4)), 576);
  EXPECT_EQ(block_params(tiny(4)), 600);
  EXPECT_EQ(total_params(tiny(4)), 2664);
  EXPECT_DOUBLE_EQ(forward_flops_per_token(tiny(4), 4, 8, true), 5696);
  EXPECT_DOUBLE_EQ(forward_flops_per_token(tiny(4), 4, 8, false), 5184);
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny(2), 2, 8), 9312);
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny(2), 1, 8), 5424);
}

// Qwen3-8B has 8,190,735,360 parameters (transformers' num_parameters() on its config); the header's
// worked example gives the FLOPs.
TEST(CostModel, Qwen3_8BParametersAndFlops) {
  const auto q = known_qwen3_shape("/models/Qwen3-8B");
  ASSERT_TRUE(q);
  EXPECT_EQ(block_params(*q), 192'946'432);
  EXPECT_EQ(total_params(*q), 8'190'735'360);
  EXPECT_DOUBLE_EQ(forward_flops_per_token(*q, 36, 4096, true), 13'891'534'848.0 + 1'208'254'464.0 + 1'244'659'712.0);
  // Qwen3-0.6B ties its embeddings: 596,049,920 parameters (0.6B).
  EXPECT_EQ(total_params(*known_qwen3_shape("Qwen3-0.6B")), 596'049'920);
  EXPECT_FALSE(known_qwen3_shape("llama-7b"));
}

TEST(CostModel, LogitBytesFullAndTopK) {
  DistillConfig d;
  d.logits = TeacherOutput::kFull;
  d.channel_dtype = FloatDtype::kFp32;
  EXPECT_DOUBLE_EQ(logit_bytes_per_token(d, 151936, 16384, 0), 607'744);
  d.channel_dtype = FloatDtype::kBf16;
  EXPECT_DOUBLE_EQ(logit_bytes_per_token(d, 151936, 16384, 0), 303'872);
  d.logits = TeacherOutput::kTopk;
  d.topk = 64;
  d.tail = TopkTail::kRenormalize;
  EXPECT_DOUBLE_EQ(logit_bytes_per_token(d, 151936, 16384, 0), 384);
  d.tail = TopkTail::kBucket;
  EXPECT_DOUBLE_EQ(logit_bytes_per_token(d, 151936, 16384, 0), 386);
  EXPECT_DOUBLE_EQ(logit_bytes_per_token(d, 151936, 64, 64), 387);  // a 64-byte header over 64 tokens
  d.logits = TeacherOutput::kHidden;  // the teacher's final hidden states: 4096 bf16 values, 37x fewer than full bf16
  EXPECT_DOUBLE_EQ(logit_bytes_per_token(d, 151936, 16384, 0, 4096), 8'192);
}

// The hidden channel moves the teacher's head to the students: the last stage drops 2·8·32 = 512
// FLOP (stage 1: 3104 -> 2592 FLOP, so 2.592 ms per token), the student adds those 2·8·32 = 512
// FLOP per token (the head, once, in the loss's forward): 16 × (9312 + 512).
TEST(CostModel, HiddenChannelMovesTheTeachersHeadToTheStudents) {
  PlanInput in = tiny_input();
  in.distill.logits = TeacherOutput::kHidden;
  const LayoutEstimate e = estimate_layout(in, tiny_cluster(), 1, 2, 1);
  EXPECT_NEAR(e.teacher_stage_s_per_token, 2.592e-3, 1e-9);
  EXPECT_DOUBLE_EQ(e.channel_bytes_per_token, 8 * 4 + 64.0 / 16);
  EXPECT_NEAR(e.student_tokens_per_s[0], 16 / (16 * (9312 + 512) / 1e6), 1e-6);
}

// T=1, P=2, S=1 on 1 MFLOP/s devices. Stages hold 2 + 2 layers; the last also the head:
//   stage 0: 2·1296 = 2592 FLOP -> 2.592 ms/token; stage 1: 2592 + 512 = 3104 -> 3.104 ms/token
//   streaming, the pipeline delivers one token per 3.104 ms: 322.16 tok/s
//   student: 16 tokens per step × 9312 FLOP = 0.148992 s -> 107.39 tok/s: the students are the bound.
TEST(CostModel, OneLayoutWorkedByHand) {
  const LayoutEstimate e = estimate_layout(tiny_input(), tiny_cluster(), 1, 2, 1);
  EXPECT_NEAR(e.teacher_stage_s_per_token, 3.104e-3, 1e-9);  // activations: 32 B at 1 GB/s, hidden by compute
  EXPECT_DOUBLE_EQ(e.pipeline_efficiency, 1.0);
  EXPECT_NEAR(e.teacher_tokens_per_s, 1 / 3.104e-3, 1e-6);
  EXPECT_DOUBLE_EQ(e.channel_bytes_per_token, 32 * 4 + 64.0 / 16);
  ASSERT_EQ(e.student_tokens_per_s.size(), 1u);
  EXPECT_NEAR(e.student_tokens_per_s[0], 16 / 0.148992, 1e-6);
  EXPECT_NEAR(e.mean_tokens_per_s, 16 / 0.148992, 1e-6);
  EXPECT_EQ(e.bottleneck, "students");
  EXPECT_NEAR(e.supply_over_demand, (1 / 3.104e-3) / (16 / 0.148992), 1e-9);
  // Three students: 3 × 16 tokens per step, minus a ring all-reduce of 4·1464 B of gradients
  // (2·2/3 × 5856 B at 1 GB/s = 7.808 µs): 322.15 tok/s against the teacher's 322.16: balanced.
  const LayoutEstimate three = estimate_layout(tiny_input(), tiny_cluster(), 1, 2, 3);
  EXPECT_NEAR(three.student_tokens_per_s[0], 48 / (0.148992 + 7.808e-6), 1e-6);
  EXPECT_NEAR(three.supply_over_demand, 1.0, 1e-3);
  // A run of 160 tokens per pipeline is 10 micro-batches of 16: the fill costs 1 of 11 slots.
  PlanInput short_run = tiny_input();
  short_run.total_tokens = 160;
  EXPECT_NEAR(estimate_layout(short_run, tiny_cluster(), 1, 2, 1).pipeline_efficiency, 10.0 / 11, 1e-12);
}

// A fixed global batch splits one step's tokens among the students: with 48 sequences of 8 tokens,
// three students take 128 tokens each per step and pay the same 7.808 µs all-reduce as above.
TEST(CostModel, FixedGlobalBatchSplitsTheStepAmongStudents) {
  PlanInput in = tiny_input();
  in.global_batch = 48;
  const LayoutEstimate three = estimate_layout(in, tiny_cluster(), 1, 2, 3);
  const double step = 128 * 9312 / 1e6 + 7.808e-6;
  EXPECT_NEAR(three.student_tokens_per_s[0], 3 * 128 / step, 1e-6);
  in.global_batch = 2;  // one student, one micro-batch of 2 sequences x 8 tokens: OneLayoutWorkedByHand's step
  EXPECT_NEAR(estimate_layout(in, tiny_cluster(), 1, 2, 1).student_tokens_per_s[0], 16 / 0.148992, 1e-6);
}

// Full sharding's students talk every micro-batch: with the global batch of 48 on three students
// (8 micro-batches of 2 x 8 tokens each), each micro-batch reduce-scatters the 5,856 B of
// gradients and gathers the two blocks (4,800 B) twice, and after the update the ends (1,056 B)
// are gathered: 2/3 x (8·5,856 + 16·4,800 + 1,056) B at 1 GB/s = 83.136 µs per step, against
// 7.808 µs for grad_op's (and the replicated) reduce-scatter + all-gather once per step.
TEST(CostModel, FullShardingPaysTheBlockGathersOfEveryMicroBatch) {
  PlanInput in = tiny_input();
  in.global_batch = 48;
  in.recompute = Recompute::kLayer;
  in.sharding = Sharding::kGradOp;
  const double compute = 128 * 9312 / 1e6;
  EXPECT_NEAR(estimate_layout(in, tiny_cluster(), 1, 2, 3).student_tokens_per_s[0], 3 * 128 / (compute + 7.808e-6), 1e-6);
  in.sharding = Sharding::kFull;
  EXPECT_NEAR(estimate_layout(in, tiny_cluster(), 1, 2, 3).student_tokens_per_s[0], 3 * 128 / (compute + 83.136e-6), 1e-6);
  // One student: nothing to send.
  in.global_batch = 2;
  EXPECT_NEAR(estimate_layout(in, tiny_cluster(), 1, 2, 1).student_tokens_per_s[0], 16 / 0.148992, 1e-6);
}

// The stage's in-flight buffers hold what it sends: with the hidden channel, 8 fp32 hidden values
// + the header share per token (8·4 + 64/16 = 36 B), and the last stage keeps no head.
TEST(CostModel, HiddenChannelTeacherMemoryHoldsHiddenStatesInFlight) {
  PlanInput in = tiny_input();
  in.distill.logits = TeacherOutput::kHidden;
  const LayoutEstimate e = estimate_layout(in, tiny_cluster(), 1, 1, 1);
  const TeacherStageMemory want = teacher_stage_memory(in.teacher, 4, true, false, float_dtype_bytes(in.teacher_dtype),
                                                       16, 8 * 4 + 64.0 / 16, in.max_in_flight);
  EXPECT_DOUBLE_EQ(e.teacher_stage_bytes, want.total());
}

// The plan costs the split a distributed run makes (model/layer_split.h): Qwen3-8B on 4 stages is
// 10/10/10/6 with the head counted (3.23 layers), so a 10-layer stage is the slowest; with the
// hidden channel the last stage has no head and the split is 9/9/9/9.
TEST(CostModel, TeacherStagesAreSplitAsTheRunSplitsThem) {
  PlanInput in = tiny_input();
  in.teacher = *known_qwen3_shape("qwen3-8b");
  in.seq_len = 4096;
  const ClusterSpec c = cluster_preset("h200");
  const double rate = c.flops * c.teacher_mfu;
  EXPECT_NEAR(estimate_layout(in, c, 1, 4, 4).teacher_stage_s_per_token,
              forward_flops_per_token(in.teacher, 10, in.seq_len, false) / rate, 1e-15);
  in.distill.logits = TeacherOutput::kHidden;
  EXPECT_NEAR(estimate_layout(in, c, 1, 4, 4).teacher_stage_s_per_token,
              forward_flops_per_token(in.teacher, 9, in.seq_len, false) / rate, 1e-15);
}

TEST(CostModel, CurriculumMeanIsTokenWeightedHarmonic) {
  PlanInput in = tiny_input();
  in.stage_depths = {1, 2};
  in.stage_tokens = {3, 1};
  const LayoutEstimate e = estimate_layout(in, tiny_cluster(), 1, 1, 1);
  ASSERT_EQ(e.job_tokens_per_s.size(), 2u);
  const double want = 4 / (3 / e.job_tokens_per_s[0] + 1 / e.job_tokens_per_s[1]);
  EXPECT_NEAR(e.mean_tokens_per_s, want, 1e-9);
  // depth 1 is cheaper for the student, so the teacher (5.696 ms/token, one stage) binds there.
  EXPECT_NEAR(e.job_tokens_per_s[0], std::min(1 / 5.696e-3, 16 / (16 * 5424 / 1e6)), 1e-6);
}

TEST(CostModel, SharedCoresBoundTheJob) {
  ClusterSpec c = tiny_cluster();
  c.shared_cores = 1;  // four ranks on one core: every token costs 5696 + 9312 core-FLOP
  const LayoutEstimate e = estimate_layout(tiny_input(), c, 1, 2, 1);
  EXPECT_NEAR(e.mean_tokens_per_s, 1e6 / (5696 + 9312), 1e-6);
  EXPECT_EQ(e.bottleneck, "cores");
}

TEST(CostModel, RankingRespectsTheRulesAndIsBestFirst) {
  const auto ranked = rank_layouts(tiny_input(), tiny_cluster());
  ASSERT_FALSE(ranked.empty());
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& e = ranked[i];
    EXPECT_EQ(e.S % e.T, 0);
    EXPECT_LE(e.T * e.P + e.S, 4);
    EXPECT_LE(e.P, 4);
    if (i) EXPECT_LE(e.mean_tokens_per_s, ranked[0].mean_tokens_per_s * 1.005);
  }
  // Four devices: a whole-teacher rank supplies 175.6 tok/s, a student consumes 107.4 at depth 2.
  // 1x1+2 and 1x1+3 run at the teacher's 175.6; 1x2+2 (322 vs 214.8) and 2x1+2 (351 vs 214.8) at
  // the students' 214.8, a tie that the shorter pipeline wins.
  EXPECT_EQ(ranked[0].T, 2);
  EXPECT_EQ(ranked[0].P, 1);
  EXPECT_EQ(ranked[0].S, 2);
}

// On several nodes a layout either keeps teachers and students on separate nodes (roles order:
// dist/rank_layout.h's placement rule) or puts each pipeline on the node of its students (pipelines
// order: every logit channel inside one node). Both kinds are listed.
TEST(CostModel, MultiNodeLayoutsSeparateTheRolesOrKeepEachChannelOnItsNode) {
  ClusterSpec c = cluster_preset("h200");
  c.nodes = 2;
  PlanInput in = tiny_input();
  in.teacher = *known_qwen3_shape("qwen3-8b");
  in.student = {"student", 9, 1024, 16, 8, 64, 3072, 151936, true};
  in.seq_len = 4096;
  int roles = 0, pipelines = 0, pipelines_mixing_nodes = 0;
  for (const auto& e : rank_layouts(in, c)) {
    if (e.order == RankOrder::kRoles) {
      ++roles;
      EXPECT_EQ((e.T * e.P) % 8, 0) << e.T << "x" << e.P;
      continue;
    }
    ++pipelines;
    ParallelConfig p;
    p.teacher_pipelines = e.T;
    p.teacher_stages = e.P;
    p.students = e.S;
    p.rank_order = RankOrder::kPipelines;
    const RankLayout l = make_rank_layout(p, static_cast<int>(e.devices), 36);
    for (int t = 0; t < e.T; ++t)
      for (int r : l.group_ranks(GroupKind::kLogitChannel, t))
        EXPECT_EQ(r / 8, l.teacher_rank(t, static_cast<int>(e.P) - 1) / 8) << e.T << "x" << e.P << "+" << e.S;
    if ((e.T * e.P) % 8 != 0 && e.devices > 8) ++pipelines_mixing_nodes;
  }
  EXPECT_GT(roles, 0);
  EXPECT_GT(pipelines, 0);
  // Layouts the separate-nodes rule alone never offered: teachers and students sharing both nodes.
  EXPECT_GT(pipelines_mixing_nodes, 0);
}

// The header's examples of which layouts `deepen plan` offers in which order.
TEST(CostModel, LayoutOfferedFollowsThePlacementOfEachOrder) {
  ClusterSpec two = cluster_preset("h200");
  two.nodes = 2;
  EXPECT_TRUE(layout_offered(two, 2, 4, 8, RankOrder::kRoles));
  EXPECT_TRUE(layout_offered(two, 2, 4, 8, RankOrder::kPipelines));
  EXPECT_FALSE(layout_offered(two, 4, 3, 4, RankOrder::kRoles));
  EXPECT_TRUE(layout_offered(two, 4, 3, 4, RankOrder::kPipelines));
  EXPECT_FALSE(layout_offered(two, 5, 2, 5, RankOrder::kPipelines));  // pipeline 2: rank 7 | rank 8
  EXPECT_TRUE(layout_offered(two, 8, 1, 8, RankOrder::kPipelines));   // the paper config's layout
  EXPECT_FALSE(layout_offered(two, 1, 8, 8, RankOrder::kPipelines));  // T = 1: the same ranks as roles
  EXPECT_TRUE(layout_offered(two, 1, 2, 6, RankOrder::kPipelines));   // fits node 0; roles' rule says no
  ClusterSpec one = two;
  one.nodes = 1;
  EXPECT_TRUE(layout_offered(one, 2, 2, 4, RankOrder::kRoles));
  EXPECT_FALSE(layout_offered(one, 2, 2, 4, RankOrder::kPipelines));  // one node: the same cost
}

// T=2, P=2, S=4 on 2 nodes of 4 devices, 1 GB/s inside a node, 10 kB/s between (a slow network
// makes the tiny model's trade-off visible). Full fp32 logits of the tiny teacher: 32·4 + 64/16 =
// 132 B per token. Gradients at depth 2: 4·1464 = 5856 B; a ring all-reduce over 4 students moves
// 2·3/4 of them = 8784 B. grad_accum 8: a student step is 128 tokens, 128·9312/1e6 = 1.191936 s.
//   roles:     teachers = node 0, students = node 1: the channel at 10 kB/s, T = 2 senders:
//              2·1e4/132 = 151.5 tok/s; the all-reduce inside node 1: 8784/1e9 = 8.784 µs;
//              students 4·128/1.191945 = 429.6 tok/s: the channel binds.
//   pipelines: node t = pipeline t + students 2t, 2t+1: the channel at 1 GB/s: 2·1e9/132 tok/s;
//              the all-reduce across nodes: 8784/1e4 = 0.8784 s; students 512/2.070336 = 247.3
//              tok/s, below the teacher's 2/3.104 ms = 644 tok/s: the students bind.
TEST(CostModel, PipelinesOrderKeepsTheLogitsOnTheNodeAndSendsTheGradientsAcross) {
  ClusterSpec c = tiny_cluster();
  c.nodes = 2;
  c.inter_bw = 1e4;
  PlanInput in = tiny_input();
  in.grad_accum = 8;
  const LayoutEstimate roles = estimate_layout(in, c, 2, 2, 4, RankOrder::kRoles);
  const LayoutEstimate pipes = estimate_layout(in, c, 2, 2, 4, RankOrder::kPipelines);
  EXPECT_EQ(pipes.order, RankOrder::kPipelines);
  EXPECT_NEAR(roles.channel_tokens_per_s, 2 * 1e4 / 132.0, 1e-9);
  EXPECT_NEAR(pipes.channel_tokens_per_s, 2 * 1e9 / 132.0, 1e-3);
  EXPECT_NEAR(roles.student_tokens_per_s[0], 512 / (1.191936 + 8784 / 1e9), 1e-6);
  EXPECT_NEAR(pipes.student_tokens_per_s[0], 512 / (1.191936 + 8784 / 1e4), 1e-6);
  // The activations between stages stay inside a node in both orders.
  EXPECT_DOUBLE_EQ(roles.teacher_stage_s_per_token, pipes.teacher_stage_s_per_token);
  EXPECT_EQ(roles.bottleneck, "channel");
  EXPECT_EQ(pipes.bottleneck, "students");
  EXPECT_GT(pipes.mean_tokens_per_s, roles.mean_tokens_per_s);
}

// Channel-bound on two nodes (slow network, full logits): the co-located order wins, and the old
// rule (T·P a multiple of the devices per node) would not even have listed the winner's kind.
TEST(CostModel, ChannelBoundJobOnTwoNodesIsPlannedCoLocated) {
  ClusterSpec c = tiny_cluster();
  c.nodes = 2;
  c.inter_bw = 1e4;
  PlanInput in = tiny_input();
  in.grad_accum = 8;
  const auto ranked = rank_layouts(in, c);
  ASSERT_FALSE(ranked.empty());
  EXPECT_EQ(ranked[0].order, RankOrder::kPipelines);
  EXPECT_NE(ranked[0].bottleneck, "channel");
  bool separated_listed = false;
  for (const auto& e : ranked) separated_listed |= e.order == RankOrder::kRoles && e.devices > 4;
  EXPECT_TRUE(separated_listed) << "both kinds are listed";
  const std::string text = describe_plan(in, c, ranked);
  EXPECT_NE(text.find("rank_order = \"pipelines\" (tasks per node a multiple of " +
                      std::to_string(ranked[0].P + ranked[0].S / ranked[0].T)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(" pipelines "), std::string::npos) << text;
}

// The paper's setup: Qwen3-8B teacher, nine-layer student growing 1..9, top-64 logits, on two
// 8-GPU H200 nodes. The plan must pick a feasible balanced layout and print its reasoning.
TEST(CostModel, PaperPlanOnH200PrintsARecommendationWithNumbers) {
  PlanInput in;
  in.teacher = *known_qwen3_shape("qwen3-8b");
  in.student = {"student", 9, 1024, 16, 8, 64, 3072, 151936, true};
  in.seq_len = 4096;
  in.micro_batch = 4;
  in.distill.logits = TeacherOutput::kTopk;
  in.distill.topk = 64;
  in.distill.channel_dtype = FloatDtype::kBf16;
  in.stage_depths = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  in.stage_tokens = std::vector<double>(9, 1.0);
  ClusterSpec c = cluster_preset("h200");
  c.nodes = 2;
  const auto ranked = rank_layouts(in, c);
  ASSERT_FALSE(ranked.empty());
  const auto& best = ranked[0];
  EXPECT_TRUE(best.fits_memory);
  // The teacher forward of 8B (16.3 GFLOP/token) outweighs a 9-layer student's training
  // (1.8 GFLOP/token at full depth). With teachers and students on separate nodes the job is
  // teacher bound at the one node of 8 teacher devices the node rule allows.
  const auto separated = std::find_if(ranked.begin(), ranked.end(),
                                      [](const LayoutEstimate& e) { return e.order == RankOrder::kRoles; });
  ASSERT_NE(separated, ranked.end());
  EXPECT_EQ(separated->bottleneck, "teacher");
  EXPECT_EQ(separated->T * separated->P, 8);
  // Top-64 logits are light, so nothing stops a pipeline sharing a node with its students: the
  // co-located order gives the teacher more than a node's devices and wins.
  EXPECT_EQ(best.order, RankOrder::kPipelines);
  EXPECT_GT(best.T * best.P, 8);
  EXPECT_GT(best.mean_tokens_per_s, separated->mean_tokens_per_s * 1.005);
  const std::string text = describe_plan(in, c, ranked);
  EXPECT_NE(text.find("Recommendation: T="), std::string::npos) << text;
  EXPECT_NE(text.find("teacher_pipelines = " + std::to_string(best.T)), std::string::npos) << text;
  std::cout << text;
}

TEST(CostModel, CpuCalibrationFromASingleProcessRate) {
  PlanInput in = tiny_input();
  // 10 tokens/s measured at depth 2 on 2 threads: (5696 + 9312) · 10 / 2 = 75,040 FLOP/s per core.
  const ClusterSpec c = calibrate_cpu(in, {{2, 10.0}}, 2, 2, 4, 5e9);
  EXPECT_DOUBLE_EQ(c.flops, 75'040);
  EXPECT_EQ(c.devices(), 4);
  // One process on both cores reproduces the measurement through the pool bound.
  const LayoutEstimate e = estimate_layout(in, c, 1, 1, 1);
  EXPECT_NEAR(e.mean_tokens_per_s, 10.0, 1e-9);
}

}  // namespace
}  // namespace deepen

namespace deepen {
namespace {

// A run folder as the trainer writes it, enough for the model check: config.toml (with a teacher
// folder holding config.json), run.json and metrics.jsonl at a constant rate.
std::string fake_timed_run(const std::string& root, const std::string& name, int64_t T, int64_t P, int64_t S,
                           bool distributed, double tokens_per_s) {
  namespace fs = std::filesystem;
  const std::string dir = root + "/" + name;
  fs::create_directories(root + "/teacher");
  Qwen3Config t;
  t.vocab_size = 32;
  t.hidden_size = 8;
  t.intermediate_size = 16;
  t.num_hidden_layers = 4;
  t.num_attention_heads = 2;
  t.num_key_value_heads = 1;
  t.head_dim = 4;
  t.tie_word_embeddings = true;
  write_qwen3_config(t, root + "/teacher/config.json");
  Config c;
  c.run.out_dir = dir;
  c.run.threads = 1;
  c.data.seq_len = 8;
  c.teacher.checkpoint = root + "/teacher";
  c.student = {};
  c.student.layers = 2;
  c.student.hidden = 8;
  c.student.heads = 2;
  c.student.kv_heads = 1;
  c.student.head_dim = 4;
  c.student.intermediate = 16;
  c.student.vocab_size = 32;
  c.curriculum.mode = CurriculumMode::kJoint;
  c.curriculum.stages = {2};
  c.curriculum.stage_steps = {10};
  c.distill.logits = TeacherOutput::kFull;
  c.parallel.teacher_pipelines = T;
  c.parallel.teacher_stages = P;
  c.parallel.students = S;
  c.parallel.micro_batch = 2;
  fs::create_directories(dir);
  std::ofstream(dir + "/config.toml") << to_toml(c);
  std::ofstream m(dir + "/metrics.jsonl");
  for (int step = 0; step < 10; ++step)
    m << "{\"step\": " << step << ", \"stage\": 0, \"depth\": 2, \"channel_bytes\": " << (distributed ? 4096 : 0)
      << ", \"tokens_per_s\": " << tokens_per_s << "}\n";
  return dir;
}

// Calibrated on a one-process run, the model reproduces that run exactly and predicts a layout from
// the same numbers estimate_layout gives; the error is reported against the measurement.
TEST(CostModel, CheckAgainstRunsUsesEachRunsOwnLayout) {
  const std::string root = std::string(test::kBinaryDir) + "/test_scratch/cost_model/check";
  std::filesystem::remove_all(root);
  const std::string cal = fake_timed_run(root, "cal", 1, 1, 2, false, 10.0);  // 2 students folded into one process
  const std::string dist = fake_timed_run(root, "dist", 1, 2, 2, true, 20.0);
  const Config cc = load_config(cal + "/config.toml");
  const PlanInput in = plan_input_from_config(cc);
  EXPECT_EQ(in.teacher.layers, 4);
  const ClusterSpec c = calibrate_cpu(in, measured_tokens_per_s(cal), 1, 2, 4, 5e9);
  EXPECT_DOUBLE_EQ(c.flops, 10.0 * (5696 + 9312));  // one thread did teacher + student per token
  const auto rows = check_against_runs(c, {cal, dist});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].layout, "one process");
  EXPECT_NEAR(rows[0].predicted, 10.0, 1e-9);
  EXPECT_NEAR(rows[0].error(), 0.0, 1e-12);
  EXPECT_EQ(rows[1].layout, "1x2+2 (4 ranks)");
  ClusterSpec four = c;
  four.gpus_per_node = 4;
  EXPECT_NEAR(rows[1].predicted, estimate_layout(in, four, 1, 2, 2).mean_tokens_per_s, 1e-9);
  EXPECT_NEAR(rows[1].error(), rows[1].predicted / 20.0 - 1, 1e-12);
  EXPECT_NE(describe_check(rows).find("mean |error|"), std::string::npos);
}

}  // namespace
}  // namespace deepen
