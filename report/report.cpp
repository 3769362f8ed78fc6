// Study report: run folders -> roles -> table, comparisons, crossover (see report.h).
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

// A per-class map, either bare ({"first": 1.2, ...}) or diagnostics/boundary_diagnostics.h's
// ClassMeans ({"mean": {...}, "tokens": {...}}).
ClassValues class_values(const json& j) {
  ClassValues out;
  if (j.is_object() && j.contains("mean") && j["mean"].is_object()) return class_values(j["mean"]);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.value().is_number()) out[it.key()] = it.value().get<double>();
  }
  return out;
}

// Finds the first of several spellings of a field, so the report survives small renames in the
// diagnostics record.
const json* field(const json& j, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = j.find(n);
    if (it != j.end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

std::string stat_text(const Stat& s) {
  return fixed(s.mean) + (s.std ? " ± " + fixed(*s.std) : "");
}


double final_ce(const RunData& r) { return r.evals.back().val_ce; }

}  // namespace

uint64_t experiment_signature(const Config& cfg) {
  Config c = without_layout(without_execution_settings(cfg));
  c.run = RunConfig{};
  if (!c.curriculum.budget.empty()) c.curriculum.budget = "active_layer_tokens:matched";
  c.checkpoint = CheckpointConfig{};
  return config_hash(c);
}

std::vector<int64_t> RunData::growth_steps() const {
  std::vector<int64_t> out;
  int64_t begin = 0;
  for (size_t k = 0; k + 1 < stage_steps.size(); ++k) {
    begin += stage_steps[k];
    // A joint run's phase boundaries (same depth on both sides) are no growth.
    if (k + 1 < stage_depths.size() && stage_depths[k + 1] == stage_depths[k]) continue;
    out.push_back(begin);
  }
  return out;
}

bool is_run_dir(const std::string& dir) {
  const RunFolder run(dir);
  return fs::is_regular_file(run.config_toml()) && fs::is_regular_file(run.eval_jsonl());
}

std::vector<std::string> find_run_dirs(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    if (!fs::is_directory(p)) throw InputError(p + ": no such folder");
    if (is_run_dir(p)) {
      out.push_back(fs::path(p).lexically_normal().string());
      continue;
    }
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(p); it != fs::recursive_directory_iterator(); ++it) {
      if (!it->is_directory()) continue;
      const std::string name = it->path().filename().string();
      if (RunFolder::is_inner_folder(name)) {  // never run folders; can be large
        it.disable_recursion_pending();
        continue;
      }
      if (is_run_dir(it->path().string())) {
        found.push_back(it->path().lexically_normal().string());
        it.disable_recursion_pending();
      }
    }
    if (found.empty()) throw InputError(p + ": holds no run folders (config.toml + eval.jsonl)");
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

DiagnosticPoint parse_diagnostic(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(std::string("diagnostics record: not JSON: ") + e.what());
  }
  DiagnosticPoint d;
  d.step = j.value("step", int64_t{0});
  d.stage = j.value("stage", 0);
  d.depth = j.value("depth", int64_t{0});
  d.event = j.value("event", std::string());
  // diagnostics/boundary_diagnostics.h's ResidualScale ({"entering": [...], "boundary": ...}) and
  // IdentityMapping ({"relative_change": ..., "cosine": ...}), under whatever key the trainer uses.
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json& v = it.value();
    if (!v.is_object()) continue;
    if (v.contains("entering") || v.contains("boundary")) {
      if (auto e = v.find("entering"); e != v.end() && e->is_array())
        for (const auto& block : *e) d.residual_rms.push_back(class_values(block));
      if (auto b = v.find("boundary"); b != v.end()) d.boundary_rms = class_values(*b);
    }
    if (v.contains("relative_change") || v.contains("cosine")) {
      if (auto r = v.find("relative_change"); r != v.end()) d.identity_rel = class_values(*r);
      if (auto c = v.find("cosine"); c != v.end()) d.identity_cos = class_values(*c);
    }
  }
  if (const json* r = field(j, {"residual_rms", "block_input_rms"}); r && r->is_array()) {
    for (const auto& block : *r) d.residual_rms.push_back(class_values(block));
  }
  if (const json* b = field(j, {"boundary_rms"})) d.boundary_rms = class_values(*b);
  if (const json* id = field(j, {"identity", "last_block_identity"}); id && id->is_object()) {
    if (const json* rel = field(*id, {"rel_change", "relative_change", "rel", "ratio"})) d.identity_rel = class_values(*rel);
    if (const json* cos = field(*id, {"cos", "cosine"})) d.identity_cos = class_values(*cos);
  }
  if (const json* rel = field(j, {"identity_rel", "identity_rel_change"})) d.identity_rel = class_values(*rel);
  if (const json* cos = field(j, {"identity_cos"})) d.identity_cos = class_values(*cos);
  d.block_layers = j.value("block_layers", int64_t{1});
  const auto summary = [](const json& s) {
    DistributionSummary out;
    out.count = s.value("count", int64_t{0});
    const auto read = [&](const char* key, std::optional<double>& slot) {
      if (auto it = s.find(key); it != s.end() && it->is_number()) slot = it->get<double>();
    };
    read("mean", out.mean);
    read("std", out.std);
    read("kurtosis", out.kurtosis);
    return out;
  };
  if (auto it = j.find("block_rms"); it != j.end() && it->is_array())
    for (const json& b : *it)
      d.block_rms.push_back({summary(b.value("all", json::object())), summary(b.value("document_boundary", json::object())),
                             summary(b.value("regular", json::object()))});
  if (auto it = j.find("block_removal"); it != j.end() && it->is_object()) {
    if (auto f = it->find("full_ce"); f != it->end() && f->is_number()) d.removal_full_ce = f->get<double>();
    for (const json& b : it->value("blocks", json::array()))
      d.block_removal.push_back({b.value("block", int64_t{0}), b.value("ce_without", 0.0), b.value("delta_ce", 0.0),
                                 b.value("angle", 0.0)});
  }
  return d;
}

