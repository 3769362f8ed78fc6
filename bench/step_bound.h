// The step's GEMM bound, measured on this machine: its GEMMs (bench/step_gemms.h) timed with at::mm at
// their shapes, plus AdamW's bytes over a measured streaming bandwidth; what a step is compared to.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/step_gemms.h"

namespace deepen::bench {

struct BoundOptions {
  int reps = 3;  // timed calls (at least) per distinct GEMM after one warm-up call; the best counts
  // A GEMM whose operands and output together pass this many bytes is timed on fewer token rows and
  // scaled linearly to N (its time is linear in N once N is in the thousands): the paper's shapes
  // have a [16,384, 151,936] output of 10 GB, which a shared 24 GB machine cannot hold beside a run.
  int64_t max_gemm_bytes = int64_t{2} << 30;
  // Elements per buffer of the streaming pass: far past the caches (4 × 64 MB), short enough to time
  // quickly; the bandwidth it measures is then applied to AdamW's full byte count.
  int64_t stream_elements = int64_t{16} << 20;
};

struct GemmTime {
  Gemm gemm;
  int64_t timed_tokens = 0;  // the N it was timed at (= the step's N unless scaled)
  double seconds = 0;        // all `count` of them at the step's N
};

struct StepBound {
  StepShape shape;
  int threads = 0;
  std::vector<GemmTime> gemms;
  int64_t parameters = 0;     // the student's, for AdamW
  double stream_bytes_per_s = 0;
  double gemm_seconds() const;
  double gemm_flops() const;
  double adamw_seconds() const { return adamw_bytes(parameters) / stream_bytes_per_s; }
  double seconds() const { return gemm_seconds() + adamw_seconds(); }
  // Seconds by part ("teacher layers", ..., "AdamW"), in the order first seen.
  std::vector<std::pair<std::string, double>> parts() const;
};

// Times every GEMM of the step (equal shapes once) at the current at::get_num_threads(), and the
// streaming bandwidth of an AdamW-shaped pass (4 buffers read, 3 written). `parameters`: the
// student's parameter count (0: from the shapes, student_parameters).
StepBound measure_step_bound(const StepShape& shape, int64_t parameters = 0, const BoundOptions& options = {});

// The bound, GEMM by GEMM and by part, with the FLOPs left out of it (attention, the loss's element-wise
// passes), as lines a bench prints.
void print_step_bound(std::FILE* out, const StepBound& b);
// "deepen's step is 62% of the bound; step / bound = 1.61x" for a step of `step_seconds`.
void print_step_against_bound(std::FILE* out, const char* who, double step_seconds, const StepBound& b);
nlohmann::json to_json(const StepBound& b);

}  // namespace deepen::bench
