// Reading a run folder for the report (see run_data.h).
#include "report/run_data.h"


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
#include "run_folder/guard_events.h"
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
  if (const std::optional<GuardStop> stop = read_guard_stop(dir))
    r.diverged = "diverged at step " + std::to_string(stop->step) + " (" + stop->reason + ")";
  return r;
}

}  // namespace deepen
