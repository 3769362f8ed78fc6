// The GEMMs of one distillation step, listed from the model shapes: what the step's GEMM bound times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"
#include "plan/cost_model.h"

namespace deepen::bench {

// One step: the teacher's forward (no gradient), the student's forward and backward over `tokens`
// (batch·seq) rows, the loss over the full vocabulary, AdamW over the student's parameters.
struct StepShape {
  ModelShape teacher;  // its `layers` are the layers the step runs (teacher.vocab: its head)
  ModelShape student;  // its `layers`: the student's depth at the step; `tied` as trained
  FloatDtype teacher_dtype = FloatDtype::kFp32;  // the dtype its GEMMs run in (teacher.dtype)
  FloatDtype student_dtype = FloatDtype::kFp32;
  int64_t batch = 1;
  int64_t seq = 1;
  int64_t tokens() const { return batch * seq; }
};

// C[m, n] = A[m, k] · B[k, n], as LibTorch's linear and its backward lay the operands out:
//   forward  y  = x · Wᵀ   m = N,   k = in,  n = out; W is stored [out, in]: B transposed
//   dX       dx = dy · W   m = N,   k = out, n = in;  plain
//   dW       dW = dyᵀ · x  m = out, k = N,   n = in;  dy is stored [N, out]: A transposed
// so that a GEMM timed at these layouts costs what the step's does, not a friendlier copy.
struct Gemm {
  std::string name;  // "student layer gate dW"
  std::string part;  // the breakdown it is summed into: "teacher layers", "teacher head", "student layers forward",
                     // "student layers backward", "student head forward", "student head backward"
  int64_t m = 0, k = 0, n = 0;
  bool a_transposed = false, b_transposed = false;
  FloatDtype dtype = FloatDtype::kFp32;
  int64_t count = 1;  // how many per step (one per layer)
  bool tokens_in_k = false;  // dW: N is the reduced dimension k, not the rows m
  // 2·m·k·n per GEMM, times count.
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) * static_cast<double>(count); }
};

// Every GEMM of the step at the full N = tokens (not in the loss's row chunks: chunking splits the
// same FLOPs). Per layer: the projections q, k, v, o, gate, up, down; the teacher runs them forward,
// the student forward, dX and dW. The head: teacher forward [N, Ht]·[Ht, V]; student forward, dX
// [N, V]·[V, H] and dW [V, N]·[N, H]. Not listed (not in the bound, see attention_flops and
// loss_elements): attention's batched products (SDPA), element-wise ops, the embedding's gather and
// its gradient's scatter.
// Worked example, bench/kd_step_bench's shapes (teacher 4 × 256, student 3 × 256, heads 4/2 × 64,
// intermediate 768, V = 151,936, N = 4 × 256 = 1,024):
//   projections per layer: 256·(256 + 128 + 128) + 256·256 + 3·256·768 = 786,432 weights,
//     forward 2·1,024·786,432 = 1.61 GFLOP per layer
//   teacher: 4 layers forward 6.44 GFLOP + head 2·1,024·256·151,936 = 79.66 GFLOP
//   student: 3 layers × 3 (forward, dX, dW) × 1.61 = 14.50 GFLOP + head 3 × 79.66 = 238.97 GFLOP
//   total 339.57 GFLOP, of which the four head GEMMs are 318.63 (94%)
std::vector<Gemm> step_gemms(const StepShape& s);

// AdamW's memory pass over the student's parameters: read p, g, m, v and write p, m, v, 4 bytes each
// in fp32 = 28 bytes per parameter. Example: the kd bench's untied student, 80,152,704 parameters
// (2 · 151,936 · 256 embedding and head + 3 · 787,072 blocks + 256 final norm): 2.24 GB.
int64_t student_parameters(const StepShape& s);
inline double adamw_bytes(int64_t parameters) { return 28.0 * static_cast<double>(parameters); }

// Not in the bound, stated beside it: attention's scores and weighted sum under the causal mask
// (plan/cost_model.h's count: 4·heads·head_dim·(seq + 1)/2 FLOP per token per layer), the teacher's
// forward once and the student's forward + backward (3×). kd bench: teacher 4 · 4 · 256 · 128.5
// · 1,024 = 0.54 GFLOP, student 3 · 3 · 0.13 = 1.21 GFLOP.
double attention_flops(const StepShape& s);
// The logits one side of the loss holds per pass over them (N · V): each element-wise pass (exp,
// log, max, the softmax difference) touches this many values, a few FLOP each.
inline double loss_elements(const StepShape& s) { return static_cast<double>(s.tokens()) * static_cast<double>(s.student.vocab); }

}  // namespace deepen::bench
