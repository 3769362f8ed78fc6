// Cost model for `deepen plan`: FLOPs, bytes and rates of the teacher pipelines, the logit channel
// and the students, and the T·P+S layout that balances teacher supply with student demand.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "dist/rank_layout.h"

namespace deepen {

// The shapes that set the cost of a Qwen3-style decoder.
struct ModelShape {
  std::string name;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  bool tied = true;
};

// Known Qwen3 shapes (from their config.json), so a plan needs no checkpoint download:
// "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b" (case-insensitive, "Qwen3-8B"
// works, and so does a path ending in such a folder name). nullopt for others.
std::optional<ModelShape> known_qwen3_shape(const std::string& name_or_path);

// From a Hugging Face config.json (model/hf_config.h), from the [student] section.
ModelShape shape_from_qwen3_json(const std::string& config_json_path);
ModelShape shape_from_student(const StudentConfig& s, int64_t vocab);

// Parameters of one decoder block: q, k, v, o projections, the SwiGLU MLP (gate, up, down) and the
// norms (2 RMSNorm over hidden, q- and k-norm over head_dim).
// Example (Qwen3-8B: hidden 4096, 32 heads, 8 kv heads, head_dim 128, intermediate 12288):
//   attention 4096·128·(32 + 8 + 8) + 32·128·4096 = 41,943,040; MLP 3·4096·12288 = 150,994,944;
//   norms 2·4096 + 2·128 = 8,448; block = 192,946,432; 36 blocks = 6,946,071,552
int64_t block_params(const ModelShape& m);
// Weights that are multiplied per token in one block (block_params without the norms).
int64_t block_matmul_params(const ModelShape& m);
// All parameters: blocks + embedding + final norm + (untied) head. Qwen3-8B: 8,190,735,360.
int64_t total_params(const ModelShape& m);

// Forward FLOPs per token of `depth` blocks at sequence length `seq_len`: 2·(matmul weights) per
// token, plus attention scores and weighted sum, 2·2·heads·head_dim per attended position, with a
// causal mask attending (seq_len+1)/2 positions on average; plus the LM head 2·hidden·vocab when
// `with_head`. Example (Qwen3-8B, 36 blocks, seq 4096, head): 2·6,945,767,424 (matmul)
//   + 36·4·4096·2048.5 (attention) + 2·4096·151,936 = 13,891,534,848 + 1,208,074,240 + 1,244,659,712
//   = 16,344,268,800 FLOP/token.
double forward_flops_per_token(const ModelShape& m, int64_t depth, int64_t seq_len, bool with_head);
// Training FLOPs per token: forward + backward = 3 × forward (the 6·N rule with attention and head).
double train_flops_per_token(const ModelShape& m, int64_t depth, int64_t seq_len);

// Bytes per token on the logit channel. Full: vocab × (4 fp32 | 2 bf16). Top-k: k × (value + 4-byte
// index), plus one value for the tail mass with tail = "bucket". Hidden: the teacher's final hidden
// states, teacher_hidden × value. Plus header_bytes per micro-batch (token-id checksum, shapes),
// spread over its tokens.
// Examples: full fp32, vocab 151,936: 607,744 B/token; top-64 bf16 renormalize: 64·(2+4) = 384 B;
// hidden bf16 at 4096: 8,192 B.
double logit_bytes_per_token(const DistillConfig& d, int64_t vocab, int64_t tokens_per_micro_batch,
                             int64_t header_bytes = 64, int64_t teacher_hidden = 0);

// With distill.logits = "hidden" each student computes the teacher's logits from the received hidden
// states, a chunk of rows at a time, once (the loss makes its gradients in the forward): 2·hidden·vocab
// FLOPs per token; the teacher's last stage skips its head. 0 for the other channels.
double student_teacher_head_flops_per_token(const DistillConfig& d, const ModelShape& teacher);

// The machines. Rates are per device (GPU, or CPU rank).
struct ClusterSpec {
  std::string name = "custom";
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  double flops = 989e12;        // peak dense bf16 FLOP/s per device
  double mfu = 0.4;             // achieved fraction of peak for training (students)
  double teacher_mfu = 0.5;     // achieved fraction for forward-only teacher stages
  double intra_bw = 450e9;      // bytes/s per device within a node (one direction)
  double inter_bw = 50e9;       // bytes/s per device between nodes (one direction)
  double memory = 141e9;        // bytes per device
  // CPU runs: ranks share this many cores (0 = every rank has its own device). Then `flops` is per
  // core, each rank computes on `threads_per_rank` cores at most, and the whole job on at most
  // `shared_cores` at once.
  int64_t shared_cores = 0;
  int64_t threads_per_rank = 1;
  int64_t devices() const { return nodes * gpus_per_node; }
};

// Presets: "h200" (989 TFLOP/s bf16 dense, 141 GB, NVLink 450 GB/s per direction, 400 Gb/s NDR
// per GPU ≈ 50 GB/s), "h100" (989 TFLOP/s, 80 GB, same links), "a100" (312 TFLOP/s, 80 GB, 300 GB/s,
// 25 GB/s). InputError for another name.
ClusterSpec cluster_preset(const std::string& name);

// What a plan is about: the pair, the batch and the curriculum (depth per stage and tokens per stage
// to weight them).
struct PlanInput {
  ModelShape teacher;
  ModelShape student;         // at full depth
  int64_t seq_len = 4096;
  int64_t micro_batch = 4;    // sequences per student rank per micro-batch
  int64_t grad_accum = 1;
  // parallel.global_batch: sequences per optimizer step for every layout (0 = micro_batch ×
  // grad_accum per student, whatever S). With it, S students each take global_batch / S per step,
  // so more students mean fewer tokens between all-reduces (strong scaling).
  int64_t global_batch = 0;
  DistillConfig distill;      // logits (full/topk), topk, tail, channel_dtype
  FloatDtype activation_dtype = FloatDtype::kBf16;  // between teacher stages
  std::vector<int64_t> stage_depths;      // empty: one stage at student.layers
  std::vector<double> stage_tokens;       // same length (relative weights are enough)
  // Tokens of the whole run, for the pipeline fill; 0 = a long run (the fill is negligible).
  double total_tokens = 0;
  int64_t header_bytes = 64;
  // Memory (plan/memory_model.h): the student's arithmetic and recomputation, what it trains, the
  // teacher's dtype and the outgoing buffers of each hop.
  StudentPrecision precision = StudentPrecision::kFp32;  // student.precision
  Recompute recompute = Recompute::kNone;                // student.recompute
  bool frozen_embedding = false;        // student.init = "teacher"
  FloatDtype teacher_dtype = FloatDtype::kBf16;
  int64_t max_in_flight = 4;
  // Runs sharing the teacher (a group, `deepen group`): a last stage keeps up to max_in_flight
  // payloads per run when their micro-batches differ (diverging streams, per-run evaluations), so
  // its outgoing buffers are runs × max_in_flight payloads (dist/logit_channel.h).
  int64_t shared_runs = 1;
  int64_t students = 1, teacher_stages = 1;  // the config's layout: the memory section's when none fits
  // parallel.sharding ("none" | "grad_op": AdamW moments split over each layout's S students) and
  // parallel.bucket_cap_mb (MiB, the reduction's bucket, a step temporary under grad_op).
  Sharding sharding = Sharding::kNone;
  double bucket_cap_mb = 32;
  // run.device = "cpu": the ranks are CPU processes, whose loss takes the CPU chunk budget and, with
  // student.cpu_kernels other than "aten", the fused kernel (train/loss_chunking.h); else devices.
  bool cpu = false;
  bool cpu_loss_fused = false;
};

// A candidate layout and its predicted rates (tokens/s of the whole job unless noted).
struct LayoutEstimate {
  int64_t T = 1, P = 1, S = 1;
  RankOrder order = RankOrder::kRoles;  // parallel.rank_order: which ranks share a node
  int64_t devices = 0;                 // T·P + S
  double teacher_stage_s_per_token = 0;  // slowest stage, per token, compute or activation transfer
  // Teacher stages stream micro-batches without draining between steps (bounded in-flight buffers),
  // so a pipeline fills once per run: n / (n + P − 1), n = micro-batches it runs in the whole run.
  double pipeline_efficiency = 1;
  double teacher_tokens_per_s = 0;     // T pipelines
  double channel_tokens_per_s = 0;     // T last stages sending, S students receiving
  double channel_bytes_per_token = 0;
  std::vector<double> student_tokens_per_s;  // S students, per stage depth
  std::vector<double> job_tokens_per_s;      // min of the above, per stage
  double mean_tokens_per_s = 0;        // tokens-weighted over the curriculum (harmonic)
  double supply_over_demand = 0;       // teacher (and channel) supply / student demand, curriculum mean
  std::string bottleneck;              // "teacher", "students", "channel" (at the heaviest stage)
  // Peak bytes per rank (plan/memory_model.h): the largest teacher stage and a student at full
  // depth under the plan's parallel.sharding with this layout's S; a layout fits when both are
  // within 90% of the device's memory (the rest: CUDA context, allocator fragmentation).
  double teacher_stage_bytes = 0;
  double student_bytes = 0;
  bool fits_memory = true;
  std::string memory_note;
};

// Tokens per micro-batch of a plan: micro_batch × seq_len (documents: max_len, the padded worst case).
int64_t micro_batch_tokens(const PlanInput& in);

// Pure: the rates of one layout. Example (tests/plan/cost_model_test.cpp): a 4-layer teacher and a
// 2-layer student on 4 devices of 1 TFLOP/s, T=1 P=2 S=1 -> teacher bound or student bound as
// computed there by hand.
// Ranks sit where `order` puts them (dist/rank_layout.h), nodes filled in rank order with
// gpus_per_node ranks each (Slurm's block distribution); each link is priced by whether its two ranks
// share a node: intra_bw, else inter_bw. The activations between stages and the logit channel take
// the slowest pipeline's links; the students' gradient all-reduce takes intra_bw when all students
// share one node, else inter_bw. Example: T=2, P=4, S=8 on 2 nodes of 8 with full logits:
//   kRoles:     teachers on node 0, students on node 1: channel at inter_bw, all-reduce at intra_bw;
//   kPipelines: pipeline t and its 4 students on node t: channel at intra_bw, all-reduce at inter_bw.
LayoutEstimate estimate_layout(const PlanInput& in, const ClusterSpec& c, int64_t T, int64_t P, int64_t S,
                               RankOrder order = RankOrder::kRoles);

// Pure: whether `deepen plan` offers a layout in an order on the cluster. One node (or a CPU pool):
// kRoles only (both orders cost the same there). More than one node: kRoles when teachers and
// students fall on separate nodes (T·P a multiple of gpus_per_node, the rule check_placement
// enforces); kPipelines when each pipeline's last stage shares a node with all its students (the
// co-located layout the order is for) and T > 1 or kRoles is not offered (with T = 1 the orders are
// the same). Examples on 2 nodes of 8: 2x4+8 roles yes (8 teacher ranks), pipelines yes (groups of
// 8); 4x3+4 roles no (12), pipelines yes (groups of 4: 3 stages + 1 student); 5x2+5 pipelines no
// (groups of 3: pipeline 2's last stage is rank 7 on node 0, its student rank 8 on node 1).
bool layout_offered(const ClusterSpec& c, int64_t T, int64_t P, int64_t S, RankOrder order);

// Every feasible layout on the cluster (S a multiple of T, P ≤ teacher layers, T·P+S ≤ devices,
// layout_offered in either order; both orders listed where both are offered), best first: highest
// curriculum-mean tokens/s, then fewer devices, then smaller P, then kRoles.
std::vector<LayoutEstimate> rank_layouts(const PlanInput& in, const ClusterSpec& c);

// The plan printed by `deepen plan`: the numbers behind the recommendation.
std::string describe_plan(const PlanInput& in, const ClusterSpec& c, const std::vector<LayoutEstimate>& ranked,
                          size_t show = 8);

// PlanInput from a deepen config: the student from [student] (vocab from the teacher when 0), the
// teacher from teacher.checkpoint's config.json or a known Qwen3 name in it, seq_len, micro_batch,
// grad_accum, [distill], activation_dtype, and the curriculum's depths and stage budgets.
PlanInput plan_input_from_config(const Config& cfg);

// ---- Calibration on measured CPU runs --------------------------------------------------------------
// Median tokens_per_s of a run's metrics.jsonl per active depth, leaving out the first `warmup` steps
// of every stage (first touch of fresh memory, allocator warm-up). InputError without records.
std::map<int64_t, double> measured_tokens_per_s(const std::string& run_dir, int64_t warmup = 2);

// A CPU "cluster" calibrated on a single-process `deepen train` run: that run does, per token, a
// teacher forward and a student step one after the other on `threads` cores, so
//   flops per core = tokens/s × (teacher forward + student train FLOPs per token) / threads
// (median over depths). mfu = teacher_mfu = 1: the measured rate already holds the efficiency.
// The returned cluster has one node with `ranks` devices sharing `cores` cores, `threads` per rank,
// and `p2p_bw` bytes/s between ranks (MPI shared memory).
ClusterSpec calibrate_cpu(const PlanInput& in, const std::map<int64_t, double>& single_process_tokens_per_s,
                          int64_t threads, int64_t cores, int64_t ranks, double p2p_bw);

// The model against measured runs: for each run folder, its own config (layout, shapes, batch) is
// estimated on the calibrated CPU `cluster` and compared, per active depth, with the median
// measured tokens/s. A run that ran as one process (no logit-channel bytes in its metrics; the
// trainer folds S students into accumulation) is predicted as one process: teacher forward and
// student step in turn on its run.threads cores.
struct CheckRow {
  std::string run;
  std::string layout;   // "1x2+2 (4 ranks)" or "one process"
  int64_t depth = 0;
  double predicted = 0, measured = 0;
  double error() const { return (predicted - measured) / measured; }
};
std::vector<CheckRow> check_against_runs(const ClusterSpec& cluster, const std::vector<std::string>& run_dirs);
std::string describe_check(const std::vector<CheckRow>& rows);

}  // namespace deepen
