// Memory model: the bytes each rank holds, from the shapes, the precision and the recomputation.
#include "plan/memory_model.h"

#include <algorithm>

#include "config/input_error.h"
#include "train/loss_chunking.h"

namespace deepen {

PrecisionBytes precision_bytes(StudentPrecision precision) {
  switch (precision) {
    case StudentPrecision::kFp32: return {4, 0, 4, 8, 4};
    case StudentPrecision::kBf16Mixed: return {4, 2, 4, 8, 2};
    case StudentPrecision::kBf16Pure: return {2, 0, 2, 4, 2};
  }
  throw std::logic_error("precision_bytes: unknown StudentPrecision");
}

namespace {
struct BlockValues {
  double h, q, kv, I, heads;
};
BlockValues values_of(const ModelShape& m) {
  return {static_cast<double>(m.hidden), static_cast<double>(m.heads * m.head_dim),
          static_cast<double>(m.kv_heads * m.head_dim), static_cast<double>(m.intermediate), static_cast<double>(m.heads)};
}
// The MLP sub-layer's share that recompute = "mlp" drops and rebuilds: norm 2's two outputs and the
// four MLP tensors (its input stays).
double mlp_sublayer_bytes(const BlockValues& v, int b) { return (2 * v.h + 4 * v.I) * b; }
}  // namespace

double block_activation_bytes_per_token(const ModelShape& m, StudentPrecision precision, Recompute recompute,
                                        bool closed_form_norms) {
  const BlockValues v = values_of(m);
  const int b = precision_bytes(precision).activation;
  const double norm_inputs = closed_form_norms && precision == StudentPrecision::kFp32
                                 ? 4.0 * (2 + v.heads + static_cast<double>(m.kv_heads))
                                 : 4.0 * (2 * v.h + v.q + v.kv);
  const double full = (4 * v.h + 4 * v.q + 3 * v.kv + 4 * v.I) * b + norm_inputs + 4.0 * v.heads;
  if (recompute == Recompute::kNone) return full;
  const double norm2_input = closed_form_norms && precision == StudentPrecision::kFp32 ? 4.0 : 4.0 * v.h;
  if (recompute == Recompute::kMlp) return full - norm2_input - mlp_sublayer_bytes(v, b) + v.h * b;
  return v.h * b;  // Recompute::kLayer
}

int64_t largest_trainable_params(const ModelShape& m, bool frozen_embedding) {
  const int64_t block = std::max({m.hidden * m.intermediate, m.hidden * m.heads * m.head_dim, m.hidden * m.kv_heads * m.head_dim});
  const bool vocab_matrix_trains = !m.tied || !frozen_embedding;
  return vocab_matrix_trains ? std::max(block, m.vocab * m.hidden) : block;
}

StudentMemory student_memory(const StudentMemoryInput& in) {
  const PrecisionBytes pb = precision_bytes(in.precision);
  const ModelShape& m = in.student;
  const double params = static_cast<double>(total_params(m));
  const double frozen = in.frozen_embedding ? static_cast<double>(m.vocab * m.hidden) : 0.0;
  const double trainable = params - frozen;
  const double n = static_cast<double>(in.tokens);
  StudentMemory out;
  out.weights = pb.master * params;
  out.compute_copy = pb.compute_copy * params;
  out.gradients = pb.gradient * trainable;
  out.optimizer = pb.optimizer * trainable;
  const double per_block = block_activation_bytes_per_token(m, in.precision, in.recompute, in.closed_form_norms);
  double rebuilt = 0;  // one block's recomputation during its backward
  if (in.recompute == Recompute::kLayer) rebuilt = block_activation_bytes_per_token(m, in.precision, Recompute::kNone, in.closed_form_norms);
  if (in.recompute == Recompute::kMlp) rebuilt = mlp_sublayer_bytes(values_of(m), pb.activation);
  // ... and beside what it rebuilt, the MLP's backward holds the gradients of its four I-wide tensors.
  if (in.recompute != Recompute::kNone) rebuilt += 4.0 * static_cast<double>(m.intermediate) * pb.activation;
  out.activations = (static_cast<double>(m.layers) * per_block + rebuilt) * n;
  // The loss reads the hidden states and returns their gradient (2 x hidden fp32 per token), holds
  // one chunk of rows (the rows and bytes per element its own code picks, train/loss_chunking.h) and
  // makes the head's gradient in its forward: [V, H] fp32 (the fp32 accumulator, beside the bf16
  // gradient it becomes under bf16-pure), when the head trains.
  LossChunkShape shape;
  shape.fused = in.loss_fused;
  shape.full_teacher = in.full_teacher;
  shape.teacher_buffer = in.teacher_chunk;
  shape.low_precision = in.precision != StudentPrecision::kFp32;
  const int64_t bpe = loss_bytes_per_element(shape);
  const int64_t rows = loss_row_chunk(in.tokens, m.vocab, bpe, in.row_chunk, loss_chunk_budget(in.gpu));
  const bool head_trains = !m.tied || !in.frozen_embedding;
  const double head = static_cast<double>(m.vocab * m.hidden);
  out.loss = 2.0 * static_cast<double>(m.hidden) * 4.0 * n + static_cast<double>(rows * m.vocab * bpe) +
             (head_trains ? head * (4.0 + (pb.gradient == 4 ? 0.0 : pb.gradient)) : 0.0);
  out.targets = in.target_bytes_per_token * n + in.teacher_head_bytes;
  if (in.sharding == Sharding::kNone && in.students > 1) {
    // The replicated all-reduce copies each bucket's gradients into a flat buffer it reduces in and
    // copies back after the backward (train/gradient_buckets.h): at the end of the backward every
    // bucket's copy exists beside the gradients.
    out.flat_copies = out.gradients;
  }
  if (in.sharding == Sharding::kGradOp) {
    if (in.students < 1) throw InputError("parallel.students: must be >= 1 to shard over, got " + std::to_string(in.students));
    const double S = static_cast<double>(in.students);
    out.optimizer /= S;
    // The shards, the buckets and the moments are in the parameters' dtype (the masters').
    out.grad_shard = pb.master * trainable / S;
    out.param_shard = out.grad_shard;
    out.bucket = std::max(in.bucket_bytes,
                          pb.master * static_cast<double>(largest_trainable_params(m, in.frozen_embedding)));
  } else if (in.sharding == Sharding::kFull) {
    if (in.students < 1) throw InputError("parallel.students: must be >= 1 to shard over, got " + std::to_string(in.students));
    if (in.recompute != Recompute::kLayer)
      throw InputError(std::string("parallel.sharding: \"full\" needs student.recompute = \"layer\", got \"") +
                       option_name(in.recompute) + "\"");
    const double S = static_cast<double>(in.students);
    const double block = static_cast<double>(block_params(m));
    const double blocks = static_cast<double>(m.layers) * block;
    const double ends = params - blocks, trainable_ends = ends - frozen;
    // Whole: the ends and the one block being computed; the blocks otherwise as 1/S master slices.
    out.weights = pb.master * (ends + blocks / S + block);
    out.compute_copy = pb.compute_copy * (ends + block);
    // Whole gradients live only until their bucket is sent: the ends' and one block's.
    out.gradients = pb.gradient * (trainable_ends + block);
    out.optimizer /= S;
    // The step's gradient shard, plus the micro-batch's in flight beside it (accumulate_reduction).
    out.grad_shard = pb.master * trainable / S;
    out.held_shards = 2 * out.grad_shard;
    out.param_shard = 0;  // the update writes the master slices in place
    out.bucket = std::max(in.bucket_bytes,
                          pb.master * static_cast<double>(largest_trainable_params(m, in.frozen_embedding)));
  }
  return out;
}

StudentMemoryInput student_memory_input(const PlanInput& in) {
  StudentMemoryInput s;
  s.student = in.student;
  s.tokens = micro_batch_tokens(in);
  s.precision = in.precision;
  s.recompute = in.recompute;
  s.frozen_embedding = in.frozen_embedding;
  s.row_chunk = in.distill.row_chunk;
  s.gpu = !in.cpu;
  s.loss_fused = in.cpu && in.cpu_loss_fused;
  // cpu_kernels = "aten" on CPU: the op-sequence RMSNorm with its closed-form backward (what
  // bench/memory_check measures); block_activation_bytes_per_token applies it to fp32 only.
  s.closed_form_norms = in.cpu && !in.cpu_loss_fused;
  s.target_bytes_per_token =
      logit_bytes_per_token(in.distill, in.teacher.vocab, s.tokens, in.header_bytes, in.teacher.hidden);
  s.sharding = in.sharding;
  s.students = in.students;
  s.bucket_bytes = in.bucket_cap_mb * (1 << 20);  // as train/student_trainer.cpp converts it
  // The hidden-state channel: each student holds the teacher's head (bf16 or fp32, as the wire), and
  // the loss makes the teacher's logits a chunk at a time; bf16 logits it widens a chunk at a time.
  const bool hidden = in.distill.logits == TeacherOutput::kHidden, full = in.distill.logits == TeacherOutput::kFull;
  if (hidden)
    s.teacher_head_bytes = static_cast<double>(in.teacher.vocab * in.teacher.hidden) * float_dtype_bytes(in.distill.channel_dtype);
  s.full_teacher = hidden || full;
  s.teacher_chunk = hidden || (full && in.distill.channel_dtype == FloatDtype::kBf16);
  return s;
}

double parse_bytes(const std::string& text, const std::string& where) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  const std::pair<const char*, double> units[] = {{"", 1},        {"B", 1},          {"KB", 1e3},
                                                  {"MB", 1e6},    {"GB", 1e9},       {"TB", 1e12},
                                                  {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                                                  {"TiB", 1099511627776.0}};
  if (used > 0 && value > 0)
    for (const auto& [name, scale] : units)
      if (unit == name) return value * scale;
  throw InputError(where + ": expected a positive size such as 80GiB, 80GB or 8e10, got \"" + text + "\"");
}

TeacherStageMemory teacher_stage_memory(const ModelShape& t, int64_t layers, bool first, bool last, int dtype_bytes,
                                        int64_t tokens, double out_bytes_per_token, int64_t max_in_flight,
                                        bool logits_in_place) {
  const double b = dtype_bytes, n = static_cast<double>(tokens);
  double params = static_cast<double>(layers * block_params(t));
  if (first) params += static_cast<double>(t.vocab * t.hidden);
  // The last stage holds the head (a tied head is the embedding: a second copy unless it is also
  // the first stage) and the final norm.
  if (last) params += static_cast<double>(t.vocab * t.hidden * (first && t.tied ? 0 : 1) + t.hidden);
  TeacherStageMemory out;
  out.weights = b * params;
  // One layer at a time under no_grad: residual, normed input, attention output and q/k/v (about
  // 4 hidden-sized tensors with q ~ hidden), and gate, up and their product (3 intermediate-sized).
  out.working = (4.0 * static_cast<double>(t.hidden) + 3.0 * static_cast<double>(t.intermediate)) * b * n;
  if (last && !logits_in_place) out.working += static_cast<double>(t.vocab) * b * n;  // the logits before they are sent
  out.buffers = static_cast<double>(max_in_flight) * out_bytes_per_token * n;
  return out;
}

}  // namespace deepen
