// Growth schedule, active-layer-token accounting and matched budgets (see growth_schedule.h).
#include "curriculum/growth_schedule.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "config/input_error.h"
#include "run_folder/active_layer_tokens.h"

namespace deepen {
namespace {

std::string prefixed(const std::string& source, const std::string& msg) {
  return source.empty() ? msg : source + ": " + msg;
}

// a × b, or InputError naming `what` when it does not fit in int64 (a budget of ~9.2e18).
int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw InputError(what + ": count overflows 64 bits");
  return out;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) throw InputError(what + ": count overflows 64 bits");
  return out;
}

const std::string kBudgetPrefix = "active_layer_tokens:";

}  // namespace

int64_t GrowthSchedule::total_steps() const {
  return stage_begin.empty() ? 0 : stage_begin.back() + stage_steps.back();
}

int GrowthSchedule::stage_of(int64_t step) const {
  if (step < 0 || step >= total_steps())
    throw std::out_of_range("GrowthSchedule: step " + std::to_string(step) + " outside [0, " +
                            std::to_string(total_steps()) + ")");
  // Last stage whose first step is <= step.
  auto it = std::upper_bound(stage_begin.begin(), stage_begin.end(), step);
  return static_cast<int>(it - stage_begin.begin()) - 1;
}

bool GrowthSchedule::is_phase_start(int64_t step) const {
  if (step <= 0 || step >= total_steps()) return false;
  return std::binary_search(stage_begin.begin() + 1, stage_begin.end(), step);
}

bool GrowthSchedule::is_growth_step(int64_t step) const {
  if (!is_phase_start(step)) return false;
  const size_t k = static_cast<size_t>(stage_of(step));
  return depths[k] > depths[k - 1];
}

bool GrowthSchedule::is_stage_end(int64_t step) const {
  if (step < 0 || step >= total_steps()) return false;
  return last_step(stage_of(step)) == step;
}

int64_t GrowthSchedule::tokens_after(int64_t steps_done) const {
  if (steps_done < 0 || steps_done > total_steps())
    throw std::out_of_range("GrowthSchedule: steps_done " + std::to_string(steps_done) + " outside [0, " +
                            std::to_string(total_steps()) + "]");
  return steps_done * tokens_per_step;
}

int64_t GrowthSchedule::active_layer_tokens_after(int64_t steps_done) const {
  if (steps_done < 0 || steps_done > total_steps())
    throw std::out_of_range("GrowthSchedule: steps_done " + std::to_string(steps_done) + " outside [0, " +
                            std::to_string(total_steps()) + "]");
  int64_t total = 0;
  for (size_t k = 0; k < depths.size(); ++k) {
    const int64_t steps = std::clamp<int64_t>(steps_done - stage_begin[k], 0, stage_steps[k]);
    total += steps * tokens_per_step * depths[k];  // no overflow: make_growth_schedule checked the total
  }
  return total;
}

int64_t tokens_per_step(const Config& cfg) {
  const std::string what = prefixed(cfg.source, "tokens per step (parallel.students × micro_batch × grad_accum × data.seq_len)");
  int64_t t = checked_mul(cfg.parallel.students, cfg.parallel.micro_batch, what);
  t = checked_mul(t, cfg.parallel.grad_accum, what);
  t = checked_mul(t, cfg.data.seq_len, what);
  if (t <= 0) throw InputError(what + ": must be > 0, got " + std::to_string(t));
  return t;
}

int64_t steps_for_tokens(int64_t tokens, int64_t tokens_per_step, const std::string& key, const std::string& written) {
  if (tokens_per_step <= 0) throw InputError(key + ": tokens per step must be > 0, got " + std::to_string(tokens_per_step));
  if (tokens < tokens_per_step)
    throw InputError(key + " = " + written + " is less than one step (" + std::to_string(tokens_per_step) + " tokens)");
  return tokens / tokens_per_step + (tokens % tokens_per_step != 0);
}

int64_t joint_steps_for_active_layer_tokens(int64_t active_layer_tokens, int64_t depth, int64_t tokens_per_step) {
  if (active_layer_tokens <= 0)
    throw InputError("curriculum.budget: active-layer-token budget must be > 0, got " + std::to_string(active_layer_tokens));
  if (depth <= 0 || tokens_per_step <= 0)
    throw InputError("curriculum.budget: depth and tokens per step must be > 0, got " + std::to_string(depth) + " and " +
                     std::to_string(tokens_per_step));
  const int64_t per_step = checked_mul(depth, tokens_per_step, "curriculum.budget");
  return active_layer_tokens / per_step + (active_layer_tokens % per_step != 0);
}

