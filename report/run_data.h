// A run folder as the report reads it: config, run.json, eval, diagnostics and metrics records.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "diagnostics/distribution_summary.h"

namespace deepen {

// ---- What a run folder holds (written by the trainer, student 0) ---------------------------------

// One line of eval.jsonl.
struct EvalPoint {
  int64_t step = 0;  // the optimizer step just finished (0-based)
  int stage = 0;
  int64_t depth = 0;
  bool stage_end = false;
  int64_t tokens = 0;
  int64_t active_layer_tokens = 0;
  double val_ce = 0;
  std::optional<double> val_kl;  // null without a teacher
  std::optional<double> val_ppl;  // exp(val_ce); absent in records written before it existed
};

// Per token class values (first, special, structural, content); a class absent from the batch is
// absent from the map.
using ClassValues = std::map<std::string, double>;

// One line of diagnostics.jsonl, the parts the report plots.
struct DiagnosticPoint {
  int64_t step = 0;
  int stage = 0;
  int64_t depth = 0;
  std::string event;                     // "growth" (taken on the pre-growth model) | "periodic"
  std::vector<ClassValues> residual_rms;  // RMS of the residual entering block i, per class
  ClassValues boundary_rms;              // RMS of what an appended block would receive
  ClassValues identity_rel;              // last block: ||B(x) - x|| / ||x||
  ClassValues identity_cos;              // last block: cos(B(x), x)
  // Block-boundary RMS per token type (diagnostics/block_boundary_rms.h): boundary b = 0 .. depth/L.
  struct BoundaryRms {
    DistributionSummary all, document_boundary, regular;
  };
  int64_t block_layers = 1;
  std::vector<BoundaryRms> block_rms;
  // Block removal (diagnostics/block_removal.h), at phase ends and at the end of the run.
  struct Removal {
    int64_t block = 0;
    double ce_without = 0, delta_ce = 0, angle = 0;
  };
  std::optional<double> removal_full_ce;
  std::vector<Removal> block_removal;
};

// final_token_rms.json: every token's RMS at every block boundary of the finished student.
struct FinalTokenRms {
  int64_t step = 0;
  int64_t block_layers = 1;
  std::vector<std::vector<double>> document_boundary, regular;  // [boundary][token]
};

struct RunData {
  std::string dir;
  Config config;                           // config.toml
  std::string teacher;                     // run.json "teacher"
  int64_t tokens_per_step = 0;             // run.json
  int64_t total_steps = 0;                 // run.json
  std::vector<int64_t> stage_depths;       // run.json
  std::vector<int64_t> stage_steps;        // run.json
  std::vector<EvalPoint> evals;            // eval.jsonl, in step order
  std::vector<DiagnosticPoint> diagnostics;
  std::vector<double> train_loss;          // metrics.jsonl "loss" of step s at index s (a prefix without gaps)
  std::optional<FinalTokenRms> final_token_rms;  // final_token_rms.json, when the run finished
  bool complete = false;                   // active_layer_tokens.json "complete"
  // The divergence guard stopped the run and it has not trained past that step since
  // (run_folder/guard_events.h): "diverged at step 70 (the loss is nan ...)"; empty otherwise.
  std::string diverged;
  int64_t active_layer_tokens = 0;         // active_layer_tokens.json (0 if absent)
  int64_t steps_done = 0;
  // First step of every stage but the first: where blocks were appended.
  std::vector<int64_t> growth_steps() const;
};

// True if `dir` is a run folder (has config.toml and eval.jsonl).
bool is_run_dir(const std::string& dir);

// Run folders under the given paths: each path is a run folder or is searched (recursively, sorted)
// for run folders. InputError if a path does not exist or nothing is found.
std::vector<std::string> find_run_dirs(const std::vector<std::string>& paths);

// Reads one run folder; InputError naming the file on malformed records or a missing config.
RunData load_run(const std::string& dir);

// Parses one diagnostics.jsonl record (tolerant: missing parts stay empty).
DiagnosticPoint parse_diagnostic(const std::string& json_line_or_object);

// ---- Roles: report/run_kind.h ------------------------------------------------------------------

// What makes two runs the same experiment (a hash): everything but the run section (name, folder,
// seed, threads), where a matched budget came from, checkpoint settings, how the run executed
// (config/without_execution_settings) and on which rank layout at the same global batch
// (config/without_layout): a layout sweep is one experiment.
uint64_t experiment_signature(const Config& cfg);

}  // namespace deepen
