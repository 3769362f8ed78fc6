// Study report: runs -> roles -> statistics, comparisons, crossover (see report.h).
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/layout_label.h"
#include "report/cache_runs.h"
#include "report/number_text.h"
#include "report/paper_tables.h"
#include "report/report_plots.h"
#include "report/scaling.h"
#include "report/teacher_sharing.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/jsonl.h"
#include "run_folder/run_folder.h"
#include "run_folder/run_info.h"

namespace deepen {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double final_ce(const RunData& r) { return r.evals.back().val_ce; }

}  // namespace

Stat stat(const std::vector<double>& values) {
  Stat s;
  s.n = static_cast<int>(values.size());
  if (values.empty()) return s;
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / s.n;
  if (s.n >= 2) {
    double sq = 0;
    for (double v : values) sq += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(sq / (s.n - 1));
  }
  return s;
}

std::optional<size_t> stays_ahead_from(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  if (n == 0 || !(a[n - 1] < b[n - 1])) return std::nullopt;
  size_t from = n - 1;
  while (from > 0 && a[from - 1] < b[from - 1]) --from;
  return from;
}

std::vector<CurvePoint> mean_curve(const RoleSummary& role) {
  std::vector<CurvePoint> out;
  if (role.runs.empty()) return out;
  for (const EvalPoint& e : role.runs.front()->evals) {
    double sum = 0;
    bool everywhere = true;
    for (const RunData* r : role.runs) {
      auto it = std::find_if(r->evals.begin(), r->evals.end(), [&](const EvalPoint& x) { return x.step == e.step; });
      if (it == r->evals.end()) {
        everywhere = false;
        break;
      }
      sum += it->val_ce;
    }
    if (everywhere) out.push_back({e.step, e.tokens, sum / static_cast<double>(role.runs.size()), e.stage});
  }
  return out;
}

