// Memory model: per-rank bytes worked by hand (tiny shapes), the paper's layer, what precision and
// recomputation change, the teacher stage, the size parser, and the paper plan on 80 GB devices.
#include <gtest/gtest.h>

#include "config/config.h"
#include "config/input_error.h"
#include "plan/memory_model.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

// cost_model_test's tiny shape: hidden 8, 2 heads / 1 kv head of 4, intermediate 16, vocab 32, tied.
ModelShape tiny(int64_t layers) { return {"tiny", layers, 8, 2, 1, 4, 16, 32, true}; }

StudentMemoryInput tiny_student(StudentPrecision precision, Recompute recompute) {
  StudentMemoryInput in;
  in.student = tiny(2);
  in.tokens = 16;
  in.precision = precision;
  in.recompute = recompute;
  return in;
}

// The example in memory_model.h, number by number.
TEST(MemoryModel, TinyFp32StudentWorkedByHand) {
  const StudentMemory m = student_memory(tiny_student(StudentPrecision::kFp32, Recompute::kNone));
  EXPECT_EQ(m.weights, 4.0 * 1464);
  EXPECT_EQ(m.compute_copy, 0.0);
  EXPECT_EQ(m.gradients, 4.0 * 1464);
  EXPECT_EQ(m.optimizer, 8.0 * 1464);
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kFp32, Recompute::kNone), 680.0);  // (168 + 2 lse) · 4
  EXPECT_EQ(m.activations, 2 * 680.0 * 16);
  // The hidden states and their gradient, one chunk of all 16 rows (ATen ops on a GPU, CE alone: 24
  // bytes per element), the tied head's gradient made in the forward.
  EXPECT_EQ(m.loss, 2 * 8 * 4.0 * 16 + 16 * 32 * 24.0 + 32 * 8 * 4.0);
  EXPECT_EQ(m.targets, 0.0);                          // pretraining: no teacher logits
  EXPECT_EQ(m.total(), 5856 + 5856 + 11712 + 21760 + 14336.0);
}

// Recomputation: "layer" keeps h values per block (+ one whole block while its backward runs),
// "mlp" drops norm 2's two outputs and the MLP's four tensors: 2·8 + 4·16 = 80 values.
TEST(MemoryModel, RecomputationKeepsLessPerBlock) {
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kFp32, Recompute::kLayer), 8 * 4.0);
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kFp32, Recompute::kMlp), 680.0 - 80 * 4);
  // fp32 on CPU with the op-sequence kernels: the norms keep their rows' scales, not their inputs,
  // 4·(2 + 2 + 1) = 20 bytes instead of 4·(2·8 + 8 + 4) = 112; the MLP's norm drops its scale (4).
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kFp32, Recompute::kNone, true), 680.0 - 112 + 20);
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kFp32, Recompute::kMlp, true), 588.0 - 4 - 80 * 4 + 8 * 4);
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kBf16Mixed, Recompute::kNone, true),
            block_activation_bytes_per_token(tiny(2), StudentPrecision::kBf16Mixed, Recompute::kNone));  // bf16 runs HF's sequence
  // Plus, while the rebuilt part's backward runs, the gradients of the MLP's four 16-wide tensors.
  EXPECT_EQ(student_memory(tiny_student(StudentPrecision::kFp32, Recompute::kLayer)).activations, (2 * 32.0 + 680 + 4 * 16 * 4) * 16);
  EXPECT_EQ(student_memory(tiny_student(StudentPrecision::kFp32, Recompute::kMlp)).activations, (2 * 360.0 + 80 * 4 + 4 * 16 * 4) * 16);
}

// Precision: masters and AdamW stay fp32 under bf16-mixed, plus a 2-byte copy; bf16-pure halves all.
// Activations in bf16: 2·(4·8 + 4·8 + 3·4 + 4·16) = 280 bytes, the RMSNorms' fp32 inputs
// 4·(2·8 + 8 + 4) = 112 and the log-sum-exp 8.
TEST(MemoryModel, PrecisionSetsBytesPerParameterAndActivation) {
  const StudentMemory mixed = student_memory(tiny_student(StudentPrecision::kBf16Mixed, Recompute::kNone));
  const StudentMemory pure = student_memory(tiny_student(StudentPrecision::kBf16Pure, Recompute::kNone));
  EXPECT_EQ(mixed.weights + mixed.compute_copy + mixed.gradients + mixed.optimizer, 18.0 * 1464);
  EXPECT_EQ(pure.weights + pure.compute_copy + pure.gradients + pure.optimizer, 8.0 * 1464);
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kBf16Mixed, Recompute::kNone), 280 + 112 + 8.0);
  // mlp: drops norm 2's fp32 input (32), its outputs and the MLP (2·(2·8 + 4·16) = 160), keeps 2·8.
  EXPECT_EQ(block_activation_bytes_per_token(tiny(2), StudentPrecision::kBf16Mixed, Recompute::kMlp), 400 - 32 - 160 + 16.0);
}

