// Paths inside a run folder.
#include "run_folder/run_folder.h"

#include <cstdio>
#include <filesystem>
#include <string_view>

namespace deepen {
namespace fs = std::filesystem;

std::string RunFolder::file(const char* name) const { return (fs::path(dir_) / name).string(); }

std::string RunFolder::cpu_kernel_choices_student(int64_t student) const {
  return (fs::path(dir_) / "cpu_kernels" / ("student" + std::to_string(student) + ".json")).string();
}

std::string RunFolder::cpu_kernel_choices_teacher(int64_t pipeline, int64_t stage) const {
  return (fs::path(dir_) / "cpu_kernels" / ("teacher_p" + std::to_string(pipeline) + "_s" + std::to_string(stage) + ".json"))
      .string();
}

std::string RunFolder::step_time_jsonl(int world_rank) const {
  return (fs::path(dir_) / "step_time" / ("rank" + std::to_string(world_rank) + ".jsonl")).string();
}

namespace {
constexpr std::string_view kEventsPrefix = "events.out.tfevents.";
}  // namespace

std::string RunFolder::tensorboard_events(int64_t unix_seconds, const std::string& host) const {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(unix_seconds));
  return (fs::path(dir_) / (std::string(kEventsPrefix) + seconds + "." + host)).string();
}

bool RunFolder::is_tensorboard_events(const std::string& file_name) {
  return file_name.starts_with(kEventsPrefix);
}

std::optional<int64_t> RunFolder::tensorboard_events_seconds(const std::string& file_name) {
  if (!is_tensorboard_events(file_name)) return std::nullopt;
  const std::string rest = file_name.substr(kEventsPrefix.size());
  const size_t digits = rest.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string::npos || digits > 18) return std::nullopt;
  return std::stoll(rest.substr(0, digits));
}

std::string RunFolder::checkpoint_student(const std::string& d) { return (fs::path(d) / "student.safetensors").string(); }
std::string RunFolder::checkpoint_optimizer(const std::string& d) { return (fs::path(d) / "optimizer.safetensors").string(); }
std::string RunFolder::checkpoint_optimizer_shard(const std::string& d, int64_t rank, int64_t ranks) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer.shard-%05lld-of-%05lld.safetensors", static_cast<long long>(rank),
                static_cast<long long>(ranks));
  return (fs::path(d) / name).string();
}
std::string RunFolder::checkpoint_progress(const std::string& d) { return (fs::path(d) / "progress.json").string(); }

}  // namespace deepen
