// Cost model: FLOPs, logit bytes, per-layout rates and the recommended T·P+S (see cost_model.h).
#include "plan/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/layout_label.h"
#include "model/hf_config.h"
#include "model/layer_split.h"
#include "plan/memory_model.h"
#include "run_folder/jsonl.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Layers per stage: the split a distributed run makes (model/layer_split.h, as launch/distributed_job
// calls it: the last stage's head counted, none with the hidden channel), so the plan costs the
// stages the job will run.
std::vector<int64_t> stage_layers(const PlanInput& in, int64_t stages) {
  const ModelShape& t = in.teacher;
  const double head_layers =
      last_stage_head_layers(in.distill.logits, t.vocab, t.hidden, t.heads, t.kv_heads, t.head_dim, t.intermediate);
  std::vector<int64_t> out;
  for (const auto& [first, last] :
       split_layers_with_head(static_cast<int>(t.layers), static_cast<int>(stages), head_layers))
    out.push_back(last - first);
  return out;
}

double attention_flops_per_layer(const ModelShape& m, int64_t seq_len) {
  // QK^T and the weighted sum of V: 2 FLOP per multiply-add, 2 products, heads·head_dim wide, over
  // (seq_len + 1) / 2 attended positions on average under the causal mask.
  return 4.0 * static_cast<double>(m.heads * m.head_dim) * (static_cast<double>(seq_len) + 1) / 2;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// 1234567 -> "1.23 M", for rates and sizes in the printed plan.
std::string si(double v, const std::string& unit) {
  const char* prefixes[] = {"", " k", " M", " G", " T", " P"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  return fmt(v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v) + prefixes[i] + (i ? "" : " ") + unit;
}

int64_t node_of(int64_t rank, int64_t gpus_per_node) { return rank / gpus_per_node; }

std::string gib(double bytes) { return fmt("%.1f", bytes / (1024.0 * 1024.0 * 1024.0)); }

// The largest teacher stage of a P-stage pipeline for the plan's micro-batch.
TeacherStageMemory largest_teacher_stage(const PlanInput& in, int64_t P, int64_t* layers_of_largest = nullptr) {
  const std::vector<int64_t> layers = stage_layers(in, P);
  const int64_t n = micro_batch_tokens(in);
  TeacherStageMemory worst;
  for (int64_t p = 0; p < P; ++p) {
    const bool last = p == P - 1;
    const double out = last ? logit_bytes_per_token(in.distill, in.teacher.vocab, n, in.header_bytes, in.teacher.hidden)
                            : static_cast<double>(in.teacher.hidden * float_dtype_bytes(in.activation_dtype));
    // The last stage's queues are per run; the hops between stages carry one stream for all runs.
    const int64_t in_flight = in.max_in_flight * (last ? std::max<int64_t>(1, in.shared_runs) : 1);
    const TeacherStageMemory t = teacher_stage_memory(in.teacher, layers[static_cast<size_t>(p)], p == 0,
                                                      last && in.distill.logits != TeacherOutput::kHidden,  // no head to hold
                                                      float_dtype_bytes(in.teacher_dtype), n, out, in_flight,
                                                      in.distill.logits == TeacherOutput::kFull);
    if (t.total() > worst.total()) {
      worst = t;
      if (layers_of_largest) *layers_of_largest = layers[static_cast<size_t>(p)];
    }
  }
  return worst;
}

// The plan with S students: what a student's memory (sharded over S under grad_op) depends on.
PlanInput with_students(const PlanInput& in, int64_t S) {
  PlanInput out = in;
  out.students = S;
  return out;
}

// "parallel.sharding = \"grad_op\" over S=8" / "parallel.sharding = \"none\"", as the memory section names it.
std::string sharding_text(Sharding sharding, int64_t S) {
  return std::string("parallel.sharding = \"") + option_name(sharding) + "\"" +
         (sharding != Sharding::kNone ? " over S=" + std::to_string(S) : "");
}

const char* sharding_summary(Sharding sharding) {
  switch (sharding) {
    case Sharding::kGradOp: return " (AdamW moments sharded, weights and gradients whole)";
    case Sharding::kFull: return " (AdamW moments and the blocks' weights sharded, one block gathered at a time)";
    case Sharding::kNone: break;
  }
  return " (AdamW state whole on every student)";
}

// Per rank role: what a student and a teacher stage hold, whether each fits, and what would fit.
// The student follows the config's parallel.sharding at the layout's S, and names the other
// shardings' figures (when S > 1) so a plan that does not fit shows what another would give.
void describe_memory(std::ostringstream& o, const PlanInput& plan, const ClusterSpec& c, int64_t S, int64_t P) {
  const PlanInput in = with_students(plan, S);
  const double budget = 0.9 * c.memory;
  auto verdict = [&](double bytes) { return bytes <= budget ? "fits" : "does NOT fit"; };
  const StudentMemory sm = student_memory(student_memory_input(in));
  const bool sharded = in.sharding != Sharding::kNone;
  o << "Memory per rank (plan/memory_model.h; GiB; a rank fits within 90% of the device's " << gib(c.memory)
    << " GiB)\n"
    << "  student at full depth " << in.student.layers << ", " << in.precision << ", recompute " << in.recompute << ", "
    << micro_batch_tokens(in) << " tokens per micro-batch, " << sharding_text(in.sharding, S)
    << sharding_summary(in.sharding) << ":\n"
    << "    weights " << gib(sm.weights) << (in.precision == StudentPrecision::kBf16Pure ? " (bf16)" : " (fp32 masters)");
  if (in.sharding == Sharding::kFull) o << " [ends whole + blocks 1/" << S << " + one block]";
  if (sm.compute_copy > 0) o << " + bf16 copy " << gib(sm.compute_copy);
  o << " + gradients " << gib(sm.gradients) << (in.sharding == Sharding::kFull ? " [ends + one block]" : "") << " + AdamW "
    << gib(sm.optimizer) << (sharded ? " (1/" + std::to_string(S) + ")" : "") << " + activations " << gib(sm.activations)
    << " + loss " << gib(sm.loss) << " + teacher targets " << gib(sm.targets);
  if (sm.held_shards > 0) o << " + gradient shards " << gib(sm.held_shards);
  o << " = " << gib(sm.forward());
  if (sharded || sm.flat_copies > 0) {
    o << " at the end of a forward\n"
      << "    optimizer step: weights " << gib(sm.weights) << " + AdamW " << gib(sm.optimizer) << " + gradients "
      << gib(sm.gradients);
    if (sm.flat_copies > 0) o << " + all-reduce flat copies " << gib(sm.flat_copies);
    if (sharded) o << " + gradient shard " << gib(sm.grad_shard) << " + bucket " << gib(sm.bucket);
    if (sm.param_shard > 0) o << " (then the parameter shard " << gib(sm.param_shard) << " once the gradients are sent)";
    o << " = " << gib(sm.step()) << "\n    peak " << gib(sm.total());
  }
  o << " -> " << verdict(sm.total()) << "\n";
  if (S > 1) {
    for (const Sharding mode : {Sharding::kNone, Sharding::kGradOp, Sharding::kFull}) {
      if (in.sharding == mode) continue;
      PlanInput other = in;
      other.sharding = mode;
      o << "    with " << sharding_text(other.sharding, S) << ": ";
      if (other.sharding == Sharding::kFull && in.recompute != Recompute::kLayer) {
        o << "needs student.recompute = \"layer\"\n";
        continue;
      }
      const double alt = student_memory(student_memory_input(other)).total();
      o << gib(alt) << " -> would " << (alt <= budget ? "fit" : "not fit") << "\n";
    }
  }
  int64_t layers = 0;
  const TeacherStageMemory t = largest_teacher_stage(in, P, &layers);
  o << "  teacher, largest of P=" << P << " stage(s) (" << layers << " layers, " << float_dtype_name(in.teacher_dtype)
    << "): weights " << gib(t.weights) << " + forward " << gib(t.working) << " + " << in.max_in_flight
    << (in.shared_runs > 1 ? " x " + std::to_string(in.shared_runs) + " runs'" : std::string()) << " outgoing micro-batches "
    << gib(t.buffers) << " = " << gib(t.total()) << " -> " << verdict(t.total()) << "\n";
  if (sm.total() <= budget && t.total() <= budget) return;
  // The batch can be kept with smaller micro-batches and more accumulation: name the largest that fits.
  for (int64_t mb = in.micro_batch - 1; mb >= 1; --mb) {
    PlanInput smaller = in;
    smaller.micro_batch = mb;
    const double st = student_memory(student_memory_input(smaller)).total();
    const double tt = largest_teacher_stage(smaller, P).total();
    if (st <= budget && tt <= budget) {
      o << "  parallel.micro_batch = " << mb << " fits (student " << gib(st) << ", teacher stage " << gib(tt)
        << " GiB); raise grad_accum by " << fmt("%.3g", static_cast<double>(in.micro_batch) / static_cast<double>(mb))
        << "x to keep the batch\n";
      return;
    }
  }
  o << "  no micro-batch fits: add devices (more stages), recomputation, or memory\n";
}

}  // namespace

std::optional<ModelShape> known_qwen3_shape(const std::string& name_or_path) {
  std::string name = lower(fs::path(name_or_path).filename().string());
  if (name.empty()) name = lower(fs::path(name_or_path).parent_path().filename().string());
  // From the models' config.json on the Hugging Face hub (Qwen/Qwen3-*).
  struct Known {
    const char* name;
    ModelShape shape;
  };
  static const Known known[] = {
      {"qwen3-0.6b", {"Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, true}},
      {"qwen3-1.7b", {"Qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, true}},
      {"qwen3-4b", {"Qwen3-4B", 36, 2560, 32, 8, 128, 9728, 151936, true}},
      {"qwen3-8b", {"Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, false}},
      {"qwen3-14b", {"Qwen3-14B", 40, 5120, 40, 8, 128, 17408, 151936, false}},
  };
  for (const auto& k : known)
    if (name == k.name || name == std::string(k.name) + "-base") return k.shape;
  return std::nullopt;
}

ModelShape shape_from_qwen3_json(const std::string& path) {
  const Qwen3Config q = read_qwen3_config(path);
  ModelShape m;
  m.name = fs::path(path).parent_path().filename().string();
  m.layers = q.num_hidden_layers;
  m.hidden = q.hidden_size;
  m.heads = q.num_attention_heads;
  m.kv_heads = q.num_key_value_heads;
  m.head_dim = q.head_dim;
  m.intermediate = q.intermediate_size;
  m.vocab = q.vocab_size;
  m.tied = q.tie_word_embeddings;
  return m;
}

ModelShape shape_from_student(const StudentConfig& s, int64_t vocab) {
  return {"student", s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, vocab, s.tie_embeddings};
}

int64_t block_matmul_params(const ModelShape& m) {
  const int64_t attention = m.hidden * m.head_dim * (m.heads + 2 * m.kv_heads) + m.heads * m.head_dim * m.hidden;
  const int64_t mlp = 3 * m.hidden * m.intermediate;
  return attention + mlp;
}

int64_t block_params(const ModelShape& m) { return block_matmul_params(m) + 2 * m.hidden + 2 * m.head_dim; }

int64_t total_params(const ModelShape& m) {
  return m.layers * block_params(m) + m.vocab * m.hidden * (m.tied ? 1 : 2) + m.hidden;
}

double forward_flops_per_token(const ModelShape& m, int64_t depth, int64_t seq_len, bool with_head) {
  const double per_layer = 2.0 * static_cast<double>(block_matmul_params(m)) + attention_flops_per_layer(m, seq_len);
  return static_cast<double>(depth) * per_layer + (with_head ? 2.0 * static_cast<double>(m.hidden * m.vocab) : 0.0);
}

double train_flops_per_token(const ModelShape& m, int64_t depth, int64_t seq_len) {
  return 3.0 * forward_flops_per_token(m, depth, seq_len, true);
}

double logit_bytes_per_token(const DistillConfig& d, int64_t vocab, int64_t tokens_per_micro_batch, int64_t header_bytes,
                             int64_t teacher_hidden) {
  const double value = float_dtype_bytes(d.channel_dtype);
  double per_token = 0;
  if (d.logits == TeacherOutput::kTopk) {
    per_token = static_cast<double>(d.topk) * (value + 4) + (d.tail == TopkTail::kBucket ? value : 0);
  } else if (d.logits == TeacherOutput::kHidden) {
    per_token = static_cast<double>(teacher_hidden) * value;
  } else {
    per_token = static_cast<double>(vocab) * value;
  }
  return per_token + static_cast<double>(header_bytes) / static_cast<double>(std::max<int64_t>(1, tokens_per_micro_batch));
}

double student_teacher_head_flops_per_token(const DistillConfig& d, const ModelShape& teacher) {
  return d.logits == TeacherOutput::kHidden ? 2.0 * static_cast<double>(teacher.hidden * teacher.vocab) : 0.0;
}

ClusterSpec cluster_preset(const std::string& name) {
  ClusterSpec c;
  c.name = lower(name);
  if (c.name == "h200") return c;  // the defaults
  if (c.name == "h100") {
    c.memory = 80e9;
    return c;
  }
  if (c.name == "a100") {
    c.flops = 312e12;
    c.memory = 80e9;
    c.intra_bw = 300e9;
    c.inter_bw = 25e9;
    return c;
  }
  throw InputError("--cluster " + name + ": unknown preset (h200, h100, a100; or give the numbers)");
}

namespace {

// Where each rank of a layout sits, by the trainer's own rule (dist/rank_layout.h). Only positions
// matter here (the plan splits the layers itself), so `layers` is raised to P rather than refused.
RankLayout plan_rank_layout(int64_t layers, int64_t T, int64_t P, int64_t S, RankOrder order) {
  ParallelConfig p;
  p.teacher_pipelines = T;
  p.teacher_stages = P;
  p.students = S;
  p.rank_order = order;
  return make_rank_layout(p, static_cast<int>(T * P + S), static_cast<int>(std::max(layers, P)));
}

}  // namespace

bool layout_offered(const ClusterSpec& c, int64_t T, int64_t P, int64_t S, RankOrder order) {
  const int64_t gpn = c.gpus_per_node;
  const bool several_nodes = c.devices() > gpn && c.shared_cores == 0;
  const bool roles_offered = !several_nodes || (T * P) % gpn == 0;
  if (order == RankOrder::kRoles) return roles_offered;
  if (!several_nodes || (T == 1 && roles_offered)) return false;
  const RankLayout l = plan_rank_layout(P, T, P, S, order);
  for (int t = 0; t < T; ++t) {
    const std::vector<int> channel = l.group_ranks(GroupKind::kLogitChannel, t);
    for (int r : channel)
      if (node_of(r, gpn) != node_of(channel.front(), gpn)) return false;
  }
  return true;
}

namespace {

// FLOP/s of one teacher or student rank: a device's, or a share of the pool's threads when ranks
// share cores.
double rank_flops(const ClusterSpec& c, double mfu) {
  const double threads = c.shared_cores > 0 ? static_cast<double>(c.threads_per_rank) : 1.0;
  return c.flops * mfu * threads;
}

// Bandwidth between two ranks: inside a node or between nodes.
double link_bw(const ClusterSpec& c, int64_t a, int64_t b) {
  return node_of(a, c.gpus_per_node) == node_of(b, c.gpus_per_node) ? c.intra_bw : c.inter_bw;
}

// Teacher stages of every pipeline: compute, activations to the next stage, and for the last stage
// the logits to its students; sends overlap compute (streaming micro-batches). Students step
// together, so the pipeline with the slowest links sets the pace of all. Fills the teacher and
// channel rates of `e` (its T, P and S given).
void estimate_teacher_supply(const PlanInput& in, const ClusterSpec& c, const RankLayout& ranks, LayoutEstimate& e) {
  const int64_t T = e.T, P = e.P, S = e.S;
  const double teacher_rate = rank_flops(c, c.teacher_mfu);
  const int64_t tokens_per_mb = in.micro_batch * in.seq_len;
  e.channel_bytes_per_token =
      logit_bytes_per_token(in.distill, in.teacher.vocab, tokens_per_mb, in.header_bytes, in.teacher.hidden);
  const bool teacher_head = in.distill.logits != TeacherOutput::kHidden;  // the hidden channel's last stage has none
  const auto layers = stage_layers(in, P);
  const double act_bytes = static_cast<double>(in.teacher.hidden) * float_dtype_bytes(in.activation_dtype);
  double slowest = 0;
  double channel_send_s = 0;
  double receive_bw = c.intra_bw;  // the slowest student's link to its teacher's last stage
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p < P; ++p) {
      const bool last = p == P - 1;
      const double flops = forward_flops_per_token(in.teacher, layers[static_cast<size_t>(p)], in.seq_len, last && teacher_head);
      double time = flops / teacher_rate;
      if (!last) {
        time = std::max(time, act_bytes / link_bw(c, ranks.teacher_rank(t, p), ranks.teacher_rank(t, p + 1)));
      } else {
        // The last stage sends each student its micro-batches: per token of the pipeline, b bytes, over
        // the slowest link to any of its students.
        const std::vector<int> channel = ranks.group_ranks(GroupKind::kLogitChannel, t);
        double bw = c.intra_bw;
        for (size_t i = 1; i < channel.size(); ++i) bw = std::min(bw, link_bw(c, channel.front(), channel[i]));
        channel_send_s = std::max(channel_send_s, e.channel_bytes_per_token / bw);
        receive_bw = std::min(receive_bw, bw);
      }
      slowest = std::max(slowest, time);
    }
  }
  e.teacher_stage_s_per_token = slowest;
  if (in.total_tokens > 0) {
    const double n = std::max(1.0, in.total_tokens / static_cast<double>(T * tokens_per_mb));  // per pipeline
    e.pipeline_efficiency = n / (n + static_cast<double>(P) - 1);
  }
  e.teacher_tokens_per_s = static_cast<double>(T) * e.pipeline_efficiency / slowest;
  // Channel: T senders, and S receivers each at its own link.
  e.channel_tokens_per_s = std::min(static_cast<double>(T) / channel_send_s,
                                    static_cast<double>(S) * receive_bw / e.channel_bytes_per_token);
}

// Seconds a student step at `depth` spends syncing gradients, not overlapped: the ring all-reduce
// (2·(S−1)/S of the fp32 gradients over the slowest student link, `student_bw`); under full
// sharding every micro-batch's reduce-scatter and block gathers instead.
double student_sync_s(const PlanInput& in, int64_t S, int64_t depth, double student_bw, double tokens_per_student_step) {
  if (S <= 1) return 0;
  ModelShape st = in.student;
  st.layers = depth;
  const double grads = 4.0 * static_cast<double>(total_params(st));
  const double ring = static_cast<double>(S - 1) / static_cast<double>(S) / student_bw;
  if (in.sharding != Sharding::kFull) return 2.0 * ring * grads;  // none / grad_op: all-reduce = reduce-scatter + all-gather
  // Every micro-batch: its gradients reduce-scattered, and each block gathered for the forward and
  // again for the recomputed backward; after the update only the ends are gathered.
  const double blocks = 4.0 * static_cast<double>(depth * block_params(st));
  const double micro = tokens_per_student_step / static_cast<double>(in.micro_batch * in.seq_len);
  return ring * (micro * grads + 2.0 * micro * blocks + (grads - blocks));
}

// Students per curriculum stage: compute per token plus the gradient sync once per step; each
// stage's job rate is the least of teacher supply, student demand and (shared cores) the pool.
// Fills the student and job rates, the curriculum means and the bottleneck of `e` (its teacher
// side estimated).
void estimate_student_demand(const PlanInput& in, const ClusterSpec& c, const RankLayout& ranks, LayoutEstimate& e) {
  const int64_t S = e.S;
  const int64_t gpn = c.gpus_per_node;
  const double student_rate = rank_flops(c, c.mfu);
  const bool teacher_head = in.distill.logits != TeacherOutput::kHidden;
  const double head_on_students = student_teacher_head_flops_per_token(in.distill, in.teacher);
  std::vector<int64_t> depths = in.stage_depths;
  std::vector<double> weights = in.stage_tokens;
  if (depths.empty()) {
    depths = {in.student.layers};
    weights = {1.0};
  }
  // The ring all-reduce runs at its slowest hop: inter_bw once the students span nodes.
  const std::vector<int> student_ranks = ranks.group_ranks(GroupKind::kStudents);
  const bool students_on_one_node = std::all_of(student_ranks.begin(), student_ranks.end(), [&](int r) {
    return node_of(r, gpn) == node_of(student_ranks.front(), gpn);
  });
  const double student_bw = students_on_one_node ? c.intra_bw : c.inter_bw;
  const double tokens_per_student_step =
      in.global_batch > 0 ? static_cast<double>(in.global_batch * in.seq_len) / static_cast<double>(S)
                          : static_cast<double>(in.micro_batch * in.grad_accum * in.seq_len);
  double total_time = 0, total_weight = 0, supply_time = 0, demand_time = 0;
  double worst_stage_time = -1;
  const double supply = std::min(e.teacher_tokens_per_s, e.channel_tokens_per_s);
  for (size_t k = 0; k < depths.size(); ++k) {
    const double sync = student_sync_s(in, S, depths[k], student_bw, tokens_per_student_step);
    const double step =
        tokens_per_student_step * (train_flops_per_token(in.student, depths[k], in.seq_len) + head_on_students) / student_rate +
        sync;
    const double students = static_cast<double>(S) * tokens_per_student_step / step;
    double pool = INFINITY;
    if (c.shared_cores > 0) {
      // One pool of cores: every token costs a teacher forward and a student step in core-seconds.
      const double core_s = forward_flops_per_token(in.teacher, in.teacher.layers, in.seq_len, teacher_head) /
                                (c.flops * c.teacher_mfu) +
                            (train_flops_per_token(in.student, depths[k], in.seq_len) + head_on_students) / (c.flops * c.mfu);
      pool = static_cast<double>(c.shared_cores) / core_s;
    }
    const double job = std::min({supply, students, pool});
    e.student_tokens_per_s.push_back(students);
    e.job_tokens_per_s.push_back(job);
    const double w = k < weights.size() ? weights[k] : 1.0;
    total_time += w / job;
    total_weight += w;
    supply_time += w / supply;
    demand_time += w / students;
    if (w / job > worst_stage_time) {
      worst_stage_time = w / job;
      if (pool < std::min(supply, students)) e.bottleneck = "cores";
      else if (students <= supply) e.bottleneck = "students";
      else e.bottleneck = e.teacher_tokens_per_s <= e.channel_tokens_per_s ? "teacher" : "channel";
    }
  }
  e.mean_tokens_per_s = total_weight / total_time;
  e.supply_over_demand = demand_time / supply_time;  // (tokens/s supplied) / (tokens/s demanded)
}

// Memory: the largest stage and a student at full depth (plan/memory_model.h), against 90% of a
// device's.
void estimate_memory(const PlanInput& in, const ClusterSpec& c, LayoutEstimate& e) {
  e.teacher_stage_bytes = largest_teacher_stage(in, e.P).total();
  e.student_bytes = student_memory(student_memory_input(with_students(in, e.S))).total();
  const double budget = 0.9 * c.memory;
  e.fits_memory = e.teacher_stage_bytes <= budget && e.student_bytes <= budget;
  e.memory_note = "teacher stage " + gib(e.teacher_stage_bytes) + " GiB, student " + gib(e.student_bytes) + " GiB (" +
                  sharding_text(in.sharding, e.S) + ") of " + gib(c.memory) + " GiB";
}

}  // namespace

LayoutEstimate estimate_layout(const PlanInput& in, const ClusterSpec& c, int64_t T, int64_t P, int64_t S,
                               RankOrder order) {
  LayoutEstimate e;
  e.T = T;
  e.P = P;
  e.S = S;
  e.order = order;
  e.devices = T * P + S;
  const RankLayout ranks = plan_rank_layout(in.teacher.layers, T, P, S, order);
  estimate_teacher_supply(in, c, ranks, e);
  estimate_student_demand(in, c, ranks, e);
  estimate_memory(in, c, e);
  return e;
}

std::vector<LayoutEstimate> rank_layouts(const PlanInput& in, const ClusterSpec& c) {
  std::vector<LayoutEstimate> out;
  const int64_t G = c.devices();
  for (int64_t T = 1; T < G; ++T) {
    for (int64_t P = 1; P <= in.teacher.layers && T * P < G; ++P) {
      for (int64_t S = T; T * P + S <= G; S += T) {
        for (RankOrder order : {RankOrder::kRoles, RankOrder::kPipelines}) {
          if (!layout_offered(c, T, P, S, order)) continue;
          LayoutEstimate e = estimate_layout(in, c, T, P, S, order);
          if (e.fits_memory) out.push_back(std::move(e));
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LayoutEstimate& a, const LayoutEstimate& b) {
    // Within 0.5% a layout is as fast: prefer fewer devices, then shorter pipelines.
    const double hi = std::max(a.mean_tokens_per_s, b.mean_tokens_per_s);
    if (std::abs(a.mean_tokens_per_s - b.mean_tokens_per_s) > 0.005 * hi) return a.mean_tokens_per_s > b.mean_tokens_per_s;
    if (a.devices != b.devices) return a.devices < b.devices;
    return a.P < b.P;
  });
  return out;
}

std::string describe_plan(const PlanInput& in, const ClusterSpec& c, const std::vector<LayoutEstimate>& ranked,
                          size_t show) {
  std::ostringstream o;
  const ModelShape& t = in.teacher;
  const ModelShape& s = in.student;
  o << "deepen plan\n"
    << "  teacher " << t.name << ": " << t.layers << " layers, hidden " << t.hidden << ", "
    << si(static_cast<double>(total_params(t)), "params") << "\n"
    << "  student: " << s.layers << " layers, hidden " << s.hidden << ", " << si(static_cast<double>(total_params(s)), "params")
    << " at full depth\n"
    << "  batch: seq " << in.seq_len << " x micro-batch " << in.micro_batch << " x accum " << in.grad_accum
    << " per student per step; curriculum depths";
  for (int64_t d : in.stage_depths) o << " " << d;
  o << "\n  cluster " << c.name << ": " << c.nodes << " node(s) x " << c.gpus_per_node << " devices, "
    << si(c.flops, "FLOP/s") << " peak, MFU " << fmt("%.2f", c.mfu) << " (students) / " << fmt("%.2f", c.teacher_mfu)
    << " (teacher), links " << si(c.intra_bw, "B/s") << " in a node, " << si(c.inter_bw, "B/s") << " between nodes, "
    << si(c.memory, "B") << " memory";
  if (c.shared_cores > 0) o << "; ranks share " << c.shared_cores << " cores, " << c.threads_per_rank << " thread(s) each";
  o << "\n\nPer token\n";
  const double tf = forward_flops_per_token(t, t.layers, in.seq_len, true);
  const double t_one = c.flops * c.teacher_mfu * (c.shared_cores > 0 ? c.threads_per_rank : 1);
  o << "  teacher forward: " << si(tf, "FLOP") << " (head " << si(2.0 * t.hidden * t.vocab, "FLOP") << ", attention "
    << si(t.layers * attention_flops_per_layer(t, in.seq_len), "FLOP") << "); one device at "
    << si(t_one, "FLOP/s") << " -> " << si(t_one / tf, "tokens/s") << " for the whole teacher\n";
  const double s_one = c.flops * c.mfu * (c.shared_cores > 0 ? c.threads_per_rank : 1);
  std::vector<int64_t> depths = in.stage_depths.empty() ? std::vector<int64_t>{s.layers} : in.stage_depths;
  for (int64_t d : {depths.front(), depths.back()}) {
    const double sf = train_flops_per_token(s, d, in.seq_len);
    o << "  student train at depth " << d << ": " << si(sf, "FLOP") << " (head " << si(6.0 * s.hidden * s.vocab, "FLOP")
      << "); one device at " << si(s_one, "FLOP/s") << " -> " << si(s_one / sf, "tokens/s") << "\n";
    if (depths.size() == 1) break;
  }
  DistillConfig full = in.distill, topk = in.distill, hidden = in.distill;
  full.logits = TeacherOutput::kFull;
  topk.logits = TeacherOutput::kTopk;
  hidden.logits = TeacherOutput::kHidden;
  const int64_t mb_tokens = in.micro_batch * in.seq_len;
  o << "  logit channel: full " << float_dtype_name(in.distill.channel_dtype) << " " << si(logit_bytes_per_token(full, t.vocab, mb_tokens, in.header_bytes), "B")
    << ", top-" << topk.topk << " " << si(logit_bytes_per_token(topk, t.vocab, mb_tokens, in.header_bytes), "B")
    << ", hidden " << si(logit_bytes_per_token(hidden, t.vocab, mb_tokens, in.header_bytes, t.hidden), "B")
    << " (configured: " << in.distill.logits << "); over " << si(c.inter_bw, "B/s") << ": "
    << si(c.inter_bw / logit_bytes_per_token(full, t.vocab, mb_tokens, in.header_bytes), "tokens/s") << " full, "
    << si(c.inter_bw / logit_bytes_per_token(topk, t.vocab, mb_tokens, in.header_bytes), "tokens/s") << " top-k per link\n";
  const double ratio_full = (t_one / tf) / (s_one / train_flops_per_token(s, depths.back(), in.seq_len));
  o << "  balance: one teacher device feeds " << fmt("%.2f", ratio_full) << " student devices at full depth";
  if (depths.size() > 1)
    o << ", " << fmt("%.2f", (t_one / tf) / (s_one / train_flops_per_token(s, depths.front(), in.seq_len)))
      << " at depth " << depths.front();
  o << " (compute only)\n\n";
  describe_memory(o, in, c, ranked.empty() ? in.students : ranked.front().S,
                  ranked.empty() ? in.teacher_stages : ranked.front().P);
  o << "\n";

  if (ranked.empty()) {
    o << "No feasible layout on this cluster at micro_batch " << in.micro_batch
      << " (memory, see above, or node placement); add devices or memory, or take the micro-batch named above.\n";
    return o.str();
  }
  o << "Layouts, best first (tokens/s of the whole job; curriculum mean weights each stage by its tokens;\n"
    << "order = parallel.rank_order: roles = teachers and students on separate nodes, pipelines = each\n"
    << "pipeline on the node of its students, the logits inside the node, the gradient all-reduce across)\n"
    << "student GiB = a student rank's peak under parallel.sharding = \"" << in.sharding << "\""
    << (in.sharding == Sharding::kGradOp  ? " (AdamW moments split over the layout's S)"
        : in.sharding == Sharding::kFull ? " (AdamW moments and the blocks' weights split over the layout's S)"
                                : "")
    << "\n"
    << "   T   P    S  dev  order     | teacher  channel | students (first..last stage) | job mean | supply/demand | student GiB | bound\n";
  for (size_t i = 0; i < std::min(show, ranked.size()); ++i) {
    const auto& e = ranked[i];
    char line[256];
    std::snprintf(line, sizeof line, "  %2lld  %2lld  %3lld  %3lld  %-9s | %8s %8s | %12s .. %-12s | %8s | %13.2f | %11s | %s\n",
                  static_cast<long long>(e.T), static_cast<long long>(e.P), static_cast<long long>(e.S),
                  static_cast<long long>(e.devices), option_name(e.order), si(e.teacher_tokens_per_s, "").c_str(),
                  si(e.channel_tokens_per_s, "").c_str(), si(e.student_tokens_per_s.front(), "").c_str(),
                  si(e.student_tokens_per_s.back(), "").c_str(), si(e.mean_tokens_per_s, "").c_str(),
                  e.supply_over_demand, gib(e.student_bytes).c_str(), e.bottleneck.c_str());
    o << line;
  }
  const auto& best = ranked.front();
  o << "\nRecommendation: T=" << best.T << " teacher pipeline(s) x P=" << best.P << " stage(s) + S=" << best.S
    << " students = " << best.devices << " devices\n"
    << "  teacher supply " << si(std::min(best.teacher_tokens_per_s, best.channel_tokens_per_s), "tokens/s")
    << " (slowest stage " << fmt("%.3g", best.teacher_stage_s_per_token * 1e6) << " us/token, pipeline efficiency "
    << fmt("%.2f", best.pipeline_efficiency) << "), student demand at full depth "
    << si(best.student_tokens_per_s.back(), "tokens/s") << ", job " << si(best.mean_tokens_per_s, "tokens/s")
    << " over the curriculum (" << si(best.mean_tokens_per_s / static_cast<double>(best.devices), "tokens/s")
    << " per device); bound by " << best.bottleneck << "; " << best.memory_note << "\n"
    << "  [parallel] teacher_pipelines = " << best.T << ", teacher_stages = " << best.P << ", students = " << best.S;
  if (in.sharding != Sharding::kNone) o << ", sharding = \"" << in.sharding << "\"";
  o << ", rank_order = \"" << option_name(best.order) << "\"";
  if (best.order == RankOrder::kPipelines)
    o << " (tasks per node a multiple of " << best.P + best.S / best.T << " = " << best.P << " stage(s) + "
      << best.S / best.T << " student(s) per pipeline)";
  o << "\n";
  // When students idle (supply far below demand), fewer devices may do nearly as well: name the
  // layout with the most tokens/s per device too.
  const auto thrifty = std::max_element(ranked.begin(), ranked.end(), [](const LayoutEstimate& a, const LayoutEstimate& b) {
    return a.mean_tokens_per_s / static_cast<double>(a.devices) < b.mean_tokens_per_s / static_cast<double>(b.devices);
  });
  if (thrifty->T != best.T || thrifty->P != best.P || thrifty->S != best.S || thrifty->order != best.order)
    o << "  most tokens/s per device: T=" << thrifty->T << " P=" << thrifty->P << " S=" << thrifty->S
      << " rank_order " << option_name(thrifty->order) << " ("
      << thrifty->devices << " devices, " << si(thrifty->mean_tokens_per_s, "tokens/s") << ", "
      << si(thrifty->mean_tokens_per_s / static_cast<double>(thrifty->devices), "tokens/s") << " per device)\n";
  return o.str();
}

int64_t micro_batch_tokens(const PlanInput& in) { return in.micro_batch * in.seq_len; }

TeacherStageMemory planned_teacher_stage(const PlanInput& in, int64_t P) { return largest_teacher_stage(in, P); }

PlanInput plan_input_from_config(const Config& cfg) {
  PlanInput in;
  const std::string& ckpt = cfg.teacher.checkpoint;
  const fs::path json = fs::path(ckpt) / "config.json";
  if (!ckpt.empty() && fs::exists(json)) {
    in.teacher = shape_from_qwen3_json(json.string());
  } else if (auto known = known_qwen3_shape(ckpt)) {
    in.teacher = *known;
  } else {
    throw InputError(cfg.source + ": teacher.checkpoint: \"" + ckpt +
                     "\" has no config.json and is not a known Qwen3 name (qwen3-0.6b, -1.7b, -4b, -8b, -14b)");
  }
  const int64_t vocab = cfg.student.vocab_size > 0 ? cfg.student.vocab_size : in.teacher.vocab;
  in.student = shape_from_student(cfg.student, vocab);
  // Documents are right-padded to the longest in the micro-batch: max_len is the worst case.
  in.seq_len = cfg.data.packing == Packing::kDocuments ? cfg.data.max_len : cfg.data.seq_len;
  in.micro_batch = cfg.parallel.micro_batch;
  in.precision = cfg.student.precision;
  in.recompute = cfg.student.recompute;
  in.frozen_embedding = cfg.student.init == StudentInit::kTeacher;
  in.teacher_dtype = cfg.teacher.dtype;
  in.max_in_flight = cfg.parallel.max_in_flight;
  in.students = cfg.parallel.students;
  in.teacher_stages = cfg.parallel.teacher_stages;
  in.sharding = cfg.parallel.sharding;
  in.bucket_cap_mb = cfg.parallel.bucket_cap_mb;
  in.cpu = cfg.run.device == RunDevice::kCpu;
  in.cpu_loss_fused = cfg.student.cpu_kernels != CpuKernels::kAten;
  in.grad_accum = cfg.parallel.grad_accum;
  in.global_batch = cfg.parallel.global_batch;
  in.distill = cfg.distill;
  in.activation_dtype = cfg.parallel.activation_dtype;
  in.stage_depths = stage_depths(cfg.curriculum);
  const auto& cur = cfg.curriculum;
  for (size_t k = 0; k < cur.stages.size(); ++k) {
    if (!cur.stage_tokens.empty()) in.stage_tokens.push_back(static_cast<double>(parse_count(cur.stage_tokens[k])));
    else if (!cur.stage_steps.empty()) in.stage_tokens.push_back(static_cast<double>(cur.stage_steps[k]));
    else in.stage_tokens.push_back(1.0);  // a matched budget: one stage
  }
  const double tokens_per_step =
      static_cast<double>(cfg.parallel.students * cfg.parallel.micro_batch * cfg.parallel.grad_accum * cfg.data.seq_len);
  for (size_t k = 0; k < cur.stages.size(); ++k) {
    if (!cur.stage_tokens.empty()) in.total_tokens += in.stage_tokens[k];
    else if (!cur.stage_steps.empty()) in.total_tokens += in.stage_tokens[k] * tokens_per_step;
  }
  return in;
}

std::map<int64_t, double> measured_tokens_per_s(const std::string& run_dir, int64_t warmup) {
  const fs::path path = RunFolder(run_dir).metrics_jsonl();
  if (!fs::is_regular_file(path)) throw InputError(path.string() + ": cannot read (a run folder with metrics?)");
  std::map<int64_t, std::vector<double>> by_depth;
  std::map<int64_t, int64_t> seen;  // steps seen per stage
  for (const nlohmann::json& j : read_jsonl(path.string())) {  // a torn last line is dropped there
    const int64_t stage = j.value("stage", int64_t{0});
    if (seen[stage]++ < warmup) continue;
    const double rate = j.value("tokens_per_s", 0.0);
    if (rate > 0) by_depth[j.value("depth", int64_t{0})].push_back(rate);
  }
  std::map<int64_t, double> out;
  for (auto& [depth, rates] : by_depth) {
    std::sort(rates.begin(), rates.end());
    const size_t n = rates.size();
    out[depth] = n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  }
  if (out.empty()) throw InputError(path.string() + ": no step records after warm-up");
  return out;
}

ClusterSpec calibrate_cpu(const PlanInput& in, const std::map<int64_t, double>& single, int64_t threads, int64_t cores,
                          int64_t ranks, double p2p_bw) {
  std::vector<double> per_core;
  const double teacher = forward_flops_per_token(in.teacher, in.teacher.layers, in.seq_len, true);
  for (const auto& [depth, rate] : single)
    per_core.push_back(rate * (teacher + train_flops_per_token(in.student, depth, in.seq_len)) /
                       static_cast<double>(threads));
  if (per_core.empty()) throw InputError("calibration: no measured rates");
  std::sort(per_core.begin(), per_core.end());
  ClusterSpec c;
  c.name = "cpu (calibrated)";
  c.nodes = 1;
  c.gpus_per_node = ranks;
  c.flops = per_core[per_core.size() / 2];
  c.mfu = c.teacher_mfu = 1;
  c.intra_bw = c.inter_bw = p2p_bw;
  c.memory = 1e15;
  c.shared_cores = cores;
  c.threads_per_rank = threads;
  return c;
}

std::vector<CheckRow> check_against_runs(const ClusterSpec& cluster, const std::vector<std::string>& run_dirs) {
  std::vector<CheckRow> rows;
  for (const auto& dir : run_dirs) {
    const RunFolder run(dir);
    const Config cfg = load_config(run.config_toml());
    const PlanInput in = plan_input_from_config(cfg);
    // A distributed run moves logits over its channel ("channel_bytes" > 0 in metrics.jsonl); a run
    // in one process moves none.
    bool one_process = false;
    if (const auto metrics = read_jsonl(run.metrics_jsonl()); !metrics.empty()) {
      const nlohmann::json& j = metrics.front();
      if (j.contains("channel_bytes")) one_process = j.value("channel_bytes", 0.0) == 0;
    }
    const auto& p = cfg.parallel;
    const int64_t world = one_process ? 1 : p.teacher_pipelines * p.teacher_stages + p.students;
    ClusterSpec c = cluster;
    c.gpus_per_node = world;
    const int64_t threads = cfg.run.threads > 0 ? cfg.run.threads : std::max<int64_t>(1, c.shared_cores / world);
    c.threads_per_rank = threads;
    const LayoutEstimate e = estimate_layout(in, c, p.teacher_pipelines, p.teacher_stages, one_process ? 1 : p.students,
                                             p.rank_order);
    for (const auto& [depth, measured] : measured_tokens_per_s(dir)) {
      CheckRow r;
      r.run = dir;
      r.depth = depth;
      r.measured = measured;
      if (one_process) {
        // Teacher forward, then the student step, on the same cores.
        r.layout = "one process";
        const double flops = forward_flops_per_token(in.teacher, in.teacher.layers, in.seq_len, true) / c.teacher_mfu +
                             train_flops_per_token(in.student, depth, in.seq_len) / c.mfu;
        r.predicted = c.flops * static_cast<double>(threads) / flops;
      } else {
        r.layout = layout_label(p) + " (" + std::to_string(world) + " ranks)";
        const auto it = std::find(in.stage_depths.begin(), in.stage_depths.end(), depth);
        const size_t k = it == in.stage_depths.end() ? e.job_tokens_per_s.size() - 1 : static_cast<size_t>(it - in.stage_depths.begin());
        r.predicted = e.job_tokens_per_s[k];
      }
      rows.push_back(r);
    }
  }
  return rows;
}

std::string describe_check(const std::vector<CheckRow>& rows) {
  std::ostringstream o;
  o << "Cost model vs measured runs (tokens/s, median after warm-up)\n"
    << "  layout               depth   predicted    measured   error  run\n";
  double sum = 0, worst = 0;
  for (const auto& r : rows) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-20s %5lld %11.0f %11.0f %+6.1f%%  %s\n", r.layout.c_str(),
                  static_cast<long long>(r.depth), r.predicted, r.measured, 100 * r.error(), r.run.c_str());
    o << line;
    sum += std::abs(r.error());
    worst = std::max(worst, std::abs(r.error()));
  }
  if (std::ifstream load("/proc/loadavg"); load) {
    double one = 0;
    load >> one;
    o << "  load average now " << fmt("%.1f", one) << " on " << std::thread::hardware_concurrency()
      << " cores: other processes' load shows up as model error\n";
  }
  if (!rows.empty())
    o << "  mean |error| " << fmt("%.1f", 100 * sum / static_cast<double>(rows.size())) << "%, worst "
      << fmt("%.1f", 100 * worst) << "% (goal: <= 20%)\n";
  return o.str();
}

}  // namespace deepen
