// Start-up checks: what a training job checks in its run folders and data before it writes anything
// there or loads anything heavy, so a job that fails them leaves no trace in run.out_dir.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "launch/job_plan.h"
#include "run_folder/run_folder_lock.h"
#include "run_folder/verified_shards.h"
#include "train/batch_source.h"

namespace deepen {

class Communicator;
class TeacherCache;

// What the checks found for one run: where it resumes, and the shards they verified.
struct StartupChecks {
  int64_t steps_done = 0;         // 0: a fresh start
  std::string resume_checkpoint;  // the checkpoint folder it resumes from; empty for a fresh start
  std::vector<ShardStamp> shards;
  std::unique_ptr<BatchSource> batches;  // the data, opened (single process: the job's own)
  std::shared_ptr<const TeacherCache> cache;  // distill.source = "cache": the cache, opened and checked
};

// In order, reading only (the caller then takes the run folder's lock, run_folder_lock.h, and checks
// again if it had to wait for another job):
//   1. the resume point (run_folder/progress.h, resume_point): none with --fresh (resume = false); an
//      InputError when the folder holds an earlier run's records or checkpoints but no valid checkpoint;
//   2. that checkpoint's config against this one (check_resumable: the keys that differ);
//   3. the data: data.train and data.valid opened as the trainer opens them (missing shards, another
//      tokenizer, too little validation data);
//   4. every shard's tokens against its payload hash, once per shard per run
//      (run_folder/verified_shards.h; a line on stderr says what it cost);
//   5. with distill.source = "cache", the teacher cache (teacher_cache/cache_run_check.h: the cache is
//      this config's, holds every sequence the run reads, its files hashed once per run).
// Throws InputError naming the file and the reason.
StartupChecks check_before_start(const RunPlan& run, const Tokenizer& tokenizer, bool resume, bool print_progress);

// Once every check passed: the verified shards recorded (this is when run.out_dir first appears).
void record_startup(const RunPlan& run, const StartupChecks& checks);

// Where each run of a distributed job starts (run r = plan.runs[r]).
struct AgreedStart {
  std::vector<int64_t> steps_done;
  std::vector<std::string> resume_checkpoint;  // empty for a fresh start
  // A run of a group that has nothing left to do in this job: "" (it trains), "finished" (final/ is
  // written), or the sentence saying it diverged and is not rerun with the same LR (its students
  // leave at once with exit code 4; the other runs go on).
  std::vector<std::string> ended;
  // On each run's student 0: the run folder's lock (run_folder/run_folder_lock.h), held while this
  // lives; null elsewhere.
  std::vector<std::shared_ptr<RunFolderLock>> locks;
};

// Why a run of a shared teacher's group does not train in this job, or "" when it does: it finished,
// or the divergence guard stopped it (run_folder/guard_events.h) and its LR scale is the one it
// diverged with (guard.lr_scale x its rollbacks'), so it would diverge the same way again.
std::string run_ended(const Config& cfg);

// A distributed job: each run's student 0 runs its run's checks, then takes its run folder's lock
// (waiting up to control.watchdog_s for another job's rank to end), every rank learns every verdict
// (one broadcast per run), and only when all passed do they record them; so all ranks go on from the
// same resume points or all throw the same InputError (ExitError(kExitFailure) when a record cannot
// be written), before any communicator but the world exists and before anything else is written.
AgreedStart agree_on_startup(Communicator& world, const JobPlan& plan, const Tokenizer& tokenizer, bool resume,
                             bool print_progress);

}  // namespace deepen
