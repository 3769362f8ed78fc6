// The study file: parsing, expansion into ordered jobs, budget references and teacher groups.
#include "study/study_plan.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>

#include <toml++/toml.h>

#include "config/input_error.h"
#include "config/text_file.h"
#include "config/toml_text.h"
#include "study/table_reader.h"
#include "study/teacher_groups.h"

namespace deepen {
namespace fs = std::filesystem;
namespace {

const std::string kBudgetPrefix = "active_layer_tokens:";

bool valid_run_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::string join_path(const std::string& a, const std::string& b) { return (fs::path(a) / b).string(); }

std::string normalized(const std::string& path) { return normalized_path(path); }

// The stable topological order: repeatedly take the earliest job (in expansion order) whose
// dependencies are all placed. O(n²), fine for the dozens of jobs a study has.
std::vector<size_t> stable_topological_order(const std::vector<std::vector<size_t>>& deps,
                                             const std::vector<std::string>& names, const std::string& source) {
  const size_t n = deps.size();
  std::vector<bool> placed(n, false);
  std::vector<size_t> order;
  while (order.size() < n) {
    bool progress = false;
    for (size_t i = 0; i < n; ++i) {
      if (placed[i]) continue;
      const bool ready = std::all_of(deps[i].begin(), deps[i].end(), [&](size_t d) { return placed[d]; });
      if (!ready) continue;
      placed[i] = true;
      order.push_back(i);
      progress = true;
      break;
    }
    if (!progress) {
      std::string cycle;
      for (size_t i = 0; i < n; ++i)
        if (!placed[i]) cycle += (cycle.empty() ? "" : ", ") + names[i];
      throw InputError(source + ": budget references form a cycle among " + cycle);
    }
  }
  return order;
}

}  // namespace

std::string normalized_path(const std::string& path) {
  return fs::weakly_canonical(fs::absolute(path)).lexically_normal().string();
}

std::optional<std::string> budget_folder(const Config& cfg) {
  const std::string& budget = cfg.curriculum.budget;
  if (budget.rfind(kBudgetPrefix, 0) != 0) return std::nullopt;
  return budget.substr(kBudgetPrefix.size());
}

StudySpec parse_study(const std::string& toml_text, const std::string& source) {
  const toml::table root = parse_toml(toml_text, source);
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "study" && key != "run" && key != "group")
      throw InputError(source + ": [" + key + "]: unknown section (a study file has [study], [[run]] and [[group]])");
  }
  StudySpec spec;
  spec.source = source;
  const toml::table* study = root["study"].as_table();
  if (!study) throw InputError(source + ": [study]: missing (name, base, out_dir, seeds, ...)");
  TableReader r(*study, source, "study");
  r.string("name", spec.name);
  std::string base;
  r.string("base", base);
  r.string("out_dir", spec.out_dir);
  r.integers("seeds", spec.seeds);
  std::string command = option_name(spec.command), launcher = option_name(spec.launcher),
              group_by = option_name(spec.group_by);
  r.string("group_by", group_by);
  r.string("command", command);
  r.string("launcher", launcher);
  r.strings("set", spec.sets);
  r.boolean("share_teacher", spec.share_teacher);
  if (study->get("max_group_runs")) {
    const toml::node* n = study->get("max_group_runs");
    if (!n->is_integer() || n->as_integer()->get() < 0) r.fail("max_group_runs", "expected an integer >= 0 (0 = no cap)");
    spec.max_group_runs = n->as_integer()->get();
  }
  r.known("max_group_runs");
  std::string teacher = option_name(spec.teacher);
  r.string("teacher", teacher);
  r.string("cache_dir", spec.cache_dir);
  if (const toml::node* n = study->get("cache_parts")) {
    if (!n->is_integer() || n->as_integer()->get() < 1) r.fail("cache_parts", "expected an integer >= 1");
    spec.cache_parts = n->as_integer()->get();
  }
  r.known("cache_parts");
  r.reject_unknown();
  spec.teacher = parse_option<StudyTeacher>(teacher, source + ": study.teacher");
  if (base.empty()) r.fail("base", "required: the base config, relative to the study file");
  spec.base = fs::path(base).is_absolute() ? base : (fs::path(source).parent_path() / base).lexically_normal().string();
  if (spec.out_dir.empty()) r.fail("out_dir", "must not be empty");
  if (spec.seeds.empty()) r.fail("seeds", "needs at least one seed");
  if (std::set<int64_t>(spec.seeds.begin(), spec.seeds.end()).size() != spec.seeds.size())
    r.fail("seeds", "seeds must be distinct");
  spec.command = parse_option<StudyCommand>(command, source + ": study.command");
  spec.launcher = parse_option<Launcher>(launcher, source + ": study.launcher");
  spec.group_by = parse_option<GroupBy>(group_by, source + ": study.group_by");

  const toml::array* runs = root["run"].as_array();
  if (!runs || runs->empty()) throw InputError(source + ": [[run]]: a study needs at least one run");
  std::set<std::string> names;
  for (size_t i = 0; i < runs->size(); ++i) {
    const toml::table* t = (*runs)[i].as_table();
    if (!t) throw InputError(source + ": run[" + std::to_string(i) + "]: expected a [[run]] table");
    StudyRunSpec run;
    TableReader rr(*t, source, "run[" + std::to_string(i) + "]");
    rr.string("name", run.name);
    rr.strings("set", run.sets);
    rr.integers("seeds", run.seeds);
    rr.reject_unknown();
    if (!valid_run_name(run.name))
      rr.fail("name", "must be a folder name of letters, digits, '-', '_' or '.', got \"" + run.name + "\"");
    if (!names.insert(run.name).second) rr.fail("name", "duplicate run name \"" + run.name + "\"");
    spec.runs.push_back(std::move(run));
  }
  if (const toml::node* groups = root.get("group")) {
    const toml::array* list = groups->as_array();
    if (!list) throw InputError(source + ": [[group]]: expected tables of runs = [...]");
    std::set<std::string> listed;
    for (size_t i = 0; i < list->size(); ++i) {
      const toml::table* t = (*list)[i].as_table();
      if (!t) throw InputError(source + ": group[" + std::to_string(i) + "]: expected a [[group]] table");
      TableReader gr(*t, source, "group[" + std::to_string(i) + "]");
      std::vector<std::string> runs_of;
      gr.strings("runs", runs_of);
      gr.reject_unknown();
      if (runs_of.empty()) gr.fail("runs", "a group lists at least one run");
      for (const std::string& name : runs_of) {
        if (!names.count(name)) gr.fail("runs", "\"" + name + "\" is no [[run]] of the study");
        if (!listed.insert(name).second) gr.fail("runs", "\"" + name + "\" is listed in two groups");
      }
      spec.groups.push_back(std::move(runs_of));
    }
    if (study->get("group_by") && spec.group_by != GroupBy::kListed)
      r.fail("group_by", "the study lists its [[group]]s: \"listed\" (or leave it out)");
    spec.group_by = GroupBy::kListed;
  } else if (spec.group_by == GroupBy::kListed) {
    r.fail("group_by", "\"listed\" needs [[group]] tables naming the runs of each group");
  }
  return spec;
}

