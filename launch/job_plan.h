// JobPlan: what a training job decides before any heavy work, made once here and passed down.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "dist/logit_channel.h"
#include "dist/rank_layout.h"
#include "train/run_plan.h"

namespace deepen {

class Tokenizer;

// How a job runs, from the command line.
struct JobOptions {
  bool resume = true;                       // continue from the newest valid checkpoint if any
  std::optional<int64_t> stop_after_steps;  // stop with a checkpoint after this many steps
  bool print_progress = true;
  std::string group_file;                   // `deepen group FILE`: the file (the guard's advice names it)
};

// The teacher as its config.json describes it (no tensor is read for the plan).
struct TeacherPlan {
  std::string checkpoint;      // Hugging Face folder
  int64_t layers = 0;          // decoder layers the pipeline splits
  double head_layers = 0;      // the last stage's LM head in layers' worth (0 with the hidden channel)
};

// Every decision of one `deepen train` / `deepen pretrain` / `deepen group` job, so that the trainer,
// every teacher stage and the control plane work from one set of numbers (nothing below launch/
// derives them): the runs (schedule with budgets resolved, batch counts, loss options, vocabulary),
// where they compute, and for a distributed job its rank layout and what travels on the logit
// channel. Making a plan reads only small files (the teacher's config.json, a matched run's budget
// record) and writes nothing, so a plan that fails leaves no trace in any run folder.
struct JobPlan {
  std::vector<RunPlan> runs;           // one, or the runs sharing the teacher (run r = RankInfo::run)
  std::string job_dir;                 // the job's own records (teacher step times, control secret):
                                       // the run's folder, or a shared teacher's group folder
  const RunPlan& run() const { return runs.front(); }
  RunDevice device = RunDevice::kCpu;  // resolved: kCpu or kCuda
  Backend backend = Backend::kMpi;     // resolved: kMpi or kNccl (a single process: kMpi)
  std::optional<TeacherPlan> teacher;  // none: pretraining (CE only), or a run from a teacher cache
  // distill.source = "cache": the targets come from cache.dir (teacher_cache/); no teacher is loaded
  // and a distributed job has no teacher ranks (world = parallel.students).
  bool from_cache = false;
  ChannelFormat channel;               // what the teacher sends each student (in-process too)
  std::optional<RankLayout> layout;    // distributed jobs: which rank is which
};

// A single process: every data-parallel student of [parallel] played in turn (students folded into
// grad_accum: the same global batch, the same numbers). `distill` = false for pretraining.
// cuda_devices: what this process sees. Throws InputError naming the file and key.
JobPlan plan_single_process_job(const Config& cfg, bool distill, const Tokenizer& tokenizer, int cuda_devices);

// A job of `world_size` ranks laid out by [parallel] (T·P teacher stages + S students).
JobPlan plan_distributed_job(const Config& cfg, int world_size, const Tokenizer& tokenizer, int cuda_devices,
                             bool nccl_built);

// R runs sharing one teacher pass (`deepen group`): world = T·P + R·S, the teacher's settings from the
// first run, which every other run must share (study/teacher_groups.h; InputError naming the run and
// the setting otherwise), and each run in its own folder, none of them `job_dir`.
JobPlan plan_shared_teacher_job(const std::vector<Config>& runs, const std::string& job_dir, int world_size,
                                const Tokenizer& tokenizer, int cuda_devices, bool nccl_built);

// Rows of the student's embedding/head: student.vocab_size, or the tokenizer's padded size.
int64_t student_vocab_size(const Config& cfg, const Tokenizer& tokenizer);

}  // namespace deepen
