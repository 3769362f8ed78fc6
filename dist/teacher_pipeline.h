// Teacher pipeline: which micro-batches a pipeline serves, in what order, and the stage loop that
// streams them forward (activations between stages, logits to the students).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/logit_channel.h"
#include "dist/teacher_schedule.h"
#include "run_folder/step_time.h"
#include "train/run_plan.h"

namespace deepen {

class BatchSource;
class Communicator;
class TeacherStage;
struct RankLayout;

// One run the pipeline serves: its plan, where its batches come from, and the steps it still needs.
struct ServedRun {
  const RunPlan* plan = nullptr;
  // Stage 0: where the ids come from. Every stage of a shared teacher (more than one run): the
  // batches' identities, to tell which runs read the same micro-batch (BatchSource::identity).
  const BatchSource* batches = nullptr;
  int64_t first_step = 0;  // steps [first_step, end_step) are served
  int64_t end_step = 0;
};

// The forward passes pipeline `pipeline` makes for step `step`, in production order, each with the
// students (of every run) it goes to: dist/teacher_schedule.h's teacher_items over the runs. With one
// run this is train/batch_order.h's step_batches for the students it serves (see the worked example
// there); each of those students consumes its own sub-list in the same order.
std::vector<TeacherItem> pipeline_items(const std::vector<ServedRun>& runs, const RankLayout& layout, int pipeline,
                                        int64_t step);

struct TeacherStageRun {
  std::vector<ServedRun> runs;       // one, or the runs sharing this teacher (run r = RankInfo::run)
  ChannelFormat channel_format;      // last stage: what it sends (distill.logits, launch/job_plan.h)
  const RankLayout* layout = nullptr;
  int world_rank = 0;
  Communicator* pipeline = nullptr;  // this pipeline's stages (rank = stage)
  Communicator* channel = nullptr;   // last stage only: this pipeline's logit channel
  std::shared_ptr<TeacherStage> stage;
  // Asked before each step's items are produced, with the global step about to begin: for each
  // served run (index r of `runs`), its agreed stop step once decided (dist/control/agent.h,
  // stop_steps; a negative step: at the run's first step). A run stops being served there; the loop
  // ends when no run is left, and skips the steps that serve none (a run resumed later than another).
  std::function<std::vector<std::optional<int64_t>>(int64_t step)> run_stops;
  // After a step's items went out, with where the stage's time went since the previous call
  // (run_folder/step_time.h, teacher parts, and the step's forward passes); the call itself counts
  // in the next step's "records".
  std::function<void(int64_t steps_done, const StepTime& time)> on_step;
};

struct TeacherStageStats {
  int64_t steps_done = 0;     // the step the loop ended at (the last run's end_step, or an agreed stop)
  std::vector<int64_t> served_end;  // per run: the step its serving ended at (its end, or its stop)
  int64_t items = 0;          // forward passes
  int64_t deliveries = 0;     // last stage: messages sent (items × their receivers)
  int64_t channel_bytes = 0;  // last stage: bytes sent to students
  double seconds = 0;
};

// Runs one stage: stage 0 builds each item's ids with the same BatchSource the students use; every
// stage forwards and passes a header (the item and its ids checksum) + activations to the next with
// non-blocking sends, at most parallel.max_in_flight outstanding per hop, so a stage computes the
// next micro-batch while the previous one travels (no bubble once the pipeline is full); the last
// stage sends logits (or top-k) through the logit channel.
TeacherStageStats run_teacher_stage(const TeacherStageRun& run);

}  // namespace deepen