// memory_model.h's grad_op example, number by number: the moments halve on S = 2, the step adds a
// gradient shard and the embedding's bucket (larger than the 64-byte cap), and the forward stays the
// peak at 16 tokens; at 1 token the step is the peak.
TEST(MemoryModel, GradOpShardsTheMomentsAndCountsTheStepsShardsWorkedByHand) {
  StudentMemoryInput in = tiny_student(StudentPrecision::kFp32, Recompute::kNone);
  in.sharding = Sharding::kGradOp;
  in.students = 2;
  in.bucket_bytes = 64;
  EXPECT_EQ(largest_trainable_params(in.student, false), 32 * 8);  // the tied embedding
  const StudentMemory m = student_memory(in);
  EXPECT_EQ(m.weights, 5856.0);
  EXPECT_EQ(m.gradients, 5856.0);       // whole: accumulated locally over micro-batches
  EXPECT_EQ(m.optimizer, 11712.0 / 2);
  EXPECT_EQ(m.grad_shard, 1464 / 2 * 4.0);
  EXPECT_EQ(m.param_shard, 1464 / 2 * 4.0);
  EXPECT_EQ(m.bucket, 256 * 4.0);
  EXPECT_EQ(m.step(), 5856 + 5856 + (5856 + 2928 + 1024.0));
  EXPECT_EQ(m.forward(), 5856 * 3 + 21760 + 14336.0);
  EXPECT_EQ(m.total(), 53664.0);
  EXPECT_EQ(student_memory(tiny_student(StudentPrecision::kFp32, Recompute::kNone)).total() - m.total(), 11712.0 / 2);
  in.tokens = 1;
  const StudentMemory one = student_memory(in);
  EXPECT_EQ(one.forward(), 17568 + 2 * 680.0 + (2 * 8 * 4 + 32 * 24 + 32 * 8 * 4.0));
  EXPECT_EQ(one.total(), 21520.0);  // the step
  // A bucket cap above every parameter: the bucket is the cap.
  in.bucket_bytes = 4096;
  EXPECT_EQ(student_memory(in).bucket, 4096.0);
  in.sharding = Sharding::kFull;  // needs layer recomputation
  EXPECT_THROW(student_memory(in), InputError);
}

// memory_model.h's "full" terms on the tiny student (2 blocks of 600 parameters, ends 264: the tied
// embedding 256 and the final norm 8), fp32, recompute = "layer", 16 tokens, S = 4, 64-byte buckets:
//   weights 4·(264 + 1200/4 + 600) = 4,656; gradients 4·(264 + 600) = 3,456; AdamW 11,712/4 = 2,928;
//   gradient shard 4·1,464/4 = 1,464, held through the forward twice: 2,928; activations
//   (2·8·4 + 680 + 4·16·4)·16 = 16,000; loss 14,336; forward = 44,304; step = 4,656 + 2,928 +
//   max(3,456 + 1,464 + 1,024, 1,464 + 0, 0 + 1,024) = 13,528.
TEST(MemoryModel, FullShardingHoldsTheEndsOneBlockAndSlicesWorkedByHand) {
  StudentMemoryInput in = tiny_student(StudentPrecision::kFp32, Recompute::kLayer);
  in.sharding = Sharding::kFull;
  in.students = 4;
  in.bucket_bytes = 64;
  const StudentMemory m = student_memory(in);
  EXPECT_EQ(m.weights, 4656.0);
  EXPECT_EQ(m.gradients, 3456.0);
  EXPECT_EQ(m.optimizer, 2928.0);
  EXPECT_EQ(m.grad_shard, 1464.0);
  EXPECT_EQ(m.held_shards, 2928.0);
  EXPECT_EQ(m.param_shard, 0.0);
  EXPECT_EQ(m.activations, 16000.0);
  EXPECT_EQ(m.forward(), 44304.0);
  EXPECT_EQ(m.step(), 13528.0);
  // Against grad_op on the same S: the blocks' weights and gradients shrink, the held shards grow.
  in.sharding = Sharding::kGradOp;
  const StudentMemory g = student_memory(in);
  EXPECT_EQ(g.forward() - m.forward(), (5856 - 4656) + (5856 - 3456) - 2928.0);
  in.sharding = Sharding::kFull;
  in.recompute = Recompute::kNone;
  EXPECT_THROW(student_memory(in), InputError);
}