RunData load_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  const RunFolder run(dir);
  r.config = load_config(run.config_toml());
  if (const std::optional<json> found = read_run_json(dir)) {
    const json& meta = *found;
    r.teacher = meta.value("teacher", std::string());
    r.tokens_per_step = meta.value("tokens_per_step", int64_t{0});
    r.total_steps = meta.value("total_steps", int64_t{0});
    r.stage_depths = meta.value("stage_depths", std::vector<int64_t>{});
    r.stage_steps = meta.value("stage_steps", std::vector<int64_t>{});
  }
  const std::string eval_path = run.eval_jsonl();
  std::map<int64_t, EvalPoint> by_step;  // a record rewritten after a resume replaces the old one
  for (const json& j : read_jsonl(eval_path)) {
    EvalPoint e;
    try {
      e.step = j.at("step").get<int64_t>();
      e.val_ce = j.at("val_ce").get<double>();
    } catch (const json::exception& ex) {
      throw InputError(eval_path + ": record without step/val_ce: " + j.dump());
    }
    e.stage = j.value("stage", 0);
    e.depth = j.value("depth", int64_t{0});
    e.stage_end = j.value("stage_end", false);
    e.tokens = j.value("tokens", int64_t{0});
    e.active_layer_tokens = j.value("active_layer_tokens", int64_t{0});
    if (auto it = j.find("val_kl"); it != j.end() && it->is_number()) e.val_kl = it->get<double>();
    if (auto it = j.find("val_ppl"); it != j.end() && it->is_number()) e.val_ppl = it->get<double>();
    by_step[e.step] = e;
  }
  for (auto& [s, e] : by_step) r.evals.push_back(e);
  const std::string diag_path = run.diagnostics_jsonl();
  for (const json& j : read_jsonl(diag_path)) r.diagnostics.push_back(parse_diagnostic(j.dump()));
  // The training loss by step, for the transition metrics. A record rewritten after a resume
  // replaces the old one; the curve stops at the first missing step.
  if (fs::exists(run.metrics_jsonl())) {
    std::map<int64_t, double> loss;
    for (const json& j : read_jsonl(run.metrics_jsonl()))
      if (j.contains("step") && j.contains("loss") && j["loss"].is_number()) loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    for (const auto& [step, value] : loss) {
      if (step != static_cast<int64_t>(r.train_loss.size())) break;
      r.train_loss.push_back(value);
    }
  }
  if (fs::exists(run.final_token_rms_json())) {
    const std::string path = run.final_token_rms_json();
    try {
      std::ifstream in(path);
      const json j = json::parse(in);
      FinalTokenRms f;
      f.step = j.at("step").get<int64_t>();
      f.block_layers = j.value("block_layers", int64_t{1});
      for (const json& b : j.at("boundaries")) {
        f.document_boundary.push_back(b.at("document_boundary").get<std::vector<double>>());
        f.regular.push_back(b.at("regular").get<std::vector<double>>());
      }
      r.final_token_rms = std::move(f);
    } catch (const json::exception& e) {
      throw InputError(path + ": not a final per-token RMS record: " + e.what());
    }
  }
  if (fs::exists(run.active_layer_tokens_json())) {
    const ActiveLayerTokensRecord a = read_active_layer_tokens(dir);
    r.complete = a.complete;
    r.active_layer_tokens = a.active_layer_tokens;
    r.steps_done = a.steps;
  }
  if (r.stage_steps.empty()) r.stage_depths = stage_depths(r.config.curriculum);  // no run.json: config only
  return r;
}

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
  std::vector<std::pair<uint64_t, std::vector<const RunData*>>> signatures;
};

