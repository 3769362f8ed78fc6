// The active-layer-token record of a run: how much compute it has spent, for matched controls.
#pragma once

#include <cstdint>
#include <string>

namespace deepen {

// Every run writes <run.out_dir>/active_layer_tokens.json (the trainer: at each checkpoint with
// "complete": false, and at the end with "complete": true), e.g.
//   {"active_layer_tokens": 77824, "tokens": 40960, "steps": 10, "complete": true}
// A matched joint run reads it through budget = "active_layer_tokens:<that run's out_dir>"
// (curriculum/growth_schedule.h's resolve_budget); the study runner reads "complete".
struct ActiveLayerTokensRecord {
  int64_t active_layer_tokens = 0;  // Σ over finished steps of tokens × active depth
  int64_t tokens = 0;               // Σ over finished steps of tokens
  int64_t steps = 0;                // finished optimizer steps
  bool complete = false;            // true once the run has finished its whole schedule
};

// <run_dir>/active_layer_tokens.json
std::string active_layer_tokens_path(const std::string& run_dir);

// Writes the record atomically (temporary file + rename), creating run_dir if needed. Throws
// std::runtime_error on I/O failure.
void write_active_layer_tokens(const std::string& run_dir, const ActiveLayerTokensRecord& record);

// Reads and checks a record. InputError (naming the file) when it is missing, is not valid JSON,
// lacks a field, or has a negative count. Does not require `complete` (see resolve_budget).
ActiveLayerTokensRecord read_active_layer_tokens(const std::string& run_dir);

}  // namespace deepen
