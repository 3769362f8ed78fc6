// The start-up checks of a training job (see startup_checks.h) and their agreement across ranks.
#include "launch/startup_checks.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "data/token_shards.h"
#include "dist/communicator.h"
#include "dist/rank_layout.h"
#include "launch/job_parts.h"
#include "run_folder/guard_events.h"
#include "run_folder/progress.h"
#include "run_folder/run_folder.h"
#include "teacher_cache/cache_run_check.h"
#include "teacher_cache/teacher_cache.h"
#include "train/shard_batch_source.h"
#include "train/student_trainer.h"

namespace deepen {

StartupChecks check_before_start(const RunPlan& run, const Tokenizer& tokenizer, bool resume, bool print_progress) {
  const Config& cfg = run.cfg;
  StartupChecks checks;
  if (resume) {
    if (const auto found = resume_point(cfg.run.out_dir, cfg.checkpoint.keep)) {
      check_resumable(cfg, *found);
      checks.steps_done = found->step + 1;
      checks.resume_checkpoint = found->dir;
    }
  }
  checks.batches = make_shard_batch_source(run, tokenizer);
  std::vector<std::string> files = list_shard_files(cfg.data.train);
  for (const std::string& f : list_shard_files(cfg.data.valid)) files.push_back(f);
  const ShardVerification v = verify_shards_once(cfg.run.out_dir, files);
  checks.shards = v.stamps;
  if (print_progress && v.verified > 0)
    std::cerr << "deepen: verified " << v.verified << " of " << files.size() << " shards in full ("
              << static_cast<double>(v.verified_bytes) / 1e9 << " GB in " << v.seconds << " s; once per run)\n";
  if (cfg.distill.source == DistillSource::kCache) {
    CacheForRun c = open_cache_for_run(run, tokenizer, *checks.batches, cfg.run.out_dir);
    checks.cache = c.cache;
    checks.shards.insert(checks.shards.end(), c.verification.stamps.begin(), c.verification.stamps.end());
    if (print_progress && c.verification.verified > 0)
      std::cerr << "deepen: verified " << c.verification.verified << " teacher cache files in full ("
                << static_cast<double>(c.verification.verified_bytes) / 1e9 << " GB in " << c.verification.seconds
                << " s; once per run)\n";
  }
  return checks;
}

void record_startup(const RunPlan& run, const StartupChecks& checks) {
  record_verified_shards(run.cfg.run.out_dir, checks.shards);
}

namespace {

// `root`'s outcome, as JSON text, to every rank: {"steps_done": ..., "checkpoint": ...} or
// {"error": ..., "bad_input": ...}. Throws the error on every rank.
nlohmann::json share_verdict(Communicator& world, std::string verdict, int root) {
  broadcast_bytes(&world, verdict, root);
  const nlohmann::json j = nlohmann::json::parse(verdict);
  if (j.contains("error")) {
    if (j["bad_input"].get<bool>()) throw InputError(j["error"].get<std::string>());
    throw ExitError(kExitFailure, j["error"].get<std::string>());
  }
  return j;
}

template <class F> std::string verdict_of(F&& f) {
  try {
    return f().dump();
  } catch (const InputError& e) {
    return nlohmann::json{{"error", e.what()}, {"bad_input", true}}.dump();
  } catch (const std::exception& e) {  // e.g. a record that could not be written: every rank stops too
    return nlohmann::json{{"error", e.what()}, {"bad_input", false}}.dump();
  }
}

}  // namespace

std::string run_ended(const Config& cfg) {
  if (job_state(cfg.run.out_dir) == JobState::kFinished) return "finished";
  return unretried_divergence(cfg.run.out_dir, cfg.run.name, cfg.guard.lr_scale).value_or("");
}

AgreedStart agree_on_startup(Communicator& world, const JobPlan& plan, const Tokenizer& tokenizer, bool resume,
                             bool print_progress) {
  const RankLayout& layout = *plan.layout;
  AgreedStart agreed;
  std::vector<StartupChecks> mine(plan.runs.size());
  agreed.locks.resize(plan.runs.size());
  // Checks first, for every run: nothing is written until all passed.
  for (size_t r = 0; r < plan.runs.size(); ++r) {
    const int root = layout.student_rank(0, static_cast<int>(r));
    std::string verdict;
    if (world.rank() == root)
      verdict = verdict_of([&] {
        // A group's run that finished or diverged trains no more (a run alone is the user's own call).
        const Config& cfg = plan.runs[r].cfg;
        const std::string ended = resume && plan.runs.size() > 1 ? run_ended(cfg) : "";
        mine[r] = check_before_start(plan.runs[r], tokenizer, resume, print_progress);
        mine[r].batches.reset();  // the student opens its own
        return nlohmann::json{{"steps_done", mine[r].steps_done}, {"checkpoint", mine[r].resume_checkpoint},
                              {"ended", ended}};
      });
    const nlohmann::json j = share_verdict(world, verdict, root);
    agreed.steps_done.push_back(j["steps_done"].get<int64_t>());
    agreed.resume_checkpoint.push_back(j["checkpoint"].get<std::string>());
    agreed.ended.push_back(j["ended"].get<std::string>());
  }
  for (size_t r = 0; r < plan.runs.size(); ++r) {
    const int root = layout.student_rank(0, static_cast<int>(r));
    std::string verdict;
    if (world.rank() == root)
      verdict = verdict_of([&] {
        // One writer per run folder from here on (the checks read only: a refused start leaves no
        // trace). A job this one waited for may have moved the folder on: then it starts over.
        const Config& cfg = plan.runs[r].cfg;
        agreed.locks[r] = std::make_shared<RunFolderLock>(cfg.run.out_dir, cfg.control.watchdog_s);
        if (agreed.locks[r]->waited() &&
            check_before_start(plan.runs[r], tokenizer, resume, false).steps_done != mine[r].steps_done)
          throw InputError(cfg.run.out_dir + ": another job wrote this run folder while this one waited for its lock; "
                           "run the same command again to resume from where it left it");
        record_startup(plan.runs[r], mine[r]);
        return nlohmann::json{{"recorded", true}};
      });
    share_verdict(world, verdict, root);
  }
  return agreed;
}

}  // namespace deepen
