// The start-up checks of a training job (see startup_checks.h) and their agreement across ranks.
#include "launch/startup_checks.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "data/token_shards.h"
#include "dist/communicator.h"
#include "launch/job_parts.h"
#include "run_folder/progress.h"
#include "train/shard_batch_source.h"
#include "train/student_trainer.h"

namespace deepen {

StartupChecks check_before_start(const JobPlan& plan, const Tokenizer& tokenizer, bool resume, bool print_progress) {
  const Config& cfg = plan.run.cfg;
  StartupChecks checks;
  if (resume) {
    if (const auto found = resume_point(cfg.run.out_dir, cfg.checkpoint.keep)) {
      check_resumable(cfg, *found);
      checks.steps_done = found->step + 1;
      checks.resume_checkpoint = found->dir;
    }
  }
  checks.batches = make_shard_batch_source(plan.run, tokenizer);
  std::vector<std::string> files = list_shard_files(cfg.data.train);
  for (const std::string& f : list_shard_files(cfg.data.valid)) files.push_back(f);
  const ShardVerification v = verify_shards_once(cfg.run.out_dir, files);
  checks.shards = v.stamps;
  if (print_progress && v.verified > 0)
    std::cerr << "deepen: verified " << v.verified << " of " << files.size() << " shards in full ("
              << static_cast<double>(v.verified_bytes) / 1e9 << " GB in " << v.seconds << " s; once per run)\n";
  return checks;
}

void record_startup(const JobPlan& plan, const StartupChecks& checks) {
  record_verified_shards(plan.run.cfg.run.out_dir, checks.shards);
}

StartupChecks agree_on_startup(Communicator& world, const JobPlan& plan, const Tokenizer& tokenizer, bool resume,
                               bool print_progress, int first_student) {
  // The verdict as JSON text: {"steps_done": ..., "checkpoint": ...} or {"error": ...}.
  std::string verdict;
  StartupChecks checks;
  if (world.rank() == first_student) {
    try {
      checks = check_before_start(plan, tokenizer, resume, print_progress);
      record_startup(plan, checks);
      verdict = nlohmann::json{{"steps_done", checks.steps_done}, {"checkpoint", checks.resume_checkpoint}}.dump();
    } catch (const InputError& e) {
      verdict = nlohmann::json{{"error", e.what()}, {"bad_input", true}}.dump();
    } catch (const std::exception& e) {  // e.g. the record could not be written: every rank stops too
      verdict = nlohmann::json{{"error", e.what()}, {"bad_input", false}}.dump();
    }
    checks.batches.reset();  // the student opens its own
  }
  broadcast_bytes(&world, verdict, first_student);
  const nlohmann::json j = nlohmann::json::parse(verdict);
  if (j.contains("error")) {
    if (j["bad_input"].get<bool>()) throw InputError(j["error"].get<std::string>());
    throw ExitError(kExitFailure, j["error"].get<std::string>());
  }
  checks.steps_done = j["steps_done"].get<int64_t>();
  checks.resume_checkpoint = j["checkpoint"].get<std::string>();
  return checks;
}

}  // namespace deepen
