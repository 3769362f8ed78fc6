// Checkpoint progress records, run-folder state and live progress lines.
#include "run_folder/progress.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/jsonl.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

void write_train_progress(const std::string& checkpoint_dir, const TrainProgress& p) {
  const nlohmann::json j = {{"steps_done", p.steps_done},
                            {"tokens", p.tokens},
                            {"active_layer_tokens", p.active_layer_tokens},
                            {"depth", p.depth},
                            {"last_eval_ce", p.last_eval_ce},
                            {"last_eval_kl", p.last_eval_kl}};
  const std::string path = RunFolder::checkpoint_progress(checkpoint_dir);
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.flush();
  if (!out) throw std::runtime_error(path + ": write failed");
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
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": " + e.what());
  }
  return p;
}

JobState job_state(const std::string& out_dir) {
  const RunFolder run(out_dir);
  if (fs::exists(run.active_layer_tokens_json())) {
    try {
      if (read_active_layer_tokens(out_dir).complete) return JobState::kFinished;
    } catch (const InputError&) {
      // A torn record: the trainer rewrites it; the run resumes from its checkpoint.
    }
    return JobState::kPartial;
  }
  const fs::path ckpt = run.checkpoints();
  if (fs::is_directory(ckpt) && !fs::is_empty(ckpt)) return JobState::kPartial;
  return JobState::kNew;
}

const char* to_string(JobState s) {
  switch (s) {
    case JobState::kNew: return "new";
    case JobState::kPartial: return "partial (resumes)";
    case JobState::kFinished: return "finished (skipped)";
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
