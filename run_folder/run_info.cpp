// config.toml and run.json of a run folder.
#include "run_folder/run_info.h"

#include <filesystem>
#include <fstream>

#include "config/input_error.h"
#include "config/text_file.h"
#include "run_folder/run_folder.h"

namespace deepen {

void write_run_start(const std::string& dir, const std::string& run_name, const std::string& resolved_toml,
                     const nlohmann::json& meta) {
  std::filesystem::create_directories(dir);
  const RunFolder run(dir);
  write_file_text(run.config_toml(), "# resolved config of run " + run_name + "\n" + resolved_toml, "the resolved config");
  write_file_text(run.run_json(), meta.dump(2) + "\n", "the run's metadata");
}

std::optional<nlohmann::json> read_run_json(const std::string& dir) {
  const std::string path = RunFolder(dir).run_json();
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not JSON: " + e.what());
  }
}

void clear_previous_run(const std::string& dir) {
  const RunFolder run(dir);
  for (const std::string& path :
       {run.checkpoints(), run.final_dir(), run.active_layer_tokens_json(), run.guard_jsonl()})
    std::filesystem::remove_all(path);
}

}  // namespace deepen
