// The paper's tables (docs/protocol.md, "Published results" and "Diagnostics") from a report's runs, with the
// published numbers beside ours: Tables 1-4, A3 and A4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diagnostics/transition_loss.h"
#include "report/report.h"

namespace deepen {

// Whether a run has the paper's configuration (9 layers in blocks of 3 at Qwen3-8B's width,
// 50,000-step phases): only then are the published numbers the same experiment. Our numbers are
// always shown; the paper's stand beside them either way, marked "(other config)" when no run of
// the table matches.
bool matches_paper_config(const RunData& run);

// Table 1's interaction, from the four roles' final validation CE means:
//   Δ_joint = post-joint − pre-joint,  Δ_grow = post-grow − pre-grow,  I = Δ_grow − Δ_joint.
// Example (the paper): Δ_joint = 2.7607 − 2.7603 = +0.0004, Δ_grow = 2.7330 − 2.7658 = −0.0328,
//   I = −0.0332. With seeds present in all four roles, `paired` holds I seed by seed (mean ± std).
struct Interaction {
  double delta_joint = 0, delta_grow = 0, interaction = 0;
  std::optional<Stat> paired;
};
std::optional<Interaction> interaction(const Report& report);

// Transition metrics of one grow/freeze role, per append (mean ± std over seeds).
struct RoleTransitions {
  std::string role;
  std::vector<int64_t> steps;  // the append steps (of the first seed)
  std::vector<TransitionWindows> windows;
  std::vector<Stat> jump, auc_short, auc_long, recovery;  // recovery over the seeds that recovered
  std::vector<int> not_recovered;                          // seeds whose loss never came back
};
std::vector<RoleTransitions> transition_table(const Report& report);

// Markdown sections "Table 1" .. "Table A4" for report.md (empty sections are left out with a line
// saying which runs they need).
std::string paper_tables_markdown(const Report& report);

}  // namespace deepen