StudySpec load_study(const std::string& path) {
  return parse_study(read_file_text(path, "study file"), path);
}

StudyPlan expand_study(const StudySpec& spec, const std::vector<std::string>& extra_sets,
                       const std::vector<std::string>& only) {
  std::set<std::string> run_names;
  for (const auto& r : spec.runs) run_names.insert(r.name);
  for (const auto& o : only)
    if (!run_names.count(o)) throw InputError(spec.source + ": --only " + o + ": no such run in the study");
  if (!fs::exists(spec.base)) throw InputError(spec.source + ": study.base: " + spec.base + ": no such file");

  // Expansion order: seed by seed, runs in file order.
  std::vector<int64_t> all_seeds = spec.seeds;
  for (const auto& r : spec.runs)
    for (int64_t s : r.seeds)
      if (std::find(all_seeds.begin(), all_seeds.end(), s) == all_seeds.end()) all_seeds.push_back(s);
  // teacher = "cache": one cache for every run, made first from the base config and the study's set.
  std::optional<StudyCacheJob> cache;
  std::vector<std::string> cache_sets;
  if (spec.teacher == StudyTeacher::kCache) {
    if (spec.command != StudyCommand::kTrain)
      throw InputError(spec.source + ": study.teacher = \"cache\": only \"train\" runs have a teacher");
    if (spec.share_teacher)
      throw InputError(spec.source + ": study.share_teacher: runs from a teacher cache (study.teacher = \"cache\") have "
                       "no teacher pass to share; set one of them");
    cache.emplace();
    cache->dir = spec.cache_dir.empty() ? join_path(spec.out_dir, "cache") : spec.cache_dir;
    cache_sets = {"distill.source=\"cache\"", "cache.dir=" + toml_quote(cache->dir)};
    cache->overrides = spec.sets;
    cache->overrides.insert(cache->overrides.end(), extra_sets.begin(), extra_sets.end());
    cache->overrides.push_back("cache.dir=" + toml_quote(cache->dir));
    try {
      cache->config = load_config(spec.base, cache->overrides);
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) + " (study " + spec.source + ", its teacher cache)");
    }
  }
  std::vector<StudyJob> jobs;
  std::map<std::pair<std::string, int64_t>, size_t> index;
  for (int64_t seed : all_seeds) {
    for (const auto& r : spec.runs) {
      const auto& seeds = r.seeds.empty() ? spec.seeds : r.seeds;
      if (std::find(seeds.begin(), seeds.end(), seed) == seeds.end()) continue;
      StudyJob job;
      job.run = r.name;
      job.seed = seed;
      job.out_dir = join_path(join_path(spec.out_dir, r.name), "seed" + std::to_string(seed));
      job.overrides = spec.sets;
      job.overrides.insert(job.overrides.end(), r.sets.begin(), r.sets.end());
      job.overrides.insert(job.overrides.end(), extra_sets.begin(), extra_sets.end());
      job.overrides.push_back("run.name=" + toml_quote(r.name));
      job.overrides.push_back("run.out_dir=" + toml_quote(job.out_dir));
      job.overrides.push_back("run.seed=" + std::to_string(seed));
      job.overrides.insert(job.overrides.end(), cache_sets.begin(), cache_sets.end());
      index[{r.name, seed}] = jobs.size();
      jobs.push_back(std::move(job));
    }
  }

  // Resolve configs and budget references.
  std::map<std::string, size_t> by_dir;
  for (size_t i = 0; i < jobs.size(); ++i) by_dir[normalized(jobs[i].out_dir)] = i;
  std::vector<std::vector<size_t>> deps(jobs.size());
  std::vector<std::string> names;
  for (size_t i = 0; i < jobs.size(); ++i) {
    StudyJob& job = jobs[i];
    names.push_back(job.id());
    try {
      job.config = load_config(spec.base, job.overrides);
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) + " (study " + spec.source + ", run " + job.id() + ")");
    }
    const std::string& budget = job.config.curriculum.budget;
    if (budget.rfind(kBudgetPrefix, 0) == 0) {
      const std::string target = budget.substr(kBudgetPrefix.size());
      std::optional<size_t> dep;
      if (run_names.count(target)) {
        auto it = index.find({target, job.seed});
        if (it == index.end())
          throw InputError(spec.source + ": run " + job.id() + ": curriculum.budget names run \"" + target +
                           "\", which has no seed " + std::to_string(job.seed));
        dep = it->second;
        // The run's own budget override (the last one given) now names the folder.
        const std::string resolved = "curriculum.budget=" + toml_quote(kBudgetPrefix + jobs[*dep].out_dir);
        auto last = std::find_if(job.overrides.rbegin(), job.overrides.rend(),
                                 [](const std::string& o) { return o.rfind("curriculum.budget", 0) == 0; });
        if (last != job.overrides.rend()) {
          *last = resolved;
        } else {
          job.overrides.push_back(resolved);  // the base config named the run
        }
        job.config = load_config(spec.base, job.overrides);
      } else if (auto it = by_dir.find(normalized(target)); it != by_dir.end()) {
        dep = it->second;
      }
      if (dep) {
        if (*dep == i) throw InputError(spec.source + ": run " + job.id() + ": curriculum.budget names the run itself");
        deps[i].push_back(*dep);
      }
    }
    const auto& p = job.config.parallel;
    job.world_size = cache ? p.students : p.teacher_pipelines * p.teacher_stages + p.students;
    if (cache)
      if (auto why = cache_share_difference(cache->config, job.config))
        throw InputError(spec.source + ": run " + job.id() + " cannot train from the study's teacher cache: " + *why +
                         " (the cache is made from study.base with the study's set)");
  }

  const std::vector<size_t> order = stable_topological_order(deps, names, spec.source);
  std::vector<size_t> position(jobs.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  StudyPlan plan;
  plan.spec = spec;
  plan.cache = cache;
  for (size_t k = 0; k < order.size(); ++k) {
    StudyJob job = jobs[order[k]];
    job.depends_on.clear();
    for (size_t d : deps[order[k]]) job.depends_on.push_back(position[d]);
    plan.jobs.push_back(std::move(job));
  }
  if (!only.empty()) {
    // Keep the selected runs; renumber dependencies, dropping the ones outside the selection
    // (run_study checks those have finished).
    std::vector<long> new_index(plan.jobs.size(), -1);
    std::vector<StudyJob> kept;
    for (size_t k = 0; k < plan.jobs.size(); ++k) {
      if (std::find(only.begin(), only.end(), plan.jobs[k].run) == only.end()) continue;
      new_index[k] = static_cast<long>(kept.size());
      kept.push_back(plan.jobs[k]);
    }
    for (auto& job : kept) {
      std::vector<size_t> d;
      for (size_t old : job.depends_on)
        if (new_index[old] >= 0) d.push_back(static_cast<size_t>(new_index[old]));
      job.depends_on = d;
    }
    plan.jobs = std::move(kept);
  }
  if (spec.share_teacher) {
    if (spec.command != StudyCommand::kTrain)
      throw InputError(spec.source + ": study.share_teacher: only \"train\" runs have a teacher to share");
    if (spec.launcher == Launcher::kDirect)
      throw InputError(spec.source + ": study.share_teacher: a shared teacher is a job of several ranks; "
                       "study.launcher = \"direct\" runs one process per run (use \"auto\" or \"mpirun\")");
    plan.groups = plan_teacher_groups(plan.jobs, static_cast<size_t>(spec.max_group_runs), spec.group_by, spec.groups);
  }
  return plan;
}

