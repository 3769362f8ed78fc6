// Checkpoint progress records, run-folder state and live progress lines.
#include "run_folder/progress.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/jsonl.h"
#include "run_folder/guard_events.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

void write_train_progress(const std::string& checkpoint_dir, const TrainProgress& p) {
  const nlohmann::json j = {{"steps_done", p.steps_done},
                            {"tokens", p.tokens},
                            {"active_layer_tokens", p.active_layer_tokens},
                            {"depth", p.depth},
                            {"last_eval_ce", p.last_eval_ce},
                            {"last_eval_kl", p.last_eval_kl},
                            {"guard_window", p.guard_window}};
  write_file_text(RunFolder::checkpoint_progress(checkpoint_dir), j.dump(2) + "\n", "the checkpoint's progress");
}

TrainProgress read_train_progress(const std::string& checkpoint_dir) {
  const std::string path = RunFolder::checkpoint_progress(checkpoint_dir);
  std::ifstream in(path);
  TrainProgress p;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    p.steps_done = j.at("steps_done").get<int64_t>();
    p.tokens = j.at("tokens").get<int64_t>();
    p.active_layer_tokens = j.at("active_layer_tokens").get<int64_t>();
    p.depth = j.value("depth", int64_t{0});
    p.last_eval_ce = j.value("last_eval_ce", -1.0);
    p.last_eval_kl = j.value("last_eval_kl", -1.0);
    p.guard_window = j.value("guard_window", std::vector<double>{});
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": " + e.what());
  }
  return p;
}

std::optional<CheckpointStore::Found> resume_point(const std::string& run_dir, int64_t keep) {
  const CheckpointStore store(run_dir, keep);
  if (auto found = store.latest_valid()) return found;
  // Nothing to resume from: what would a fresh start throw away?
  const RunFolder run(run_dir);
  std::string checkpoints_said;
  const std::vector<std::string> checkpoints = store.list();
  if (!checkpoints.empty()) {
    std::string why;
    for (const std::string& dir : checkpoints)
      why += (why.empty() ? "" : "; ") + fs::path(dir).filename().string() + ": " +
             CheckpointStore::verify(dir).value_or("valid");
    checkpoints_said = (checkpoints.size() == 1 ? std::string("its only checkpoint is not valid")
                                                : "none of its " + std::to_string(checkpoints.size()) +
                                                      " checkpoints is valid") +
                       " (" + why + ")";
  }
  std::vector<std::string> held;
  for (const std::string& path : {run.metrics_jsonl(), run.eval_jsonl(), run.diagnostics_jsonl()}) {
    std::error_code ec;
    if (fs::file_size(path, ec) > 0 && !ec) {
      int64_t lines = 0;
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) lines += !line.empty();
      held.push_back(fs::path(path).filename().string() + " (" + std::to_string(lines) + " records)");
    }
  }
  if (fs::exists(run.final_dir())) held.push_back("a finished student (final/)");
  if (checkpoints_said.empty() && held.empty()) return std::nullopt;
  std::string holds;
  for (size_t i = 0; i < held.size(); ++i) holds += (i == 0 ? "" : i + 1 == held.size() ? " and " : ", ") + held[i];
  const std::string what = checkpoints_said.empty() ? "it holds no checkpoint but " + holds
                           : holds.empty()          ? checkpoints_said
                                                    : checkpoints_said + ", and it holds " + holds;
  throw InputError(run_dir + ": cannot resume: " + what +
                   "; starting over would replace this run's history. Restore a checkpoint, or start over "
                   "on purpose with --fresh (it removes the checkpoints, final/ and the records)");
}

JobState job_state(const std::string& out_dir) {
  const RunFolder run(out_dir);
  if (fs::exists(run.active_layer_tokens_json())) {
    try {
      if (read_active_layer_tokens(out_dir).complete && fs::exists(run.final_student())) return JobState::kFinished;
    } catch (const InputError&) {
      // A torn record: the trainer rewrites it; the run resumes from its checkpoint.
    }
    if (read_guard_stop(out_dir)) return JobState::kDiverged;
    return JobState::kPartial;
  }
  if (fs::exists(run.guard_jsonl()) && read_guard_stop(out_dir)) return JobState::kDiverged;  // before any checkpoint
  const fs::path ckpt = run.checkpoints();
  if (fs::is_directory(ckpt) && !fs::is_empty(ckpt)) return JobState::kPartial;
  return JobState::kNew;
}

const char* to_string(JobState s) {
  switch (s) {
    case JobState::kNew: return "new";
    case JobState::kPartial: return "partial (resumes)";
    case JobState::kFinished: return "finished (skipped)";
    case JobState::kDiverged: return "diverged (guard.jsonl; not rerun with the same LR)";
  }
  return "?";
}

std::string run_progress(const std::string& out_dir) {
  const RunFolder run(out_dir);
  const auto m = last_jsonl_record(run.metrics_jsonl());
  if (!m) return "starting";
  int64_t total = 0;
  try {
    std::ifstream in(run.run_json());
    total = nlohmann::json::parse(in).value("total_steps", int64_t{0});
  } catch (const std::exception&) {
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld depth %lld loss %.4f", static_cast<long long>(m->value("step", 0) + 1),
                static_cast<long long>(total), static_cast<long long>(m->value("depth", 0)), m->value("loss", 0.0));
  std::string out = buf;
  if (const auto e = last_jsonl_record(run.eval_jsonl()); e && e->contains("val_ce")) {
    std::snprintf(buf, sizeof buf, " val CE %.4f", e->value("val_ce", 0.0));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, " %.0f tok/s", m->value("tokens_per_s", 0.0));
  return out + buf;
}

}  // namespace deepen