namespace {

// Runs grouped by role, then by experiment signature (a role's first signature keeps the plain role
// name); a run of the same experiment and seed on another layout stands aside (the scaling section).
struct RoleGroup {
  NormPlacement norm;
  RunKind kind;
  GrowInit op;
  std::vector<std::pair<uint64_t, std::vector<const RunData*>>> signatures;
};

// Whether the distilled runs use more than one growth operator (then the operator is part of every role).
bool several_operators(const std::vector<RunData>& runs) {
  std::set<GrowInit> ops;
  for (const auto& r : runs)
    if (run_kind(r.config, r.teacher, 0) != RunKind::kPretrain) ops.insert(r.config.curriculum.grow_init);
  return ops.size() > 1;
}

std::vector<RoleGroup> group_by_role(const std::vector<RunData>& runs, int64_t full_depth, std::vector<std::string>& notes) {
  std::vector<RoleGroup> groups;
  const bool by_operator = several_operators(runs);
  std::map<std::string, int> layout_repeats;  // run dir -> runs on other layouts it stands for
  for (const auto& r : runs) {
    if (r.evals.empty()) {
      notes.push_back(r.dir + ": no eval records yet, left out");
      continue;
    }
    const NormPlacement norm = r.config.student.norm;
    const RunKind kind = run_kind(r.config, r.teacher, full_depth);
    // One operator: every run in its (norm, kind) role as before, whatever it names.
    const GrowInit op = r.config.curriculum.grow_init;
    auto group = std::find_if(groups.begin(), groups.end(), [&](const RoleGroup& g) {
      return g.norm == norm && g.kind == kind && (!by_operator || g.op == op);
    });
    if (group == groups.end()) group = groups.insert(groups.end(), RoleGroup{norm, kind, op, {}});
    auto& sigs = group->signatures;
    const uint64_t sig = experiment_signature(r.config);
    auto it = std::find_if(sigs.begin(), sigs.end(), [&](const auto& g) { return g.first == sig; });
    if (it == sigs.end()) it = sigs.insert(sigs.end(), {sig, {}});
    // The same experiment and seed on another layout (a layout sweep, or the same T, P, S in
    // another rank order or sharding): one run stands for the seed in the tables; the others are
    // in the scaling section. The same seed on the same layout is a repeat (noted later).
    const auto same_seed = std::find_if(it->second.begin(), it->second.end(), [&](const RunData* o) {
      return o->config.run.seed == r.config.run.seed && layout_label(o->config.parallel) != layout_label(r.config.parallel);
    });
    if (same_seed != it->second.end()) {
      ++layout_repeats[(*same_seed)->dir];
      continue;
    }
    it->second.push_back(&r);
  }
  for (const auto& [dir, n] : layout_repeats)
    notes.push_back(dir + ": stands for " + std::to_string(n) + " run(s) of the same experiment and seed on " +
                    "other layouts (see the scaling section)");
  return groups;
}

// One configuration of one role over its seeds: final CE and KL statistics, steps and tokens.
RoleSummary summarize_role(std::vector<const RunData*> members, const std::string& role, NormPlacement norm,
                           RunKind kind, GrowInit op, std::vector<std::string>& notes) {
  std::sort(members.begin(), members.end(),
            [](const RunData* a, const RunData* b) { return a->config.run.seed < b->config.run.seed; });
  RoleSummary s;
  s.role = role;
  s.norm = norm;
  s.kind = kind;
  s.op = op;
  s.runs = members;
  std::vector<double> ce, kl;
  std::set<int64_t> seen;
  for (const RunData* r : members) {
    s.seeds.push_back(r->config.run.seed);
    if (!seen.insert(r->config.run.seed).second)
      notes.push_back(s.role + ": seed " + std::to_string(r->config.run.seed) + " appears twice (" + r->dir + ")");
    ce.push_back(final_ce(*r));
    if (r->evals.back().val_kl) kl.push_back(*r->evals.back().val_kl);
    s.complete &= r->complete;
    if (!r->diverged.empty())
      notes.push_back(r->config.run.name + " " + r->diverged + ": " + r->dir + "'s guard.jsonl; its last eval record "
                      "(after step " + std::to_string(r->evals.back().step) + ") is used");
    else if (!r->complete)
      notes.push_back(r->dir + ": unfinished (" + std::to_string(r->evals.back().step + 1) + " of " +
                      std::to_string(r->total_steps) + " steps); its last eval record is used");
  }
  s.val_ce = stat(ce);
  if (kl.size() == members.size()) s.val_kl = stat(kl);
  const EvalPoint& last = members.front()->evals.back();
  s.steps = last.step + 1;
  s.tokens = last.tokens;
  s.active_layer_tokens = last.active_layer_tokens;
  return s;
}

// Every comparison the study asks for whose two roles are present.
void add_comparisons(Report& report) {
  using K = RunKind;
  constexpr NormPlacement pre = NormPlacement::kPre, post = NormPlacement::kPost;
  auto compare = [&](const std::string& name, NormPlacement na, K ka, NormPlacement nb, K kb, const std::string& question,
                     std::optional<double> paper = std::nullopt) {
    const RoleSummary* ra = find_role(report, na, ka);
    const RoleSummary* rb = find_role(report, nb, kb);
    if (!ra || !rb) return;
    Comparison c{name, ra->role, rb->role, question, ra->val_ce.mean - rb->val_ce.mean, std::nullopt, paper};
    std::vector<double> diffs;
    for (const RunData* x : ra->runs)
      for (const RunData* y : rb->runs)
        if (x->config.run.seed == y->config.run.seed) diffs.push_back(final_ce(*x) - final_ce(*y));
    if (!diffs.empty()) c.paired = stat(diffs);
    report.comparisons.push_back(c);
  };
  compare("joint: post − pre", post, K::kJoint, pre, K::kJoint,
          "does placement matter when every block trains from step 0? (paper: 0.0004 apart)", 0.0004);
  compare("grow: post − pre", post, K::kGrow, pre, K::kGrow,
          "does placement matter under the growth curriculum? (paper: post-norm better by 0.0328)", -0.0328);
  compare("matched: post-grow − post-joint-matched", post, K::kGrow, post, K::kJointMatched,
          "is growth's result just different compute? (same active-layer tokens)");
  compare("matched: pre-grow − pre-joint-matched", pre, K::kGrow, pre, K::kJointMatched, "the same for pre-norm");
  compare("single-block: post − pre", post, K::kSingleBlock, pre, K::kSingleBlock,
          "does post-norm simply make a better shallow block? (near 0: no)");
  compare("freeze: post − pre", post, K::kFreeze, pre, K::kFreeze,
          "does the post-norm gain come from retraining the prefix? (gain kept under freeze: no)");
  compare("post: grow − joint", post, K::kGrow, post, K::kJoint, "the curriculum's effect on post-norm");
  compare("pre: grow − joint", pre, K::kGrow, pre, K::kJoint, "the curriculum's effect on pre-norm");
  compare("post: freeze − grow", post, K::kFreeze, post, K::kGrow, "what retraining the prefix is worth (post-norm)");
  compare("pre: freeze − grow", pre, K::kFreeze, pre, K::kGrow, "what retraining the prefix is worth (pre-norm)");
}

std::vector<double> ce_between(const std::vector<CurvePoint>& v, size_t lo, size_t hi) {
  std::vector<double> out;
  for (size_t i = lo; i < hi; ++i) out.push_back(v[i].val_ce);
  return out;
}

}  // namespace