// "none" over S > 1 adds, at the end of the backward, the flat copy of every bucket the all-reduce
// reduces in (the gradients once more); one student has none.
TEST(MemoryModel, ReplicatedOverStudentsCountsTheAllReducesFlatCopies) {
  StudentMemoryInput in = tiny_student(StudentPrecision::kBf16Mixed, Recompute::kLayer);
  const StudentMemory one = student_memory(in);
  EXPECT_EQ(one.flat_copies, 0.0);  // one student: nothing to all-reduce
  EXPECT_EQ(one.step(), one.weights + one.gradients + one.optimizer);
  in.students = 8;
  const StudentMemory m = student_memory(in);
  EXPECT_EQ(m.flat_copies, m.gradients);
  EXPECT_EQ(m.step() - one.step(), m.gradients);
  EXPECT_EQ(m.forward(), one.forward());
  EXPECT_EQ(m.total(), std::max(m.forward(), m.step()));
  EXPECT_EQ(m.grad_shard + m.param_shard + m.bucket + m.held_shards, 0.0);
}

// The paper's layer (memory_model.h's example) and its student's frozen embedding.
TEST(MemoryModel, PaperLayerAndFrozenEmbedding) {
  const ModelShape paper{"student", 9, 4096, 32, 8, 128, 12288, 151936, false};
  EXPECT_EQ(block_activation_bytes_per_token(paper, StudentPrecision::kBf16Mixed, Recompute::kNone), 223360.0);
  StudentMemoryInput in;
  in.student = paper;
  in.tokens = 8192;
  in.precision = StudentPrecision::kBf16Mixed;
  in.frozen_embedding = true;
  const StudentMemory m = student_memory(in);
  const double params = static_cast<double>(total_params(paper)), embedding = 151936.0 * 4096;
  EXPECT_EQ(m.gradients, 4 * (params - embedding));
  EXPECT_EQ(m.optimizer, 8 * (params - embedding));
  EXPECT_EQ(m.weights, 4 * params);
  // grad_op over the paper's 8 students: the moments (fp32 masters under bf16-mixed) to 1/8, the
  // head (untied, trained) is the largest bucket: 151,936 x 4,096 fp32 = 2.32 GiB > 32 MiB.
  in.sharding = Sharding::kGradOp;
  in.students = 8;
  const StudentMemory sharded = student_memory(in);
  EXPECT_EQ(largest_trainable_params(paper, true), 151936 * 4096);
  EXPECT_EQ(sharded.optimizer, 8 * (params - embedding) / 8);
  EXPECT_EQ(sharded.grad_shard, 4 * (params - embedding) / 8);
  EXPECT_EQ(sharded.bucket, 4 * embedding);
  EXPECT_EQ(sharded.gradients, m.gradients);
  EXPECT_EQ(sharded.total(), m.total() - 7 * (params - embedding));  // the forward stays the peak
}

// A middle stage holds its layers and max_in_flight outgoing activations; the last adds the head,
// the final norm and the logits. Tiny teacher (4 layers split 2 + 2), bf16, 16 tokens.
TEST(MemoryModel, TeacherStageWorkedByHand) {
  const ModelShape t = tiny(4);
  const TeacherStageMemory mid = teacher_stage_memory(t, 2, false, false, 2, 16, 8 * 2, 4);
  EXPECT_EQ(mid.weights, 2.0 * 2 * 600);
  EXPECT_EQ(mid.working, (4 * 8 + 3 * 16) * 2.0 * 16);
  EXPECT_EQ(mid.buffers, 4 * 16.0 * 16);
  const TeacherStageMemory last = teacher_stage_memory(t, 2, false, true, 2, 16, 32 * 2, 4);
  EXPECT_EQ(last.weights, 2.0 * (2 * 600 + 32 * 8 + 8));
  EXPECT_EQ(last.working, (4 * 8 + 3 * 16) * 2.0 * 16 + 32 * 2.0 * 16);
  EXPECT_EQ(last.buffers, 4 * 64.0 * 16);
  // The full channel's head writes into an outgoing buffer: the logits are no working tensor.
  const TeacherStageMemory in_place = teacher_stage_memory(t, 2, false, true, 2, 16, 32 * 2, 4, true);
  EXPECT_EQ(in_place.working, (4 * 8 + 3 * 16) * 2.0 * 16);
  EXPECT_EQ(in_place.buffers, last.buffers);
}