std::optional<std::string> cache_share_difference(const Config& cache, const Config& run) {
  auto shortest = [](double x) {  // the shortest text that reads back as x: 1 -> "1"
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
  };
  std::vector<std::tuple<std::string, std::string, std::string>> keys = {
      {"data.tokenizer", cache.data.tokenizer, run.data.tokenizer},
      {"data.train", cache.data.train, run.data.train},
      {"data.valid", cache.data.valid, run.data.valid},
      {"data.packing", option_name(cache.data.packing), option_name(run.data.packing)},
      {"teacher.checkpoint", cache.teacher.checkpoint, run.teacher.checkpoint},
      {"teacher.dtype", option_name(cache.teacher.dtype), option_name(run.teacher.dtype)},
      {"distill.temperature", shortest(cache.distill.temperature), shortest(run.distill.temperature)},
      {"cache.samples", std::to_string(cache.cache.samples), std::to_string(run.cache.samples)},
      {"cache.seed", std::to_string(cache.cache.seed), std::to_string(run.cache.seed)},
      {"cache.train_sequences", std::to_string(cache.cache.train_sequences), std::to_string(run.cache.train_sequences)},
      {"cache.valid_sequences", std::to_string(cache.cache.valid_sequences), std::to_string(run.cache.valid_sequences)}};
  if (run.data.packing == Packing::kDocuments)
    keys.emplace_back("data.max_len", std::to_string(cache.data.max_len), std::to_string(run.data.max_len));
  else
    keys.emplace_back("data.seq_len", std::to_string(cache.data.seq_len), std::to_string(run.data.seq_len));
  if (run.cache.targets == CacheTargets::kTopk)
    keys.emplace_back("cache.topk", std::to_string(cache.cache.topk), std::to_string(run.cache.topk));
  for (const auto& [key, a, b] : keys)
    if (a != b) return key + ": " + a + " vs " + b;
  return std::nullopt;
}

