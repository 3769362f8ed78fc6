// Teacher sharing in the report (see teacher_sharing.h).
#include "report/teacher_sharing.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "run_folder/jsonl.h"

namespace deepen {
namespace fs = std::filesystem;

std::vector<SharedTeacherJob> find_shared_teacher_jobs(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    if (!fs::is_directory(p)) continue;
    for (const auto& e : fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied))
      if (e.is_regular_file() && e.path().filename() == "rank0.jsonl" && e.path().parent_path().filename() == "step_time" &&
          e.path().parent_path().parent_path().filename() == "job")
        files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<SharedTeacherJob> jobs;
  for (const std::string& f : files) {
    SharedTeacherJob job;
    job.dir = fs::path(f).parent_path().parent_path().string();
    for (const nlohmann::json& r : read_jsonl(f)) {
      if (r.value("role", "") != "teacher" || !r.contains("deliveries")) continue;
      job.passes += r.at("passes").get<int64_t>();
      job.deliveries += r.at("deliveries").get<int64_t>();
    }
    if (job.deliveries > 0) jobs.push_back(job);
  }
  return jobs;
}

std::string teacher_sharing_markdown(const std::vector<SharedTeacherJob>& jobs) {
  if (jobs.empty()) return "";
  std::string md =
      "\n## Shared teacher\n\nRuns that read the same data trained in one job (study.share_teacher): the teacher "
      "computed each micro-batch once for all of them (pipeline 0's records; every pipeline serves an equal share).\n\n";
  for (const SharedTeacherJob& j : jobs) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "- %s: %lld teacher forward passes for %lld micro-batches delivered: %.0f%% of the teacher's work "
                  "saved (%lld passes)\n",
                  j.dir.c_str(), static_cast<long long>(j.passes), static_cast<long long>(j.deliveries),
                  100.0 * static_cast<double>(j.deliveries - j.passes) / static_cast<double>(j.deliveries),
                  static_cast<long long>(j.deliveries - j.passes));
    md += line;
  }
  return md;
}

}  // namespace deepen