std::vector<RoleGroup> group_by_role(const std::vector<RunData>& runs, int64_t full_depth, std::vector<std::string>& notes) {
  std::vector<RoleGroup> groups;
  std::map<std::string, int> layout_repeats;  // run dir -> runs on other layouts it stands for
  for (const auto& r : runs) {
    if (r.evals.empty()) {
      notes.push_back(r.dir + ": no eval records yet, left out");
      continue;
    }
    const NormPlacement norm = r.config.student.norm;
    const RunKind kind = run_kind(r.config, r.teacher, full_depth);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const RoleGroup& g) { return g.norm == norm && g.kind == kind; });
    if (group == groups.end()) group = groups.insert(groups.end(), RoleGroup{norm, kind, {}});
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
                           RunKind kind, std::vector<std::string>& notes) {
  std::sort(members.begin(), members.end(),
            [](const RunData* a, const RunData* b) { return a->config.run.seed < b->config.run.seed; });
  RoleSummary s;
  s.role = role;
  s.norm = norm;
  s.kind = kind;
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
    if (!r->complete)
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

// The pre/post crossover of one kind, from the two mean curves at their common eval steps.
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

}  // namespace

const RoleSummary* find_role(const Report& report, NormPlacement norm, RunKind kind) {
  const std::string plain = role_name(norm, kind);
  for (const auto& s : report.roles)
    if (s.role == plain) return &s;
  return nullptr;
}

