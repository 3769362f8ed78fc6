// RunRecords: the JSONL files of a run (metrics, eval, diagnostics), consistent across resumes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "run_folder/jsonl.h"

namespace deepen {

// <run dir>/metrics.jsonl      one line per optimizer step (loss, kl, ce, lr, depth, tokens, ...)
// <run dir>/eval.jsonl         one line per eval point (validation CE and KL)
// <run dir>/diagnostics.jsonl  one line per diagnostic point (residual RMS per class, identity map)
// Every record carries "step". On resume from a checkpoint taken after step s, records with
// step > s are dropped first (and a torn last line with them, see run_folder/jsonl.h): those steps
// run again, so the files read as one uninterrupted run.
class RunRecords {
 public:
  RunRecords(const std::string& run_dir, std::optional<int64_t> resume_after_step);

  void metrics(const nlohmann::json& record) { metrics_.append(record); }
  void eval(const nlohmann::json& record) { eval_.append(record); }
  void diagnostics(const nlohmann::json& record) { diagnostics_.append(record); }
  // <run dir>/final_token_rms.json, written whole through a temporary file + rename.
  void final_token_rms(const nlohmann::json& record) const;

 private:
  std::string run_dir_;
  // Drops or truncates the files before the writers open them for appending.
  static std::string prepare(const std::string& path, std::optional<int64_t> resume_after_step);
  JsonlWriter metrics_, eval_, diagnostics_;
};

}  // namespace deepen
