// Study report: runs matched to the study's roles from their configs, the statistics over seeds,
// the comparisons and the phase-wise crossover (pure; report/report_files.h writes them out).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "report/run_data.h"
#include "report/run_kind.h"
#include "report/scaling.h"

namespace deepen {

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
  // role_name(norm, kind), e.g. "post-grow"; "+<grow_init>" after it when the report's runs use more
  // than one growth operator ("peri-grow+identity"); the run name after that when a role has two
  // configurations.
  std::string role;
  NormPlacement norm = NormPlacement::kPre;
  RunKind kind = RunKind::kJoint;
  GrowInit op = GrowInit::kRandom;  // curriculum.grow_init of the runs
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
  // The runs the roles point into, when the report owns them (write_report's: the callers print
  // it and list its files after the loading is gone); build_report's caller keeps its own.
  std::shared_ptr<const std::vector<RunData>> owned_runs;
};

// Pure: the report of loaded runs.
Report build_report(const std::vector<RunData>& runs);

// The summary of `norm`-`kind` runs with the role's first configuration, or null when the report has none.
const RoleSummary* find_role(const Report& report, NormPlacement norm, RunKind kind);
// The same for one growth operator (any report: with one operator, its roles carry no "+<op>").
const RoleSummary* find_role(const Report& report, NormPlacement norm, RunKind kind, GrowInit op);

// The phase-wise crossover of `other` against `pre` (both of one kind): at their common eval steps,
// per stage who leads and from which step `other` stays ahead. Crossover's post_* fields are
// `other`'s (the paper's pair: other = post-norm). None without a common eval step.
std::optional<Crossover> crossover(const RoleSummary& pre, const RoleSummary& other);

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

}  // namespace deepen