GrowthSchedule make_growth_schedule(const CurriculumConfig& cur, int64_t tps, int64_t budget_alt, const std::string& source) {
  if (cur.stages.empty()) throw InputError(prefixed(source, "curriculum.stages: needs at least one stage"));
  if (tps <= 0) throw InputError(prefixed(source, "tokens per step must be > 0, got " + std::to_string(tps)));
  if (cur.block_layers < 1)
    throw InputError(prefixed(source, "curriculum.block_layers: must be >= 1, got " + std::to_string(cur.block_layers)));
  // Grow runs increase; joint runs may repeat their depth (phases at a fixed depth).
  for (size_t k = 0; k < cur.stages.size(); ++k) {
    if (cur.stages[k] < 1 || (k && cur.stages[k] < cur.stages[k - 1]))
      throw InputError(prefixed(source, "curriculum.stages: depths must be >= 1 and never decrease"));
  }
  GrowthSchedule g;
  g.depths = stage_depths(cur);
  g.tokens_per_step = tps;
  try {
    if (!cur.budget.empty()) {
      if (cur.stages.size() != 1)
        throw InputError("curriculum.budget: only a joint (one-stage) run takes an active-layer-token budget");
      g.stage_steps = {joint_steps_for_active_layer_tokens(budget_alt, g.depths[0], tps)};
    } else if (!cur.stage_tokens.empty()) {
      if (cur.stage_tokens.size() != cur.stages.size())
        throw InputError("curriculum.stage_tokens: needs one entry per stage (" + std::to_string(cur.stages.size()) +
                         "), got " + std::to_string(cur.stage_tokens.size()));
      for (size_t k = 0; k < cur.stage_tokens.size(); ++k) {
        const std::string key = "curriculum.stage_tokens[" + std::to_string(k) + "]";
        int64_t tokens = 0;
        try {
          tokens = parse_count(cur.stage_tokens[k]);
        } catch (const std::exception& e) {
          throw InputError(key + ": " + e.what());
        }
        g.stage_steps.push_back(steps_for_tokens(tokens, tps, key, cur.stage_tokens[k]));
      }
    } else if (!cur.stage_steps.empty()) {
      if (cur.stage_steps.size() != cur.stages.size())
        throw InputError("curriculum.stage_steps: needs one entry per stage (" + std::to_string(cur.stages.size()) +
                         "), got " + std::to_string(cur.stage_steps.size()));
      for (size_t k = 0; k < cur.stage_steps.size(); ++k) {
        if (cur.stage_steps[k] < 1)
          throw InputError("curriculum.stage_steps[" + std::to_string(k) + "] = " + std::to_string(cur.stage_steps[k]) +
                           " must be >= 1");
      }
      g.stage_steps = cur.stage_steps;
    } else {
      throw InputError("curriculum: give one of stage_tokens, stage_steps or budget");
    }
    int64_t begin = 0, alt = 0;
    for (size_t k = 0; k < g.stage_steps.size(); ++k) {
      g.stage_begin.push_back(begin);
      begin = checked_add(begin, g.stage_steps[k], "curriculum: total steps");
      alt = checked_add(alt, checked_mul(checked_mul(g.stage_steps[k], tps, "curriculum: tokens"), g.depths[k],
                                         "curriculum: active-layer tokens"),
                        "curriculum: active-layer tokens");
    }
  } catch (const InputError& e) {
    throw InputError(prefixed(source, e.what()));
  }
  return g;
}

GrowthSchedule make_growth_schedule(const Config& cfg) {
  const int64_t tps = tokens_per_step(cfg);
  int64_t budget = 0;
  if (!cfg.curriculum.budget.empty()) {
    try {
      budget = resolve_budget(cfg.curriculum.budget);
    } catch (const InputError& e) {
      throw InputError(prefixed(cfg.source, std::string("curriculum.budget: ") + e.what()));
    }
  }
  return make_growth_schedule(cfg.curriculum, tps, budget, cfg.source);
}

int64_t resolve_budget(const std::string& budget) {
  if (budget.rfind(kBudgetPrefix, 0) != 0 || budget.size() == kBudgetPrefix.size())
    throw InputError("expected \"active_layer_tokens:<run dir>\", got \"" + budget + "\"");
  const std::string dir = budget.substr(kBudgetPrefix.size());
  const ActiveLayerTokensRecord r = read_active_layer_tokens(dir);
  const std::string record_name = std::filesystem::path(active_layer_tokens_path(dir)).filename().string();
  if (!r.complete)
    throw InputError(dir + " did not finish: " + record_name + " has complete = false after " +
                     std::to_string(r.steps) + " steps; a matched budget needs the finished run");
  if (r.active_layer_tokens <= 0)
    throw InputError(active_layer_tokens_path(dir) + ": active_layer_tokens is 0");
  return r.active_layer_tokens;
}

Config single_block_control(const Config& grow) {
  const CurriculumConfig& cur = grow.curriculum;
  if (cur.mode != CurriculumMode::kGrow || cur.stages.empty() || (cur.stage_tokens.empty() && cur.stage_steps.empty()))
    throw InputError(prefixed(grow.source, "single-block control needs a grow run with stage_tokens or stage_steps"));
  Config out = grow;
  out.student.layers = cur.stages[0] * cur.block_layers;
  out.curriculum.mode = CurriculumMode::kJoint;
  out.curriculum.stages = {cur.stages[0]};
  out.curriculum.stage_tokens = cur.stage_tokens.empty() ? std::vector<std::string>{} : std::vector<std::string>{cur.stage_tokens[0]};
  out.curriculum.stage_steps = cur.stage_steps.empty() ? std::vector<int64_t>{} : std::vector<int64_t>{cur.stage_steps[0]};
  out.curriculum.budget.clear();
  out.curriculum.freeze_prefix = false;
  out.curriculum.rewarmup_steps = 0;  // there is no growth to re-warm after
  validate_config(out);
  return out;
}

}  // namespace deepen