TEST(MemoryModel, DeviceMemoryTakesUnits) {
  EXPECT_EQ(parse_bytes("80GiB", "m"), 80.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("80GB", "m"), 80e9);
  EXPECT_EQ(parse_bytes("141e9", "m"), 141e9);
  EXPECT_EQ(parse_bytes("512 MiB", "m"), 512.0 * 1024 * 1024);
  EXPECT_THROW(parse_bytes("eighty", "--device-memory"), InputError);
  EXPECT_THROW(parse_bytes("80 parsecs", "--device-memory"), InputError);
  EXPECT_THROW(parse_bytes("-1GB", "--device-memory"), InputError);
}

PlanInput paper_plan() {
  const Config cfg = load_config(std::string(test::kSourceDir) + "/configs/paper/qwen3-8b.toml",
                                 {"teacher.checkpoint=\"Qwen3-8B\""});
  return plan_input_from_config(cfg);
}

// run.device = "cpu" makes the plan's student a CPU process: the loss takes the CPU chunk budget
// (512 MiB, not the GPU's 4 GiB) and, with cpu_kernels other than "aten", the fused kernel. Before,
// every plan used the GPU's, and a CPU paper-shape student (7.8 GiB measured) was given 11.5 GiB.
TEST(MemoryModel, ACpuConfigPlansTheCpuLoss) {
  const std::string file = std::string(test::kSourceDir) + "/configs/paper/qwen3-8b.toml";
  const PlanInput gpu = plan_input_from_config(load_config(file, {"teacher.checkpoint=\"Qwen3-8B\""}));
  const PlanInput cpu = plan_input_from_config(
      load_config(file, {"teacher.checkpoint=\"Qwen3-8B\"", "run.device=\"cpu\"", "parallel.backend=\"mpi\""}));
  const StudentMemoryInput g = student_memory_input(gpu), c = student_memory_input(cpu);
  EXPECT_TRUE(g.gpu);
  EXPECT_FALSE(g.loss_fused);
  EXPECT_FALSE(c.gpu);
  EXPECT_TRUE(c.loss_fused);  // student.cpu_kernels = "auto" in this config
  EXPECT_LT(student_memory(c).loss, student_memory(g).loss);  // one 512 MiB chunk instead of 4 GiB
  EXPECT_FALSE(g.closed_form_norms);
  EXPECT_FALSE(c.closed_form_norms);
}

// cpu_kernels = "aten" on CPU: the op-sequence RMSNorms keep one fp32 scale per row, not their
// input (the model memory_check measures against): an fp32 student's activations shrink by
// 4·(2h + q + kv) - 4·(2 + heads + kv_heads) bytes per token and layer; bf16-mixed keeps its inputs.
TEST(MemoryModel, AnAtenCpuConfigPlansTheClosedFormNorms) {
  const std::string file = std::string(test::kSourceDir) + "/configs/paper/qwen3-8b.toml";
  const std::vector<std::string> cpu = {"teacher.checkpoint=\"Qwen3-8B\"", "run.device=\"cpu\"", "parallel.backend=\"mpi\"",
                                        "student.precision=\"fp32\"", "student.recompute=\"none\""};
  std::vector<std::string> aten = cpu;
  aten.push_back("student.cpu_kernels=\"aten\"");
  const StudentMemoryInput f = student_memory_input(plan_input_from_config(load_config(file, cpu)));
  const StudentMemoryInput a = student_memory_input(plan_input_from_config(load_config(file, aten)));
  EXPECT_FALSE(f.closed_form_norms);
  EXPECT_TRUE(a.closed_form_norms);
  EXPECT_FALSE(a.loss_fused);
  EXPECT_LT(block_activation_bytes_per_token(a.student, a.precision, a.recompute, a.closed_form_norms),
            block_activation_bytes_per_token(f.student, f.precision, f.recompute, f.closed_form_norms));
}

ClusterSpec two_nodes_of_80_gb() {
  ClusterSpec c = cluster_preset("h100");  // 80 GB = 80e9 bytes per device
  c.nodes = 2;
  return c;
}