std::optional<Crossover> crossover(const RoleSummary& pre, const RoleSummary& post) {
  const auto cpre = mean_curve(pre);
  const auto cpost = mean_curve(post);
  std::vector<CurvePoint> a, b;  // post, pre at common steps
  for (const auto& p : cpost) {
    auto it = std::find_if(cpre.begin(), cpre.end(), [&](const CurvePoint& q) { return q.step == p.step; });
    if (it != cpre.end()) {
      a.push_back(p);
      b.push_back(*it);
    }
  }
  if (a.empty()) return std::nullopt;
  Crossover x;
  x.kind = post.kind;
  x.eval_points = static_cast<int64_t>(a.size());
  if (auto from = stays_ahead_from(ce_between(a, 0, a.size()), ce_between(b, 0, b.size()))) {
    x.post_ahead_from_step = a[*from].step;
    x.post_ahead_from_tokens = a[*from].tokens;
  }
  const RunData& ref = *post.runs.front();
  for (size_t lo = 0, hi = 0; lo < a.size(); lo = hi) {
    while (hi < a.size() && a[hi].stage == a[lo].stage) ++hi;
    StageCrossover s;
    s.stage = a[lo].stage;
    s.depth = s.stage < static_cast<int>(ref.stage_depths.size()) ? ref.stage_depths[static_cast<size_t>(s.stage)] : 0;
    s.first_step = a[lo].step;
    s.last_step = a[hi - 1].step;
    s.post_ce = a[hi - 1].val_ce;
    s.pre_ce = b[hi - 1].val_ce;
    s.leader = s.post_ce < s.pre_ce ? "post" : s.pre_ce < s.post_ce ? "pre" : "tie";
    if (auto from = stays_ahead_from(ce_between(a, lo, hi), ce_between(b, lo, hi))) {
      s.post_ahead_from_step = a[lo + *from].step;
      s.post_ahead_from_tokens = a[lo + *from].tokens;
    }
    x.stages.push_back(s);
  }
  return x;
}

const RoleSummary* find_role(const Report& report, NormPlacement norm, RunKind kind) {
  const std::string plain = role_name(norm, kind);
  for (const auto& s : report.roles)
    if (s.role == plain) return &s;
  return nullptr;
}

const RoleSummary* find_role(const Report& report, NormPlacement norm, RunKind kind, GrowInit op) {
  for (const auto& s : report.roles)  // a role's first configuration comes first
    if (s.norm == norm && s.kind == kind && s.op == op) return &s;
  return nullptr;
}

Report build_report(const std::vector<RunData>& runs) {
  Report report;
  // The study's full depth: the deepest student among the distilled runs (a pretrained teacher in the
  // same folder is deeper and does not count).
  int64_t full_depth = 0;
  for (const auto& r : runs)
    if (run_kind(r.config, r.teacher, 0) != RunKind::kPretrain) full_depth = std::max(full_depth, r.config.student.layers);

  const bool by_operator = several_operators(runs);
  for (const RoleGroup& group : group_by_role(runs, full_depth, report.notes)) {
    const std::string role =
        role_name(group.norm, group.kind) + (by_operator ? std::string("+") + option_name(group.op) : std::string());
    for (size_t g = 0; g < group.signatures.size(); ++g) {
      const auto& members = group.signatures[g].second;
      const std::string name = g == 0 ? role : role + " (" + members.front()->config.run.name + ")";
      if (g > 0)
        report.notes.push_back(name + ": same role as " + role +
                               " but a different configuration (beyond run name, folder, seed); kept apart");
      report.roles.push_back(summarize_role(members, name, group.norm, group.kind, group.op, report.notes));
    }
  }
  for (std::string& note : cache_run_notes(runs)) report.notes.push_back(std::move(note));
  // Table order: the kinds' order (core runs, controls, pretraining), the placements' order (pre,
  // post, peri, mix, pre_scaled), then by name.
  std::stable_sort(report.roles.begin(), report.roles.end(), [](const RoleSummary& a, const RoleSummary& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    if (a.norm != b.norm) return a.norm < b.norm;
    return a.role < b.role;
  });
  add_comparisons(report);
  for (const RunKind kind : {RunKind::kGrow, RunKind::kFreeze, RunKind::kJoint}) {
    const RoleSummary* pre = find_role(report, NormPlacement::kPre, kind);
    const RoleSummary* post = find_role(report, NormPlacement::kPost, kind);
    if (!pre || !post) continue;
    if (auto x = crossover(*pre, *post)) report.crossovers.push_back(*x);
  }
  return report;
}

}  // namespace deepen
