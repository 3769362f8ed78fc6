// Which implementation runs each fusable step of the fp32 CPU decoder: deepen's hand-fused kernels
// (fused_kernels.h) or LibTorch's own op sequence (what transformers runs), and how "auto" picks
// the faster of the two on the machine it runs on. Torch-free: the steps are given as closures.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "config/options.h"

namespace deepen {

// student.cpu_kernels:
//   fused: always the fused kernels.
//   aten:  always LibTorch's own ops, no hand-written kernel: transformers' forward op sequence
//          (the same values, op for op), with two fp32 CPU shortcuts in the backward: RMSNorm's
//          gradient in closed form (6 passes where autograd's derivation of the forward takes ~14)
//          and RoPE's rotate_half as a roll (bit for bit transformers' values and gradients).
//   auto:  per step and shape class, whichever measured faster (once per process, see below).
// All three produce the same values up to fp32 summation order (tests/model/student_test.cpp,
// tests/model/qwen3_hf_test.cpp).
// (CpuKernels: config/options.h)

// The decoder steps that have a fused implementation, each standing in for one op subsequence:
//   kRmsNorm:   RMSNorm over the last dim (pow, mean, add, rsqrt, mul, mul; and backward)
//   kQkvRope:   q, k, v projections, per-head q/k RMSNorm, RoPE, [B, heads, T, d] layouts
//               (fused: one [q|k|v] matmul and one pass)
//   kSwiGluMlp: gate and up projections, silu(gate) * up (fused: the two matmuls, then one pass)
enum class FusedStep { kRmsNorm, kQkvRope, kSwiGluMlp };
const char* fused_step_name(FusedStep step);

// What a step's relative speed depends on: the step, its widths, the row count rounded up to a
// power of two (so 2040 and 2048 tokens share one measurement) and the intra-op thread count.
// Example: RMSNorm over hidden 256 on 8 x 255 tokens, 2 threads -> {kRmsNorm, 2048, {256}, 2}.
struct StepShape {
  FusedStep step = FusedStep::kRmsNorm;
  int64_t rows = 0;
  std::array<int64_t, 4> dims{};  // the step's widths, unused ones 0
  int64_t threads = 1;
  bool operator<(const StepShape& o) const;
};
StepShape shape_class(FusedStep step, int64_t rows, std::array<int64_t, 4> dims, int64_t threads);

// Rows to time a step on: the real count, cut so that one forward + backward stays under ~4
// GFLOP (row_flops = that step's flops per row), but never under 64 rows (per-row cost is what is
// compared, and it is flat once rows are many times the vector width and the thread count).
// Examples: SwiGLU MLP hidden 256, intermediate 768 (2.36 MFLOP/row): 2048 -> 1695;
//           RMSNorm hidden 256 (~4 KFLOP/row): 2048 -> 2048; Qwen3-8B MLP (604 MFLOP/row): -> 64.
int64_t calibration_rows(int64_t rows, double row_flops);

// Decision: the fused kernel runs only when its median time is below the op sequence's; a tie
// goes to the op sequence (the fused kernels must never be the slower choice).
// Example: fused {1.0, 0.9, 5.0} ms (median 1.0), ops {1.2, 1.1, 1.3} (median 1.2) -> true.
bool fused_is_faster(std::vector<double> fused_ms, std::vector<double> ops_ms);

// One measurement, kept for reports (bench/student_step_bench prints them).
struct StepCalibration {
  StepShape shape;
  double fused_ms = 0, ops_ms = 0;  // medians of one forward + backward at the calibration rows
  int64_t calibration_rows = 0;
  bool fused = false;
};

// The cache of "auto" decisions. One per process (process_cpu_kernel_calibration()): it records a
// property of the machine, like ATen's CPU capability, and every model in the process (student,
// teacher stages, tests' second student) should see the same choice for the same shapes, so a
// resumed or repeated run in the same process repeats the same arithmetic. Tests build their own.
//
// A run resumed in a new process must repeat them too (timings differ from process to process, and
// so would the rounding of the resumed curve): record_to() keeps the decisions in the run folder,
// one file per rank, and a resumed rank takes its recorded decisions instead of timing again.
class CpuKernelCalibration {
 public:
  // Times one forward + backward of each implementation: run_fused() / run_ops() each do one
  // (on inputs they own) and are called 1 + reps times, alternating, the first of each untimed.
  using Timed = std::function<void()>;
  // kFused -> true and kAten -> false without timing anything; kAuto -> the cached decision for
  // shape, measuring it on first use. Thread-safe; a measurement holds the lock.
  bool use_fused(CpuKernels mode, const StepShape& shape, int64_t calibration_rows, const Timed& run_fused,
                 const Timed& run_ops);
  std::vector<StepCalibration> measurements() const;
  int reps = 5;

  // From now on every new decision is written to `path` (whole, temporary file + rename, so a kill
  // leaves the previous version). With reuse, the decisions already in `path` are taken first (they
  // replace this process's for the same shapes); a missing file is an empty record. Throws
  // InputError naming the file when it is not such a record.
  void record_to(const std::string& path, bool reuse);

  // The decisions in a record's JSON text (InputError names `where`). A record:
  //   {"version":1,"decisions":[{"step":"rms_norm","rows":2048,"dims":[256,0,0,0],"threads":2,
  //    "fused":true,"fused_ms":0.21,"ops_ms":0.35,"calibration_rows":2048}]}
  static std::vector<StepCalibration> from_json(const std::string& text, const std::string& where);

 private:
  void write_record_locked() const;
  mutable std::mutex mutex_;
  std::map<StepShape, StepCalibration> cache_;
  std::string record_path_;
};

CpuKernelCalibration& process_cpu_kernel_calibration();

}  // namespace deepen
