// RunRecords: the JSONL files of a run (metrics, eval, diagnostics), consistent across resumes.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace deepen {

// <run dir>/metrics.jsonl      one line per optimizer step (loss, kl, ce, lr, depth, tokens, ...)
// <run dir>/eval.jsonl         one line per eval point (validation CE and KL)
// <run dir>/diagnostics.jsonl  one line per diagnostic point (residual RMS per class, identity map)
// Every record carries "step". On resume from a checkpoint taken after step s, records with
// step > s are dropped first: those steps run again, so the files read as one uninterrupted run.
class RunRecords {
 public:
  RunRecords(const std::string& run_dir, std::optional<int64_t> resume_after_step);

  void metrics(const nlohmann::json& record) { append(metrics_, record); }
  void eval(const nlohmann::json& record) { append(eval_, record); }
  void diagnostics(const nlohmann::json& record) { append(diagnostics_, record); }

  static std::string metrics_path(const std::string& run_dir);
  static std::string eval_path(const std::string& run_dir);
  static std::string diagnostics_path(const std::string& run_dir);

 private:
  static void append(std::ofstream& out, const nlohmann::json& record);
  std::ofstream metrics_, eval_, diagnostics_;
};

// Reads a JSONL file (missing file: empty). Throws InputError naming the file and line on bad JSON.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

}  // namespace deepen