bool use_mpirun(Launcher launcher, int64_t world_size, bool mpirun_available) {
  if (launcher == Launcher::kDirect) return false;
  if (launcher == Launcher::kMpirun) {
    if (!mpirun_available) throw InputError("study.launcher = \"mpirun\", but no mpirun in PATH");
    return true;
  }
  return world_size > 2 && mpirun_available;
}

int64_t job_tasks(const StudyPlan& plan, const StudyJob& job) {
  return use_mpirun(plan.spec.launcher, job.world_size, true) ? job.world_size : 1;
}

std::vector<StudyGroup> study_units(const StudyPlan& plan) {
  if (!plan.groups.empty()) return plan.groups;
  std::vector<StudyGroup> units;
  for (size_t k = 0; k < plan.jobs.size(); ++k) units.push_back(StudyGroup{{k}, {}});
  return units;
}

std::vector<StudyGroup> plan_teacher_groups(const std::vector<StudyJob>& jobs, size_t max_runs, GroupBy by,
                                            const std::vector<std::vector<std::string>>& listed) {
  std::vector<GroupCandidate> candidates;
  for (const StudyJob& j : jobs) {
    std::string label;
    for (size_t g = 0; g < listed.size(); ++g)
      if (std::find(listed[g].begin(), listed[g].end(), j.run) != listed[g].end()) label = "group " + std::to_string(g);
    candidates.push_back(GroupCandidate{j.id(), j.config, j.depends_on, label});
  }
  std::vector<StudyGroup> out;
  for (TeacherGroup& g : group_for_teacher(candidates, max_runs, by))
    out.push_back(StudyGroup{std::move(g.members), std::move(g.refused)});
  return out;
}

int64_t group_world_size(const StudyPlan& plan, const StudyGroup& group) {
  const ParallelConfig& p = plan.jobs.at(group.members.front()).config.parallel;
  return p.teacher_pipelines * p.teacher_stages + static_cast<int64_t>(group.members.size()) * p.students;
}

std::string group_dir(const StudyPlan& plan, size_t index) {
  return join_path(join_path(plan.spec.out_dir, "groups"), "g" + std::to_string(index));
}

GroupSpec group_spec(const StudyPlan& plan, size_t index, const std::vector<size_t>& members) {
  GroupSpec g;
  g.source = join_path(group_dir(plan, index), "group.toml");
  g.name = plan.spec.name + "-g" + std::to_string(index);
  g.out_dir = join_path(group_dir(plan, index), "job");
  for (size_t k : members) g.runs.push_back(GroupRunSpec{plan.spec.base, plan.jobs.at(k).overrides});
  return g;
}

}  // namespace deepen
