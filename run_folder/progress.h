// Where a run stands: the progress record of a checkpoint, the state of a run folder on disk, and
// the one-line progress of a live run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "run_folder/checkpoint_store.h"

namespace deepen {

// checkpoints/step_*/progress.json: the trainer's position when the checkpoint was taken, e.g.
//   {"steps_done": 120, "tokens": 491520, "active_layer_tokens": 983040, "depth": 2,
//    "last_eval_ce": 2.31, "last_eval_kl": 0.41, "guard_window": [2.35, 2.33]}
// (-1 before the first eval / without a teacher; guard_window: the divergence guard's recent losses,
// train/divergence_guard.h, absent in checkpoints of earlier versions)
struct TrainProgress {
  int64_t steps_done = 0;
  int64_t tokens = 0;
  int64_t active_layer_tokens = 0;
  int64_t depth = 0;
  double last_eval_ce = -1, last_eval_kl = -1;
  std::vector<double> guard_window;
};

// Writes <checkpoint_dir>/progress.json; throws std::runtime_error naming the file on failure.
void write_train_progress(const std::string& checkpoint_dir, const TrainProgress& progress);
// Reads it back (InputError naming the file when it is missing a field or is not JSON).
TrainProgress read_train_progress(const std::string& checkpoint_dir);

// The checkpoint a run resumes from: the newest that verifies (CheckpointStore::latest_valid),
// nullopt when the folder holds nothing of an earlier run (a new run starts), and an InputError when
// it holds records or checkpoints but no valid checkpoint, since starting over would silently
// replace that history; `--fresh` starts over on purpose. The error names the folder and what was
// found, e.g. "runs/x: cannot resume: none of its 3 checkpoints is valid (step_00000059:
// student.safetensors: ...; ...), and it holds metrics.jsonl (60 records) and eval.jsonl (15 records); ...".
std::optional<CheckpointStore::Found> resume_point(const std::string& run_dir, int64_t keep);

// Where a run folder stands on disk: finished = active_layer_tokens.json says complete (written once
// final/ is whole) and final/ is there; diverged = the divergence guard stopped it and it has not
// trained past that step since (run_folder/guard_events.h, read_guard_stop); partial = the folder
// holds a checkpoint or an incomplete record (the trainer resumes it); new otherwise.
enum class JobState { kNew, kPartial, kFinished, kDiverged };
JobState job_state(const std::string& out_dir);
const char* to_string(JobState s);

// One line on where a run stands, from its records, e.g.
//   "step 120/300 depth 3 loss 2.3456 val CE 2.3101 812 tok/s"; "starting" before the first step.
std::string run_progress(const std::string& out_dir);

}  // namespace deepen
