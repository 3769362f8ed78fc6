// What a run writes when it starts: config.toml (the resolved config) and run.json (its metadata).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace deepen {

// Writes <dir>/config.toml ("# resolved config of run <name>" + the TOML of config/config.h's
// to_toml) and <dir>/run.json (`meta`, indented), creating `dir`. config.toml is what `deepen
// report` and `deepen plan --check` load back, and what a resumed run must match.
void write_run_start(const std::string& dir, const std::string& run_name, const std::string& resolved_toml,
                     const nlohmann::json& meta);

// A run that starts from step 0 in `dir` (--fresh, or a folder without an earlier run) removes what an
// earlier run left there: checkpoints/, final/, active_layer_tokens.json and guard.jsonl. Otherwise a
// later resume would take the earlier run's newest checkpoint (keep-last-K prunes by step, so a new, lower-numbered
// checkpoint is the one dropped), and a study would count a finished earlier run as this one.
void clear_previous_run(const std::string& dir);

// <dir>/run.json: nullopt when the file does not exist; InputError naming it when it is not JSON.
std::optional<nlohmann::json> read_run_json(const std::string& dir);

}  // namespace deepen
