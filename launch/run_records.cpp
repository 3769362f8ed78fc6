// JSONL run records, truncated to the resume point so a resumed run reads as one run.
#include "launch/run_records.h"

#include <filesystem>
#include <vector>

#include "launch/input_error.h"

namespace deepen {
namespace fs = std::filesystem;

namespace {

// Keeps only records with step <= last_step (rewritten through a temp file + rename).
void drop_after(const std::string& path, int64_t last_step) {
  if (!fs::exists(path)) return;
  std::vector<nlohmann::json> kept;
  for (auto& record : read_jsonl(path)) {
    if (record.value("step", int64_t{0}) <= last_step) kept.push_back(std::move(record));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& r : kept) out << r.dump() << "\n";
    if (!out) throw std::runtime_error(tmp + ": write failed");
  }
  fs::rename(tmp, path);
}

std::ofstream open_append(const std::string& path) {
  std::ofstream out(path, std::ios::app);
  if (!out) throw std::runtime_error(path + ": cannot open for writing");
  return out;
}

}  // namespace

std::string RunRecords::metrics_path(const std::string& d) { return (fs::path(d) / "metrics.jsonl").string(); }
std::string RunRecords::eval_path(const std::string& d) { return (fs::path(d) / "eval.jsonl").string(); }
std::string RunRecords::diagnostics_path(const std::string& d) { return (fs::path(d) / "diagnostics.jsonl").string(); }

RunRecords::RunRecords(const std::string& run_dir, std::optional<int64_t> resume_after_step) {
  fs::create_directories(run_dir);
  for (const auto& path : {metrics_path(run_dir), eval_path(run_dir), diagnostics_path(run_dir)}) {
    if (resume_after_step) {
      drop_after(path, *resume_after_step);
    } else {
      fs::remove(path);  // a fresh run starts fresh records
    }
  }
  metrics_ = open_append(metrics_path(run_dir));
  eval_ = open_append(eval_path(run_dir));
  diagnostics_ = open_append(diagnostics_path(run_dir));
}

void RunRecords::append(std::ofstream& out, const nlohmann::json& record) {
  out << record.dump() << "\n";
  out.flush();  // a killed run keeps every record it finished
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      records.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      throw InputError(path + ":" + std::to_string(n) + ": not JSON: " + e.what());
    }
  }
  return records;
}

}  // namespace deepen
