// RunRecords: the JSONL files of a run (metrics, eval, diagnostics), consistent across resumes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "run_folder/jsonl.h"
#include "run_folder/tensorboard_events.h"

namespace deepen {

// <run dir>/metrics.jsonl      one line per optimizer step (loss, kl, ce, lr, depth, tokens, ...)
// <run dir>/eval.jsonl         one line per eval point (validation CE and KL)
// <run dir>/diagnostics.jsonl  one line per diagnostic point (residual RMS per class, identity map)
// <run dir>/events.out.tfevents.*  with `tensorboard` (run.tensorboard): every numeric field of each
//                              metrics and eval record as a TensorBoard scalar, "train/<field>" and
//                              "eval/<field>" (run_folder/tensorboard_events.h), flushed with the record
// Every record carries "step". On resume from a checkpoint taken after step s, records with
// step > s are dropped first (and a torn last line with them, see run_folder/jsonl.h): those steps
// run again, so the files read as one uninterrupted run. TensorBoard gets the same view from the
// SessionLog START at step s + 1 that begins the resumed run's new event file.
class RunRecords {
 public:
  RunRecords(const std::string& run_dir, std::optional<int64_t> resume_after_step, bool tensorboard = false);

  void metrics(const nlohmann::json& record);
  void eval(const nlohmann::json& record);
  void diagnostics(const nlohmann::json& record) { diagnostics_.append(record); }
  // <run dir>/final_token_rms.json, written whole through a temporary file + rename.
  void final_token_rms(const nlohmann::json& record) const;

 private:
  std::string run_dir_;
  // Drops or truncates the files before the writers open them for appending.
  static std::string prepare(const std::string& path, std::optional<int64_t> resume_after_step);
  JsonlWriter metrics_, eval_, diagnostics_;
  std::optional<TensorBoardEvents> tensorboard_;
};

}  // namespace deepen
