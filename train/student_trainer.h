// The student's training loop: curriculum growth, distillation steps, eval, diagnostics, checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include "run_folder/checkpoint_store.h"
#include "train/run_plan.h"

namespace deepen {

class BatchSource;
class StudentGroup;
class TeacherSource;
class Tokenizer;

// What one step reported, for the control plane (/metrics, heartbeats) and progress lines.
struct StepReport {
  int64_t step = 0;         // the optimizer step just finished
  int64_t total_steps = 0;
  int stage = 0;
  int64_t depth = 0;
  double loss = 0, kl = 0, ce = 0, lr = 0;
  double tokens_per_s = 0;
  double channel_bytes_per_s = 0;  // logit channel (0 for an in-process teacher)
  double last_eval_ce = -1;  // -1 until the first eval
  double last_eval_kl = -1;
  double step_seconds = 0;  // wall time of the step's record (run_folder/step_time.h)
  std::vector<std::pair<std::string, double>> time_parts;  // where it went, by part
};

// The parts of a run. Single process: SoloStudentGroup and a LocalTeacher (or no teacher for
// pretraining); distributed: the same loop with dist/'s group and logit-channel teacher.
struct StudentRun {
  RunPlan plan;                          // the run's config and its resolved schedule, counts and loss
  const Tokenizer* tokenizer = nullptr;   // token classes for diagnostics
  BatchSource* batches = nullptr;
  TeacherSource* teacher = nullptr;      // nullptr: CE-only pretraining (distill.alpha ignored, 0)
  StudentGroup* group = nullptr;
  int world_rank = 0;                    // names this rank's step_time/rank<R>.jsonl
  // Where the student, its optimizer state and each micro-batch live (batches are built on the CPU,
  // where their checksums are taken, and moved here before the forward). The teacher source
  // returns its targets on this device. Checkpoints are written from CPU copies and loaded here.
  at::Device device = at::kCPU;
  // Continue from the newest valid checkpoint (run_folder/progress.h, resume_point: a folder that
  // holds an earlier run but no valid checkpoint is an InputError, not a fresh start).
  bool resume = false;
  // With resume: this checkpoint folder exactly (distributed runs: student 0 picks it for all
  // students); empty: the newest valid one.
  std::string resume_checkpoint;
  std::optional<int64_t> stop_after_steps;  // stop (checkpointing) once this many steps are done
  // Asked at the top of every step with the steps done so far; true stops the run there, with a
  // checkpoint of that state (a coordinated stop: every student returns true at the same step).
  std::function<bool(int64_t steps_done)> stop_requested;
  // A run sharing a teacher with others (distributed jobs): when the divergence guard ends this run
  // (it stops or rolls back), it leaves the job alone: this agrees with the teacher on the step the
  // run's serving stops at (returned), and the trainer takes what the teacher sent before it, so the
  // teacher and the other runs go on. Null: the run is the whole job (a single process).
  std::function<int64_t(const std::string& reason)> leave_run;
  // The group file a shared teacher's job reads ("" alone): the guard's advice names the run's entry
  // there, since a --set on the command line would reach every run of the group.
  std::string group_file;
  std::function<void(const StepReport&)> on_step;
  bool print_progress = true;            // a line per step on stderr (student 0 only)
};

enum class RunOutcome { kFinished, kStopped };

// InputError when `found` was written with another config than `cfg` (all but its execution,
// layout and [guard] settings), naming the keys that differ from the run's config.toml. The
// trainer checks it before it writes anything; a job checks it first, before anything loads.
void check_resumable(const Config& cfg, const CheckpointStore::Found& found);

// Runs (or resumes) the student to the end of its curriculum, or until stopped. Student 0 writes
// the run folder: config.toml, metrics/eval/diagnostics JSONL, checkpoints, active-layer-token
// record and, when finished, final/student.safetensors and the Hugging Face export final/hf.
// Throws InputError for bad input (data, budgets, a checkpoint from another config), ExitError for a
// run the divergence guard stopped or rolled back (kExitDiverged, kExitRollback) or whose records or
// checkpoint could not be written (kExitFailure), with the same message on every student.
RunOutcome run_student(StudentRun& run);

}  // namespace deepen
