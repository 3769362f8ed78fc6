// The report of a factorial study: norm placement × curriculum (joint, grow) × growth operator, with
// 95% t-intervals over seeds, interaction contrasts against pre-norm, the phase-wise crossover of
// every pair and the loss change at each growth; its Markdown, CSV and plots grouped by factor.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/paper_figures.h"
#include "report/report.h"
#include "report/t_interval.h"

namespace deepen {

// One cell of the design: the joint or grow runs of one placement and operator, over seeds.
struct FactorialCell {
  NormPlacement norm = NormPlacement::kPre;
  RunKind kind = RunKind::kJoint;  // joint | grow
  GrowInit op = GrowInit::kRandom;
  const RoleSummary* role = nullptr;
  Interval val_ce;                 // final validation CE: mean ± 95% t half-width over seeds
  std::optional<Interval> val_kl;
};

// A contrast of cell means with its 95% interval (paired by seed where every cell has the seed).
struct Contrast {
  std::string name;      // "I(peri | teacher)"
  std::string formula;   // the cells, e.g. "(peri-grow − pre-grow) − (peri-joint − pre-joint), teacher"
  NormPlacement norm = NormPlacement::kPre;
  GrowInit op = GrowInit::kRandom;
  Interval value;
};

// The crossover of one placement against pre-norm, at one operator and kind.
struct PairCrossover {
  GrowInit op = GrowInit::kRandom;
  RunKind kind = RunKind::kGrow;
  NormPlacement other = NormPlacement::kPost;
  Crossover crossover;  // post_* fields are `other`'s
};

// The CE change on the fixed diagnostic batch across the k-th growth of a grow cell ("grown"
// diagnostics events): what the operator did to the function, before any step at the new depth.
struct GrowthStepChange {
  NormPlacement norm = NormPlacement::kPre;
  GrowInit op = GrowInit::kRandom;
  int growth = 0;                  // 0 = the first append
  int64_t step = 0;                // of the first seed
  int64_t depth_before = 0, depth_after = 0;
  Interval ce_before, delta_ce;    // delta = ce_after − ce_before, per seed
};

struct Factorial {
  std::vector<NormPlacement> placements;  // present in joint or grow cells, in option order (pre first)
  std::vector<GrowInit> operators;        // present, in the order random, teacher, stack, identity
  std::vector<FactorialCell> cells;       // placement, then operator, then joint before grow
  // I(p | o) = (p-grow − pre-grow) − (p-joint − pre-joint) at operator o, for every p ≠ pre: the
  // paper's interaction for each placement and operator (negative: p gains more from growth).
  std::vector<Contrast> interactions;
  // For every operator o after the first (the baseline) and every placement p:
  //   G(p | o) = (p-grow − p-joint at o) − (p-grow − p-joint at the baseline): does o change what
  //   growth is worth to p?  and, p ≠ pre, I(p | o) − I(p | baseline): does the placement's
  //   interaction with the curriculum depend on the operator?
  std::vector<Contrast> operator_contrasts;
  std::vector<PairCrossover> crossovers;  // grow (and joint) cells: every placement against pre, per operator
  std::vector<GrowthStepChange> growth_changes;
};

// The factorial design among the report's joint and grow roles, when the runs go beyond the paper's
// 2 × 2 (a placement other than pre and post, or more than one growth operator); none otherwise,
// so the paper's study keeps its report as it is.
std::optional<Factorial> factorial_design(const Report& report);

// "## Factorial design ..." sections for report.md.
std::string factorial_markdown(const Factorial& f);
// factorial.csv: one row per cell; contrasts.csv: one row per contrast (interactions, then the
// operator contrasts).
std::string factorial_csv(const Factorial& f);
std::string contrasts_csv(const Factorial& f);

// The plots, grouped by factor: factorial_interaction (a panel per operator: joint and grow on x,
// a line per placement with its interval), factorial_val_ce (a panel per operator: a curve per
// placement, grow solid, joint dashed), factorial_contrasts (I(p | o) with intervals, grouped by
// operator).
std::vector<Figure> factorial_figures(const Factorial& f, std::vector<std::string>& notes);

// One colour per placement, the same in every factorial plot.
const char* placement_color(NormPlacement norm);

}  // namespace deepen
