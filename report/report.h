// Study report: reads run folders, matches runs to the study's roles from their configs, and writes
// the paper's table (Markdown + CSV), the phase-wise crossover and the plots (gnuplot PNG + SVG).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "diagnostics/distribution_summary.h"
#include "report/run_kind.h"
#include "report/scaling.h"

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

// ---- The report ------------------------------------------------------------------------------------

struct Stat {
  int n = 0;
  double mean = 0;
  std::optional<double> std;  // sample standard deviation (n - 1); absent for n < 2
};
// mean and sample std: stat({1, 2, 3}) = {3, 2, 1}; stat({5}) = {1, 5, none}.
Stat stat(const std::vector<double>& values);

// All runs of one role (and one configuration), over seeds.
struct RoleSummary {
  std::string role;  // role_name(norm, kind), e.g. "post-grow" (with the run name when a role has two configurations)
  NormPlacement norm = NormPlacement::kPre;
  RunKind kind = RunKind::kJoint;
  std::vector<const RunData*> runs;  // sorted by seed
  std::vector<int64_t> seeds;
  Stat val_ce;                 // over seeds, of each run's last eval record
  std::optional<Stat> val_kl;  // absent without a teacher
  int64_t steps = 0;                 // of the first seed's run (all seeds share the schedule)
  int64_t tokens = 0;
  int64_t active_layer_tokens = 0;
  bool complete = true;        // every run finished its schedule
};

// Δ = mean(a) − mean(b) of final validation CE; with shared seeds also the paired per-seed
// differences' statistics. Negative: `a` reaches the lower (better) CE.
struct Comparison {
  std::string name;        // "grow: post − pre"
  std::string a, b;        // roles
  std::string question;    // what it tells, for the reader
  double delta = 0;
  std::optional<Stat> paired;
  std::optional<double> paper;  // the published value, where the paper gives one
};

// Per stage of the pre/post pair of one kind: who leads at the stage end, and from which step
// post-norm stays ahead to the stage end.
struct StageCrossover {
  int stage = 0;
  int64_t depth = 0;
  int64_t first_step = 0, last_step = 0;  // eval steps covered
  double pre_ce = 0, post_ce = 0;         // mean over seeds at the stage's last eval point
  std::string leader;                     // "post" | "pre" | "tie"
  std::optional<int64_t> post_ahead_from_step;   // within the stage; none if post is not ahead at its end
  std::optional<int64_t> post_ahead_from_tokens;
};

struct Crossover {
  RunKind kind = RunKind::kGrow;         // grow, joint or freeze
  std::vector<StageCrossover> stages;
  std::optional<int64_t> post_ahead_from_step;   // over the whole run: post < pre at every eval from here on
  std::optional<int64_t> post_ahead_from_tokens;
  int64_t eval_points = 0;               // common eval steps compared
};

struct Report {
  std::vector<RoleSummary> roles;       // table order: joint, grow, matched, single-block, freeze, others
  std::vector<Comparison> comparisons;
  std::vector<Crossover> crossovers;
  std::vector<std::string> notes;       // runs skipped or unfinished, config mismatches
  std::vector<ScalingSweep> sweeps;     // layout sweeps among the runs (report/scaling.h); write_report fills it
  std::vector<std::string> images;      // plots write_report rendered into its out_dir ("val_ce.png", "val_ce.svg", ...)
};

// Pure: the report of loaded runs.
Report build_report(const std::vector<RunData>& runs);

// The summary of `norm`-`kind` runs with the role's first configuration, or null when the report has none.
const RoleSummary* find_role(const Report& report, NormPlacement norm, RunKind kind);

// Mean over seeds of val_ce at each eval step present in every seed's records: (step, tokens, ce).
struct CurvePoint {
  int64_t step = 0;
  int64_t tokens = 0;
  double val_ce = 0;
  int stage = 0;
};
std::vector<CurvePoint> mean_curve(const RoleSummary& role);

// The earliest step from which `a` stays strictly below `b` through the last point of both curves
// (compared at common steps), or none when `a` is not below at the last one.
// Example: a = [3.0, 2.5, 2.4, 2.2], b = [2.9, 2.6, 2.3, 2.3] at steps 0..3 -> step 3.
std::optional<size_t> stays_ahead_from(const std::vector<double>& a, const std::vector<double>& b);

std::string report_markdown(const Report& report);
// One row per role: role,norm,kind,n,seeds,val_ce_mean,val_ce_std,val_kl_mean,val_kl_std,steps,
// tokens,active_layer_tokens,complete; then comparisons in comparisons.csv and runs in runs.csv.
std::string report_csv(const Report& report);
std::string comparisons_csv(const Report& report);
std::string runs_csv(const Report& report);

struct ReportOptions {
  std::string out_dir = "report";
  bool plots = true;              // needs gnuplot; without it the .gp and .dat files are still written
  std::string gnuplot = "gnuplot";
};

// Loads every run under `paths`, writes report.md, report.csv, comparisons.csv, runs.csv and the
// plots into options.out_dir; returns the report (the caller prints the table).
Report write_report(const std::vector<std::string>& paths, const ReportOptions& options);

// The closing line of `deepen report` and the demo: what write_report wrote into `out_dir`, the plots
// by name (each as PNG and SVG). Example: out_dir "r", images {"val_ce.png", "val_ce.svg",
// "identity.png", "identity.svg"} ->
//   "report: r/report.md, with report.csv, comparisons.csv, runs.csv and 2 plots as PNG and SVG (val_ce, identity)"
// and without images "... runs.csv; no plots rendered" (--no-plots, no gnuplot, or no data: report.md's
// notes say which).
std::string report_files_line(const Report& report, const std::string& out_dir);

}  // namespace deepen
