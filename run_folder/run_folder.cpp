// Paths inside a run folder.
#include "run_folder/run_folder.h"

#include <cstdio>
#include <filesystem>

namespace deepen {
namespace fs = std::filesystem;

std::string RunFolder::file(const char* name) const { return (fs::path(dir_) / name).string(); }

std::string RunFolder::cpu_kernel_choices(int world_rank) const {
  return (fs::path(dir_) / "cpu_kernels" / ("rank" + std::to_string(world_rank) + ".json")).string();
}

std::string RunFolder::step_time_jsonl(int world_rank) const {
  return (fs::path(dir_) / "step_time" / ("rank" + std::to_string(world_rank) + ".jsonl")).string();
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
