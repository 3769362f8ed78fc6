// JSONL run records, truncated to the resume point so a resumed run reads as one run.
#include "run_folder/run_records.h"

#include <filesystem>

#include "config/text_file.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

std::string prepared_dir(const std::string& run_dir) {
  fs::create_directories(run_dir);
  return run_dir;
}

}  // namespace

std::string RunRecords::prepare(const std::string& path, std::optional<int64_t> resume_after_step) {
  if (resume_after_step) {
    const int64_t last = *resume_after_step;
    rewrite_jsonl(path, [last](const nlohmann::json& r) { return r.value("step", int64_t{0}) <= last; });
  } else {
    fs::remove(path);  // a fresh run starts fresh records
  }
  return path;
}

RunRecords::RunRecords(const std::string& run_dir, std::optional<int64_t> resume_after_step, bool tensorboard)
    : run_dir_(run_dir),
      metrics_(prepare(RunFolder(prepared_dir(run_dir)).metrics_jsonl(), resume_after_step)),
      eval_(prepare(RunFolder(run_dir).eval_jsonl(), resume_after_step)),
      diagnostics_(prepare(RunFolder(run_dir).diagnostics_jsonl(), resume_after_step)) {
  if (!resume_after_step) {  // a fresh run's own
    fs::remove(RunFolder(run_dir).final_token_rms_json());
    remove_tensorboard_events(run_dir);
  }
  if (tensorboard)
    tensorboard_.emplace(run_dir, resume_after_step ? std::optional<int64_t>(*resume_after_step + 1) : std::nullopt);
}

void RunRecords::metrics(const nlohmann::json& record) {
  metrics_.append(record);
  if (tensorboard_) tensorboard_->scalars(record.value("step", int64_t{0}), numeric_fields(record, "train"));
}

void RunRecords::eval(const nlohmann::json& record) {
  eval_.append(record);
  if (tensorboard_) tensorboard_->scalars(record.value("step", int64_t{0}), numeric_fields(record, "eval"));
}

void RunRecords::final_token_rms(const nlohmann::json& record) const {
  write_file_text(RunFolder(run_dir_).final_token_rms_json(), record.dump() + "\n", "the final per-token RMS");
}

}  // namespace deepen
