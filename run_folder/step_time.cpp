// Step time breakdown: the timer, the record and the per-rank file.
#include "run_folder/step_time.h"

#include <algorithm>
#include <filesystem>

#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;

double StepTime::parts_sum() const {
  double sum = 0;
  for (const auto& [name, s] : parts) sum += s;
  return sum;
}

nlohmann::json StepTime::to_json() const {
  nlohmann::json p = nlohmann::json::object();
  for (const auto& [name, s] : parts) p[name] = s;
  nlohmann::json j = {{"step", step}, {"role", role}, {"time_s", seconds}, {"parts", p}};
  if (passes >= 0) j["passes"] = passes;
  if (deliveries >= 0) j["deliveries"] = deliveries;
  if (held_bytes >= 0) j["held_bytes"] = held_bytes;
  return j;
}

StepTimer::StepTimer(const std::vector<std::string>& parts)
    : names_(parts), seconds_(parts.size(), 0.0), since_(Clock::now()) {}

StepTime StepTimer::take(int64_t step, const std::string& role) {
  const Clock::time_point now = Clock::now();
  StepTime t;
  t.step = step;
  t.role = role;
  t.seconds = std::chrono::duration<double>(now - since_).count();
  for (size_t i = 0; i < names_.size(); ++i) t.parts.emplace_back(names_[i], seconds_[i]);
  std::fill(seconds_.begin(), seconds_.end(), 0.0);
  since_ = now;
  return t;
}

void StepTimer::restart() {
  std::fill(seconds_.begin(), seconds_.end(), 0.0);
  since_ = Clock::now();
}

StepTimeLog::StepTimeLog(const std::string& run_dir, int world_rank, std::optional<int64_t> resume_after_step)
    : world_rank_(world_rank), out_(prepare(run_dir, world_rank, resume_after_step)) {}

std::string StepTimeLog::prepare(const std::string& run_dir, int world_rank, std::optional<int64_t> resume_after_step) {
  const std::string path = RunFolder(run_dir).step_time_jsonl(world_rank);
  fs::create_directories(fs::path(path).parent_path());
  if (!resume_after_step) {
    fs::remove(path);
  } else {
    const int64_t last = *resume_after_step;
    rewrite_jsonl(path, [last](const nlohmann::json& j) { return j.value("step", int64_t{0}) <= last; });
  }
  return path;
}

void StepTimeLog::append(const StepTime& t) {
  nlohmann::json j = t.to_json();
  j["rank"] = world_rank_;
  out_.append(j);
}

std::vector<nlohmann::json> read_step_times(const std::string& run_dir) {
  std::vector<std::pair<int, std::string>> files;
  const fs::path dir = fs::path(run_dir) / "step_time";
  if (!fs::is_directory(dir)) return {};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank", 0) != 0 || e.path().extension() != ".jsonl") continue;
    try {
      files.emplace_back(std::stoi(name.substr(4)), e.path().string());
    } catch (const std::exception&) {
      // not one of ours
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<nlohmann::json> out;
  for (const auto& [rank, path] : files)
    for (nlohmann::json& j : read_jsonl(path)) out.push_back(std::move(j));
  return out;
}

}  // namespace deepen