// The paper's config on 8 teacher + 8 student 80 GB GPUs: as shipped (grad_op, micro-batch 2 x
// 8,192 tokens) both roles fit; grad_op takes 7/8 of the moments (8 bytes per trainable parameter
// under bf16-mixed) off a student. Replicated at micro-batch 4 a student does not fit (the bf16
// targets and activations double; the loss's chunk stays at its budget) and the plan names both ways
// out: grad_op and micro_batch = 3.
TEST(MemoryModel, PaperConfigOnEightyGigabyteDevicesNamesWhatFits) {
  PlanInput in = paper_plan();
  EXPECT_EQ(in.seq_len, 8192);  // documents: max_len
  EXPECT_EQ(in.precision, StudentPrecision::kBf16Mixed);
  EXPECT_EQ(in.sharding, Sharding::kGradOp);
  EXPECT_EQ(in.micro_batch, 2);
  const ClusterSpec c = two_nodes_of_80_gb();
  const LayoutEstimate shipped = estimate_layout(in, c, 8, 1, 8);
  EXPECT_TRUE(shipped.fits_memory);
  const auto ranked = rank_layouts(in, c);
  ASSERT_FALSE(ranked.empty());
  EXPECT_EQ(ranked.front().devices, 16);
  const double trainable = static_cast<double>(total_params(in.student) - in.student.vocab * in.student.hidden);
  PlanInput replicated = in;
  replicated.sharding = Sharding::kNone;
  EXPECT_EQ(estimate_layout(replicated, c, 8, 1, 8).student_bytes - shipped.student_bytes, 7 * 8 * trainable / 8);
  replicated.micro_batch = 4;
  replicated.grad_accum = 2;
  EXPECT_FALSE(estimate_layout(replicated, c, 8, 1, 8).fits_memory);
  const std::string text = describe_plan(replicated, c, rank_layouts(replicated, c));
  for (const char* want : {"Memory per rank", "parallel.sharding = \"none\" (AdamW state whole on every student)",
                           "does NOT fit", "with parallel.sharding = \"grad_op\" over S=8: ", "-> would fit",
                           "parallel.micro_batch = 3 fits"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  std::cout << text;
}

// Why the shipped config keeps micro_batch = 2 under grad_op (global_batch = 64 over 8 students takes
// 1, 2, 4 or 8): at 2 both roles fit an 80 GB device with more margin than the model's worst measured
// under-prediction (bench/memory_check, docs/performance.md: measured/predicted at most 1.066,
// recompute = "layer"). At 4 both fit by the model too, now that the teacher's head writes its logits
// straight into the outgoing buffers (4 of them: 37.1 GiB of the stage's 55.6); the student's
// model is checked against measured peaks, the teacher stage's only on CPU
// (bench/paper_shape_rehearsal.py), so the config stays at 2 until a GPU run measures a stage. At 8
// neither fits. The plan prints the sharded figures in the memory section and each layout's student
// peak in the table.
TEST(MemoryModel, PaperConfigMicroBatchFitsWithinTheModelsMeasuredErrorAndEightDoesNot) {
  constexpr double kWorstMeasuredOverPredicted = 1.066;
  PlanInput in = paper_plan();
  const ClusterSpec c = two_nodes_of_80_gb();
  const double budget = 0.9 * c.memory;
  const LayoutEstimate two = estimate_layout(in, c, 8, 1, 8);
  EXPECT_LE(two.student_bytes * kWorstMeasuredOverPredicted, budget);
  EXPECT_LE(two.teacher_stage_bytes * kWorstMeasuredOverPredicted, budget);
  in.micro_batch = 8;
  in.grad_accum = 1;
  const LayoutEstimate eight = estimate_layout(in, c, 8, 1, 8);
  EXPECT_FALSE(eight.fits_memory);
  EXPECT_GT(eight.student_bytes, budget);
  EXPECT_GT(eight.teacher_stage_bytes, budget);
  in.micro_batch = 4;
  in.grad_accum = 2;
  const LayoutEstimate four = estimate_layout(in, c, 8, 1, 8);
  EXPECT_TRUE(four.fits_memory);
  EXPECT_LE(four.student_bytes * kWorstMeasuredOverPredicted, budget);
  EXPECT_LE(four.teacher_stage_bytes * kWorstMeasuredOverPredicted, budget);
  const std::string text = describe_plan(in, c, rank_layouts(in, c));
  for (const char* want : {"parallel.sharding = \"grad_op\" over S=8 (AdamW moments sharded", "AdamW 2.2 (1/8)",
                           "optimizer step: ", "with parallel.sharding = \"none\": 71.6 -> would not fit",
                           "student GiB", "students = 8, sharding = \"grad_op\", rank_order = \"roles\""})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  std::cout << text;
}

}  // namespace
}  // namespace deepen
