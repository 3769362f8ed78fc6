// Growth schedule: which depth is active at each optimizer step, and active-layer-token accounting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace deepen {

// Steps are counted from 0; step s is the (s+1)-th optimizer step. Every step consumes the same
// global batch of `tokens_per_step` tokens, so the schedule is a pure function of the step and
// every student rank derives the same growth points without talking to the others.
//
// Example: stages = [1, 2, 3], stage_tokens = ["10K", "20K", "5000"], tokens_per_step = 4096
//   steps per stage  = ceil(10000/4096), ceil(20000/4096), ceil(5000/4096) = 3, 5, 2
//   first steps      = 0, 3, 8          total_steps = 10
//   depth at step    = 1 1 1 | 2 2 2 2 2 | 3 3
//   growth steps     = 3 and 8: depth increases *before* that step's forward, so step 3 is the
//                      first step trained at depth 2
//   active-layer tokens after n steps: n=3 -> 3·4096·1 = 12288; n=8 -> 12288 + 5·4096·2 = 53248;
//                      n=10 (the whole run) -> 53248 + 2·4096·3 = 77824
//
// A stage is also a phase: with curriculum.phase_policy = "reset" every stage start restarts the
// optimizer and the LR schedule, and a joint run may have several stages at one depth
// (stages = [9, 9]: phase starts at the boundary, no growth there).
struct GrowthSchedule {
  std::vector<int64_t> depths;       // active decoder layers per stage (stages × block_layers), never decreasing
  std::vector<int64_t> stage_steps;  // optimizer steps per stage, each >= 1
  std::vector<int64_t> stage_begin;  // first step of each stage (prefix sums of stage_steps)
  int64_t tokens_per_step = 0;       // global batch tokens per optimizer step

  int num_stages() const { return static_cast<int>(depths.size()); }
  int64_t total_steps() const;
  // Stage trained at `step`, 0 <= step < total_steps() (std::out_of_range otherwise).
  int stage_of(int64_t step) const;
  // Active depth at `step`, same domain as stage_of.
  int64_t depth_at(int64_t step) const { return depths[static_cast<size_t>(stage_of(step))]; }
  int64_t first_step(int stage) const { return stage_begin.at(static_cast<size_t>(stage)); }
  int64_t last_step(int stage) const { return first_step(stage) + stage_steps.at(static_cast<size_t>(stage)) - 1; }
  int64_t final_depth() const { return depths.back(); }
  // True at the first step of every stage but the first: a new phase starts before its forward.
  bool is_phase_start(int64_t step) const;
  // A phase start where the depth increases: grow (append blocks) before its forward.
  bool is_growth_step(int64_t step) const;
  // True at the last step of every stage (eval and diagnostics at stage ends run after it).
  bool is_stage_end(int64_t step) const;
  // Tokens consumed by the first `steps_done` steps (0 <= steps_done <= total_steps()).
  int64_t tokens_after(int64_t steps_done) const;
  // Σ over the first `steps_done` steps of tokens_per_step × active depth (0 <= steps_done <= total).
  int64_t active_layer_tokens_after(int64_t steps_done) const;
  int64_t total_active_layer_tokens() const { return active_layer_tokens_after(total_steps()); }
};

// Global batch tokens per optimizer step: students × micro_batch × grad_accum × seq_len (each
// sequence predicts seq_len next tokens). Example: 4 students × 4 sequences × 2 accum × 1024 = 32768.
int64_t tokens_per_step(const Config& cfg);

// Steps for a token budget: ceil(tokens / tokens_per_step), so a stage never gets fewer tokens than
// asked and overshoots by less than one step. Example: 50M tokens at 32768 per step -> 1526 steps
// (50,003,968 tokens). A budget below one step is an InputError naming `key`:
//   "curriculum.stage_tokens[2] = 100 is less than one step (4096 tokens)".
int64_t steps_for_tokens(int64_t tokens, int64_t tokens_per_step, const std::string& key,
                         const std::string& written);

// Steps of a joint run at `depth` whose active-layer tokens match `active_layer_tokens`, rounded UP:
// steps = ceil(active_layer_tokens / (tokens_per_step × depth)). The matched control therefore gets
// at least the grown run's compute and at most one step (tokens_per_step × depth) more, which can
// only favour the control. Example: the schedule above (77824) at depth 3 -> ceil(77824/12288) = 7
// steps = 86016 active-layer tokens. Throws InputError if active_layer_tokens <= 0.
int64_t joint_steps_for_active_layer_tokens(int64_t active_layer_tokens, int64_t depth,
                                            int64_t tokens_per_step);

// The schedule from a curriculum section. Exactly one of stage_tokens, stage_steps or budget is set
// (validate_config checks it); for `budget` the caller passes the resolved active-layer-token
// target (see resolve_budget) and the single stage gets joint_steps_for_active_layer_tokens.
// `source` (the config file) prefixes error messages when non-empty. Throws InputError.
GrowthSchedule make_growth_schedule(const CurriculumConfig& cur, int64_t tokens_per_step,
                                    int64_t budget_active_layer_tokens = 0, const std::string& source = "");

// The schedule of a whole config: tokens_per_step(cfg), and for budget = "active_layer_tokens:<dir>"
// the other run's record is read (a relative <dir> is taken from the working directory, like
// run.out_dir). Throws InputError naming cfg.source and the key.
GrowthSchedule make_growth_schedule(const Config& cfg);

// ---- Matched budgets -----------------------------------------------------------------------------
// "active_layer_tokens:<run dir>" -> that run's active-layer tokens, from its record
// (run_folder/active_layer_tokens.h). InputError when the string has another form, the record is
// unreadable, or the run is incomplete ("runs/post-grow did not finish:
// active_layer_tokens.json has complete = false after 1200 steps").
int64_t resolve_budget(const std::string& budget);

// ---- Single-block control ------------------------------------------------------------------------
// The control "the first grow stage alone": a joint run whose student has only the first stage's
// depth (one block: 3 layers in the paper's setup) and that trains for the first stage's budget. Everything else
// (width, data, optimizer, distillation) is kept, so the run differs from the grow run's first stage
// only in the LR schedule, which now spans just this stage. Equivalent config edits:
//   --set student.layers=<stages[0] × block_layers> --set curriculum.mode=joint --set curriculum.stages=[stages[0]]
//   --set 'curriculum.stage_tokens=["50M"]'     (the grow run's stage_tokens[0], or stage_steps[0])
// Throws InputError if `grow` is not a grow run with stage_tokens or stage_steps.
Config single_block_control(const Config& grow);

}  // namespace deepen
