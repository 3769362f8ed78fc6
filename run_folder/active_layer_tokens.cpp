// The active-layer-token record: atomic write, checked read.
#include "run_folder/active_layer_tokens.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"
#include "run_folder/run_folder.h"

namespace deepen {

std::string active_layer_tokens_path(const std::string& run_dir) {
  return RunFolder(run_dir).active_layer_tokens_json();
}

void write_active_layer_tokens(const std::string& run_dir, const ActiveLayerTokensRecord& r) {
  namespace fs = std::filesystem;
  fs::create_directories(run_dir);
  const nlohmann::json j = {{"active_layer_tokens", r.active_layer_tokens},
                            {"tokens", r.tokens},
                            {"steps", r.steps},
                            {"complete", r.complete}};
  // Replaced atomically (temporary file + rename): a reader sees the old record or the new one.
  write_file_text(active_layer_tokens_path(run_dir), j.dump() + "\n", "the active-layer-token record");
}

ActiveLayerTokensRecord read_active_layer_tokens(const std::string& run_dir) {
  const std::string path = active_layer_tokens_path(run_dir);
  std::ifstream in(path);
  if (!in)
    throw InputError(path + ": no active-layer-token record (is \"" + run_dir +
                     "\" the out_dir of a deepen run that has started training?)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw InputError(path + ": expected a JSON object");
  ActiveLayerTokensRecord r;
  auto count = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_number_integer())
      throw InputError(path + ": " + key + ": missing or not an integer");
    const int64_t v = j[key].get<int64_t>();
    if (v < 0) throw InputError(path + ": " + key + ": must be >= 0, got " + std::to_string(v));
    return v;
  };
  r.active_layer_tokens = count("active_layer_tokens");
  r.tokens = count("tokens");
  r.steps = count("steps");
  if (!j.contains("complete") || !j["complete"].is_boolean())
    throw InputError(path + ": complete: missing or not true/false");
  r.complete = j["complete"].get<bool>();
  return r;
}

}  // namespace deepen