Report build_report(const std::vector<RunData>& runs) {
  Report report;
  // The study's full depth: the deepest student among the distilled runs (a pretrained teacher in the
  // same folder is deeper and does not count).
  int64_t full_depth = 0;
  for (const auto& r : runs)
    if (run_kind(r.config, r.teacher, 0) != RunKind::kPretrain) full_depth = std::max(full_depth, r.config.student.layers);

  for (const RoleGroup& group : group_by_role(runs, full_depth, report.notes)) {
    const std::string role = role_name(group.norm, group.kind);
    for (size_t g = 0; g < group.signatures.size(); ++g) {
      const auto& members = group.signatures[g].second;
      const std::string name = g == 0 ? role : role + " (" + members.front()->config.run.name + ")";
      if (g > 0)
        report.notes.push_back(name + ": same role as " + role +
                               " but a different configuration (beyond run name, folder, seed); kept apart");
      report.roles.push_back(summarize_role(members, name, group.norm, group.kind, report.notes));
    }
  }
  // Table order: the kinds' order (core runs, controls, pretraining), pre before post, then by name.
  std::stable_sort(report.roles.begin(), report.roles.end(), [](const RoleSummary& a, const RoleSummary& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    if (a.norm != b.norm) return a.norm == NormPlacement::kPre;
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

namespace {

// Which seeds read one data order (data.order_seed, config/config.h): seeds that share an order
// differ only in their initialisation, and may have shared one teacher pass (study.share_teacher).
// Example: seeds 1, 2, 3 with order_seed 7 -> "Data order: seeds 1, 2, 3 read one order
// (data.order_seed 7)."; unset everywhere -> "Data order: each seed reads its own (data.order_seed
// unset: the run seed)."
std::string data_order_text(const Report& r) {
  std::map<int64_t, std::set<int64_t>> seeds_of_order;
  bool all_own = true;
  for (const auto& s : r.roles)
    for (const RunData* run : s.runs) {
      const int64_t order = data_order_seed(run->config);
      seeds_of_order[order].insert(run->config.run.seed);
      all_own = all_own && run->config.data.order_seed < 0;
    }
  if (all_own) return "Data order: each seed reads its own (data.order_seed unset: the run seed).";
  std::string out = "Data order:";
  for (const auto& [order, seeds] : seeds_of_order) {
    std::string list;
    for (int64_t x : seeds) list += (list.empty() ? "" : ", ") + std::to_string(x);
    out += seeds.size() > 1 ? " seeds " + list + " read one order (order seed " + std::to_string(order) + ");"
                            : " seed " + list + " reads order " + std::to_string(order) + ";";
  }
  out.back() = '.';
  return out;
}

}  // namespace

std::string report_markdown(const Report& r) {
  std::ostringstream md;
  md << "# Study report\n\n";
  size_t nruns = 0;
  for (const auto& s : r.roles) nruns += s.runs.size();
  md << nruns << " runs in " << r.roles.size() << " roles. Final = the last eval record of each run "
     << "(validation CE on held-out tokens; KL(teacher‖student) on the same tokens); mean ± sample std over seeds.\n\n";
  md << "## Final validation CE\n\n"
     << "| role | seeds | val CE | val KL | steps | tokens | active-layer tokens | finished |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  for (const auto& s : r.roles) {
    std::string seeds;
    for (int64_t x : s.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(x);
    md << "| " << s.role << " | " << seeds << " | " << stat_text(s.val_ce) << " | "
       << (s.val_kl ? stat_text(*s.val_kl) : "—") << " | " << s.steps << " | " << thousands(s.tokens) << " | "
       << thousands(s.active_layer_tokens) << " | " << (s.complete ? "yes" : "no") << " |\n";
  }
  md << "\n" << data_order_text(r) << "\n";
  if (!r.comparisons.empty()) {
    md << "\n## Comparisons\n\nΔ = difference of mean final validation CE; negative: the first run is better. "
       << "Per seed: the same difference taken seed by seed (mean ± std).\n\n"
       << "| comparison | Δ val CE | per seed | paper | what it tells |\n|---|---|---|---|---|\n";
    for (const auto& c : r.comparisons) {
      std::string paired = "—";
      if (c.paired) paired = signed_fixed(c.paired->mean) + (c.paired->std ? " ± " + fixed(*c.paired->std) : "") +
                             " (n=" + std::to_string(c.paired->n) + ")";
      std::string paper = "—";
      if (c.paper) paper = c.name.rfind("joint", 0) == 0 ? fixed(std::abs(*c.paper)) + " apart" : signed_fixed(*c.paper);
      md << "| " << c.name << " | " << signed_fixed(c.delta) << " | " << paired << " | " << paper << " | "
         << c.question << " |\n";
    }
  }
  for (const auto& x : r.crossovers) {
    md << "\n## Phase-wise crossover: pre-" << option_name(x.kind) << " vs post-" << option_name(x.kind) << "\n\n"
       << "Mean over seeds at each common eval step (" << x.eval_points << " points). Per stage: who leads at "
       << "the stage's last eval point, and the step from which post-norm stays ahead until the stage end.\n\n"
       << "| stage | depth | eval steps | pre val CE | post val CE | leads | post − pre | post ahead from step (tokens) |\n"
       << "|---|---|---|---|---|---|---|---|\n";
    for (const auto& s : x.stages) {
      md << "| " << s.stage << " | " << s.depth << " | " << s.first_step << "–" << s.last_step << " | "
         << fixed(s.pre_ce) << " | " << fixed(s.post_ce) << " | " << s.leader << " | "
         << signed_fixed(s.post_ce - s.pre_ce) << " | "
         << (s.post_ahead_from_step ? std::to_string(*s.post_ahead_from_step) + " (" +
                                          thousands(*s.post_ahead_from_tokens) + ")"
                                    : std::string("—"))
         << " |\n";
    }
    if (x.post_ahead_from_step) {
      md << "\nPost-norm stays ahead of pre-norm from step " << *x.post_ahead_from_step << " ("
         << thousands(*x.post_ahead_from_tokens) << " tokens) to the end.\n";
    } else {
      md << "\nPost-norm is not ahead of pre-norm at the last eval point.\n";
    }
  }
  md << "\n## How runs are matched to roles\n\n"
     << "From each run's config.toml, never its name: `joint` = curriculum.mode \"joint\" at the full depth "
     << "(the deepest student of the report), `joint-matched` = joint with curriculum.budget "
     << "\"active_layer_tokens:<run>\", `joint-long` / `joint-longer` = joint at the full depth over two / three or more phases, `single-block` = joint with fewer layers than the full depth, "
     << "`grow` = mode \"grow\", `freeze` = grow with freeze_prefix; prefixed by student.norm. Runs without a "
     << "teacher are `pretrain`. Runs of one role whose configs differ beyond the run section (name, folder, "
     << "seed), checkpoint and control settings are kept apart.\n";
  if (!r.notes.empty()) {
    md << "\n## Notes\n\n";
    for (const auto& n : r.notes) md << "- " << n << "\n";
  }
  return md.str();
}

std::string report_csv(const Report& r) {
  std::ostringstream csv;
  csv << "role,norm,kind,n,seeds,val_ce_mean,val_ce_std,val_kl_mean,val_kl_std,steps,tokens,active_layer_tokens,complete\n";
  for (const auto& s : r.roles) {
    std::string seeds;
    for (int64_t x : s.seeds) seeds += (seeds.empty() ? "" : " ") + std::to_string(x);
    csv << s.role << "," << option_name(s.norm) << "," << option_name(s.kind) << "," << s.val_ce.n << "," << seeds << ","
        << precise(s.val_ce.mean) << "," << (s.val_ce.std ? precise(*s.val_ce.std) : "") << ","
        << (s.val_kl ? precise(s.val_kl->mean) : "") << "," << (s.val_kl && s.val_kl->std ? precise(*s.val_kl->std) : "")
        << "," << s.steps << "," << s.tokens << "," << s.active_layer_tokens << "," << (s.complete ? 1 : 0) << "\n";
  }
  return csv.str();
}

std::string comparisons_csv(const Report& r) {
  std::ostringstream csv;
  csv << "comparison,a,b,delta,paired_n,paired_mean,paired_std,paper\n";
  for (const auto& c : r.comparisons) {
    csv << "\"" << c.name << "\"," << c.a << "," << c.b << "," << precise(c.delta) << ","
        << (c.paired ? std::to_string(c.paired->n) : "") << "," << (c.paired ? precise(c.paired->mean) : "") << ","
        << (c.paired && c.paired->std ? precise(*c.paired->std) : "") << "," << (c.paper ? precise(*c.paper) : "")
        << "\n";
  }
  return csv.str();
}

std::string runs_csv(const Report& r) {
  std::ostringstream csv;
  csv << "role,run,seed,dir,final_step,val_ce,val_kl,tokens,active_layer_tokens,complete\n";
  for (const auto& s : r.roles) {
    for (const RunData* run : s.runs) {
      const EvalPoint& e = run->evals.back();
      csv << s.role << "," << run->config.run.name << "," << run->config.run.seed << "," << run->dir << "," << e.step
          << "," << precise(e.val_ce) << "," << (e.val_kl ? precise(*e.val_kl) : "") << "," << e.tokens << ","
          << e.active_layer_tokens << "," << (run->complete ? 1 : 0) << "\n";
    }
  }
  return csv.str();
}

Report write_report(const std::vector<std::string>& paths, const ReportOptions& options) {
  std::vector<RunData> runs;
  for (const auto& dir : find_run_dirs(paths)) runs.push_back(load_run(dir));
  Report report = build_report(runs);
  // The runs are read where they ran: this machine's cores are the ones they shared.
  report.sweeps = find_scaling_sweeps(runs, std::max<int64_t>(1, std::thread::hardware_concurrency()));
  fs::create_directories(options.out_dir);
  std::vector<std::string> images;
  if (options.plots) images = write_report_plots(report, options, report.notes);
  std::string md = report_markdown(report) + teacher_sharing_markdown(find_shared_teacher_jobs(paths)) +
                   paper_tables_markdown(report) + scaling_markdown(report.sweeps);
  bool plots_heading = false;
  for (const auto& img : images) {
    // The scaling figures sit in their own section (scaling_markdown links them).
    if (img.rfind("scaling_", 0) == 0 || img.size() <= 4 || img.substr(img.size() - 4) != ".png") continue;
    if (!plots_heading) md += "\n## Plots\n\n";
    plots_heading = true;
    md += "![" + img + "](" + img + ")\n\n";
  }
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path p = fs::path(options.out_dir) / name;
    std::ofstream out(p, std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error(p.string() + ": write failed");
  };
  write("report.md", md);
  write("report.csv", report_csv(report));
  write("comparisons.csv", comparisons_csv(report));
  write("runs.csv", runs_csv(report));
  if (!report.sweeps.empty()) write("scaling.csv", scaling_csv(report.sweeps));
  return report;
}

}  // namespace deepen
