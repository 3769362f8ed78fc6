// JSONL run records, truncated to the resume point so a resumed run reads as one run.
#include "run_folder/run_records.h"

#include <filesystem>

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

RunRecords::RunRecords(const std::string& run_dir, std::optional<int64_t> resume_after_step)
    : metrics_(prepare(RunFolder(prepared_dir(run_dir)).metrics_jsonl(), resume_after_step)),
      eval_(prepare(RunFolder(run_dir).eval_jsonl(), resume_after_step)),
      diagnostics_(prepare(RunFolder(run_dir).diagnostics_jsonl(), resume_after_step)) {}

}  // namespace deepen
