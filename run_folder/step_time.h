// Step time breakdown: where one rank's wall time between two step records went, and its record.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_folder/jsonl.h"

namespace deepen {

// One rank's step: `seconds` is the wall time since the previous step's record (or since the loop
// began), `parts` the time measured inside it by part, in the role's order. The parts are timed
// spans, not a remainder, so their sum falls short of `seconds` by what no span covers (loop
// bookkeeping); e2e.global-batch holds that gap under 5% on every rank (tests/e2e/distributed_train.py).
struct StepTime {
  int64_t step = 0;
  std::string role;  // "student" | "teacher"
  double seconds = 0;
  std::vector<std::pair<std::string, double>> parts;
  // A teacher stage's forward passes at the step (the micro-batches it computed; with a shared
  // teacher fewer than it delivered); -1 = not counted (students).
  int64_t passes = -1;
  // ... and the micro-batches it delivered (one per receiving student of every run): equal to passes
  // for one run, up to R times more when R runs share the teacher; -1 = not counted.
  int64_t deliveries = -1;
  // A teacher's last stage: the most bytes of distinct payloads its outgoing queues held at once so
  // far (the memory plan's bound: max_in_flight payloads per run it serves); -1 = not counted.
  int64_t held_bytes = -1;
  double parts_sum() const;
  // {"step": 3, "role": "student", "time_s": 0.12, "parts": {"data": 0.001, ...}}, and "passes", "deliveries" when counted
  nlohmann::json to_json() const;
};

// Parts of a student rank's step. A record is written right after the optimizer step, so what
// follows it (eval, diagnostics, checkpoint, the record itself) lands in the next step's record:
// the lines tile the run's wall time with no gap and no overlap.
//   data          reading the step's micro-batches (ids, labels)
//   teacher_wait  waiting for the teacher's targets (a channel receive, or the in-process teacher's forward)
//   compute       student forward, loss and backward
//   grad_sync     the step's token count, the gradient all-reduce and the loss sums across students
//   optimizer     clipping, AdamW, zeroing gradients
//   growth        a curriculum boundary: new blocks, broadcast, optimizer reset
//   eval, diagnostics, checkpoint, records   as named (records: metrics line, progress, control report)
// On a GPU a span ends when the host moves on, not when queued kernels finish: time queued in one
// part shows up in the next one that synchronises (the loss's .item() in compute, the norm's copy
// to the host in optimizer), so the sum stays whole while the split is approximate there.
struct StudentPart {
  enum : size_t { kData, kTeacherWait, kCompute, kGradSync, kOptimizer, kGrowth, kEval, kDiagnostics, kCheckpoint, kRecords };
};
inline const std::vector<std::string>& student_time_parts() {
  static const std::vector<std::string> kParts = {"data", "teacher_wait", "compute", "grad_sync", "optimizer",
                                                  "growth", "eval", "diagnostics", "checkpoint", "records"};
  return kParts;
}
// Parts of a teacher stage's step (all the micro-batches of one optimizer step it produces):
//   data       stage 0: building the micro-batches' ids
//   recv_wait  later stages: waiting for (and receiving) the previous stage's activations
//   compute    the stage's forward (and the head on the last stage)
//   send_wait  handing activations to the next stage or targets to the channel, waiting on full buffers
//   records    the step record and the control report
struct TeacherPart {
  enum : size_t { kData, kRecvWait, kCompute, kSendWait, kRecords };
};
inline const std::vector<std::string>& teacher_time_parts() {
  static const std::vector<std::string> kParts = {"data", "recv_wait", "compute", "send_wait", "records"};
  return kParts;
}

// Accumulates a rank's step parts with a monotonic clock. Cost: two clock reads per span
// (bench/step_time_bench measures it against the step).
class StepTimer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StepTimer(const std::vector<std::string>& parts);

  // Times `fn` into part `part` (an index into the names) and returns its result.
  template <class F>
  decltype(auto) time(size_t part, F&& fn) {
    const Span span(*this, part);
    return fn();
  }
  void add(size_t part, double seconds) { seconds_[part] += seconds; }

  // The step that just ended: wall time since the last take (or construction) and the parts; then
  // starts the next step from now.
  StepTime take(int64_t step, const std::string& role);
  // Forgets what was timed so far and starts the next step from now (before a loop's first step).
  void restart();

 private:
  struct Span {
    Span(StepTimer& t, size_t part) : timer(t), index(part), start(Clock::now()) {}
    ~Span() { timer.add(index, std::chrono::duration<double>(Clock::now() - start).count()); }
    StepTimer& timer;
    size_t index;
    Clock::time_point start;
  };
  std::vector<std::string> names_;  // a copy: the caller may pass a temporary list
  std::vector<double> seconds_;
  Clock::time_point since_;
};

// Where a rank writes its step records: <run dir>/step_time/rank<R>.jsonl. Opening it drops the
// records after `resume_after_step` (nullopt: a fresh run, all of them), so a resumed rank's file
// reads as one run; a rank of a run resumed on another layout starts its file afresh under its own
// rank number, and files of ranks the new layout lacks keep their history.
class StepTimeLog {
 public:
  StepTimeLog(const std::string& run_dir, int world_rank, std::optional<int64_t> resume_after_step);
  void append(const StepTime& t);

 private:
  static std::string prepare(const std::string& run_dir, int world_rank, std::optional<int64_t> resume_after_step);
  int world_rank_;
  JsonlWriter out_;
};

// Records of a run's step_time/ files, every rank's, in rank order then step order.
std::vector<nlohmann::json> read_step_times(const std::string& run_dir);

}  // namespace deepen
