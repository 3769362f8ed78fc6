// Study expansion, ordering, local execution and Slurm scripts (see study.h).
#include "study/study.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "config/input_error.h"
#include "config/layout_label.h"
#include "config/text_file.h"
#include "config/toml_text.h"
#include "curriculum/growth_schedule.h"
#include "run_folder/progress.h"
#include "run_folder/run_folder.h"
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

// A whole text file, or std::runtime_error naming it: a study never runs a job from a half-written file.
void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(path + ": write failed");
}

std::string normalized(const std::string& path) {
  return fs::weakly_canonical(fs::absolute(path)).lexically_normal().string();
}

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

std::string curriculum_text(const Config& c) {
  const auto& cur = c.curriculum;
  std::string s = std::string(option_name(c.student.norm)) + "-norm " + option_name(cur.mode);
  if (cur.freeze_prefix) s += " freeze";
  s += " [";
  for (size_t i = 0; i < cur.stages.size(); ++i) s += (i ? "," : "") + std::to_string(cur.stages[i]);
  s += "]";
  if (!cur.budget.empty()) s += " budget=matched";
  return s;
}

}  // namespace

StudySpec parse_study(const std::string& toml_text, const std::string& source) {
  const toml::table root = parse_toml(toml_text, source);
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "study" && key != "run")
      throw InputError(source + ": [" + key + "]: unknown section (a study file has [study] and [[run]])");
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
  std::string command = option_name(spec.command), launcher = option_name(spec.launcher);
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
  r.reject_unknown();
  if (base.empty()) r.fail("base", "required: the base config, relative to the study file");
  spec.base = fs::path(base).is_absolute() ? base : (fs::path(source).parent_path() / base).lexically_normal().string();
  if (spec.out_dir.empty()) r.fail("out_dir", "must not be empty");
  if (spec.seeds.empty()) r.fail("seeds", "needs at least one seed");
  if (std::set<int64_t>(spec.seeds.begin(), spec.seeds.end()).size() != spec.seeds.size())
    r.fail("seeds", "seeds must be distinct");
  spec.command = parse_option<StudyCommand>(command, source + ": study.command");
  spec.launcher = parse_option<Launcher>(launcher, source + ": study.launcher");

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
    job.world_size = p.teacher_pipelines * p.teacher_stages + p.students;
  }

  const std::vector<size_t> order = stable_topological_order(deps, names, spec.source);
  std::vector<size_t> position(jobs.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  StudyPlan plan;
  plan.spec = spec;
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
    plan.groups = plan_teacher_groups(plan.jobs, static_cast<size_t>(spec.max_group_runs));
  }
  return plan;
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

ProcessSpec job_process(const StudyPlan& plan, const StudyJob& job, const LaunchContext& ctx) {
  ProcessSpec p;
  if (use_mpirun(plan.spec.launcher, job.world_size, !ctx.mpirun.empty())) {
    // --bind-to none: a local study's jobs share one machine and its scheduler places their threads;
    // mpirun's default would pin each rank of a 2-rank job to one core, whatever run.threads says.
    p.argv = {ctx.mpirun, "--oversubscribe", "--bind-to", "none", "-np", std::to_string(job.world_size)};
    if (ctx.is_root) {
      p.env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
      p.env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
  }
  p.argv.push_back(ctx.deepen_exe);
  p.argv.push_back(option_name(plan.spec.command));
  p.argv.push_back(plan.spec.base);
  for (const auto& o : job.overrides) {
    p.argv.push_back("--set");
    p.argv.push_back(o);
  }
  if (ctx.quiet) p.argv.push_back("--quiet");
  return p;
}

std::string describe_plan(const StudyPlan& plan, const LaunchContext& ctx) {
  std::ostringstream out;
  const auto& s = plan.spec;
  out << "study " << s.name << " (" << s.source << ")\n"
      << "  base config: " << s.base << "\n"
      << "  runs: " << s.runs.size() << ", seeds:";
  for (int64_t seed : s.seeds) out << " " << seed;
  out << ", jobs: " << plan.jobs.size() << ", output: " << s.out_dir << "\n"
      << "  order (layout = teacher pipelines x stages + students, then a rank order or sharding other than the default):\n";
  for (size_t k = 0; k < plan.jobs.size(); ++k) {
    const StudyJob& j = plan.jobs[k];
    const bool mpi = use_mpirun(s.launcher, j.world_size, !ctx.mpirun.empty());
    out << "  " << (k + 1) << ". " << j.id() << "  " << curriculum_text(j.config) << ", layout "
        << layout_label(j.config.parallel) << " = " << j.world_size << " ranks, "
        << (mpi ? "mpirun -np " + std::to_string(j.world_size) : std::string("one process")) << ", "
        << to_string(job_state(j.out_dir));
    if (!j.depends_on.empty()) {
      out << ", after";
      for (size_t d : j.depends_on) out << " " << plan.jobs[d].id();
    }
    out << "\n     -> " << j.out_dir << "\n";
  }
  if (!plan.groups.empty()) {
    out << "  teacher groups (study.share_teacher; runs whose teacher inputs are equal train in one job):\n";
    int64_t alone = 0, shared = 0;
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      const StudyGroup& group = plan.groups[g];
      const ParallelConfig& p = plan.jobs[group.members.front()].config.parallel;
      const int64_t teacher = p.teacher_pipelines * p.teacher_stages;
      alone += static_cast<int64_t>(group.members.size()) * teacher;
      shared += teacher;
      out << "  g" << g << ": " << group.members.size() << (group.members.size() == 1 ? " run" : " runs") << ", "
          << (group.members.size() == 1 ? "alone" : "mpirun -np " + std::to_string(group_world_size(plan, group)) + " deepen group " +
                                                        join_path(group_dir(plan, g), "group.toml"))
          << "\n     ";
      for (size_t k : group.members) out << " " << plan.jobs[k].id();
      out << "\n";
      for (const std::string& why : group.refused) out << "      not joined: " << why << "\n";
    }
    out << "  teacher ranks over the study's jobs: " << shared << " (" << alone << " with a teacher per run)\n";
  }
  return out.str();
}

std::string tail_lines(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) {
    lines.push_back(l);
    if (lines.size() > n) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

namespace {

// A unit of run_study: one job alone, or the members of a teacher group.
std::vector<StudyGroup> study_units(const StudyPlan& plan) {
  if (!plan.groups.empty()) return plan.groups;
  std::vector<StudyGroup> units;
  for (size_t k = 0; k < plan.jobs.size(); ++k) units.push_back(StudyGroup{{k}, {}});
  return units;
}

// Runs `p`; with ctx.log_runs its output goes to `log_path` and one live line per run of `runs` is
// kept up to date from their records instead (the demo's view).
int run_logged(const ProcessSpec& p, const LaunchContext& ctx, const std::string& log_path,
               const std::vector<const StudyJob*>& runs) {
  if (!ctx.log_runs) return run_process(p);
  fs::create_directories(fs::path(log_path).parent_path());
  ProcessSpec logged = p;
  logged.log_path = log_path;
  const bool tty = ::isatty(STDOUT_FILENO);
  const auto start = std::chrono::steady_clock::now();
  auto last_print = start;
  auto lines = [&] {
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count();
    char clock[32];
    std::snprintf(clock, sizeof clock, "%lld:%02lld", static_cast<long long>(secs / 60), static_cast<long long>(secs % 60));
    std::vector<std::string> out;
    for (const StudyJob* job : runs) out.push_back("  " + job->id() + "  " + run_progress(job->out_dir) + "  " + clock);
    return out;
  };
  const size_t n = runs.size();
  auto show = [&](bool first) {
    if (tty && !first && n > 1) std::cout << "\033[" << (n - 1) << "F";  // back to the first line
    const std::vector<std::string> l = lines();
    for (size_t i = 0; i < n; ++i) std::cout << (tty ? "\r" : "") << l[i] << (tty ? "\033[K" : "") << (i + 1 < n ? "\n" : "");
    std::cout << std::flush;
  };
  if (tty) show(true);
  const int rc = run_process(logged, [&] {
    const auto now = std::chrono::steady_clock::now();
    if (tty) {
      show(false);
    } else if (now - last_print >= std::chrono::seconds(30)) {
      show(true);
      std::cout << "\n";
      last_print = now;
    }
  });
  show(!tty);
  std::cout << "\n";
  if (rc != kExitOk && rc != kExitRequeue)
    std::cout << "  --- last lines of " << log_path << " ---\n" << tail_lines(log_path, 30);
  std::cout << std::flush;
  return rc;
}

}  // namespace

int run_study(const StudyPlan& plan, const LaunchContext& ctx) {
  // Dependencies outside an --only selection must already have finished.
  for (const auto& job : plan.jobs) {
    const std::string& budget = job.config.curriculum.budget;
    if (budget.rfind(kBudgetPrefix, 0) != 0) continue;
    const std::string dir = budget.substr(kBudgetPrefix.size());
    const bool in_plan = std::any_of(plan.jobs.begin(), plan.jobs.end(),
                                     [&](const StudyJob& j) { return normalized(j.out_dir) == normalized(dir); });
    if (!in_plan && job_state(dir) != JobState::kFinished)
      throw InputError(plan.spec.source + ": run " + job.id() + " takes its budget from " + dir +
                       ", which has not finished and is not part of this invocation (drop --only or add that run)");
  }
  enum class Outcome { kPending, kDone, kFailed, kBadInput, kBlocked };
  std::vector<Outcome> outcome(plan.jobs.size(), Outcome::kPending);
  const std::vector<StudyGroup> units = study_units(plan);
  int ran = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<size_t> pending;
    for (size_t k : units[u].members) {
      const StudyJob& job = plan.jobs[k];
      const std::string tag = "[" + std::to_string(k + 1) + "/" + std::to_string(plan.jobs.size()) + "] " + job.id();
      if (job_state(job.out_dir) == JobState::kFinished) {
        std::cout << "study: " << tag << ": finished earlier, not rerun (" << job.out_dir << ")\n" << std::flush;
        outcome[k] = Outcome::kDone;
        continue;
      }
      const bool blocked = std::any_of(job.depends_on.begin(), job.depends_on.end(),
                                       [&](size_t d) { return outcome[d] != Outcome::kDone; });
      if (blocked) {
        std::cout << "study: " << tag << ": skipped, a run it depends on did not finish\n" << std::flush;
        outcome[k] = Outcome::kBlocked;
        continue;
      }
      pending.push_back(k);
    }
    if (pending.empty()) continue;
    ProcessSpec p;
    std::string tag, log_path;
    std::vector<const StudyJob*> runs;
    for (size_t k : pending) runs.push_back(&plan.jobs[k]);
    if (pending.size() == 1) {
      const StudyJob& job = plan.jobs[pending.front()];
      p = job_process(plan, job, ctx);
      tag = "[" + std::to_string(pending.front() + 1) + "/" + std::to_string(plan.jobs.size()) + "] " + job.id();
      log_path = RunFolder(job.out_dir).train_log();
      std::cout << "study: " << tag << ": " << (job_state(job.out_dir) == JobState::kPartial ? "resuming" : "starting");
    } else {
      // One job for the group: its file names every pending member's config and overrides.
      const GroupSpec g = group_spec(plan, u, pending);
      fs::create_directories(group_dir(plan, u));
      write_text_file(g.source, group_file_text(g));
      const int64_t world = group_world_size(plan, StudyGroup{pending, {}});
      if (ctx.mpirun.empty())
        throw InputError(plan.spec.source + ": study.share_teacher: group " + g.name + " needs mpirun (" +
                         std::to_string(world) + " ranks), and there is none in PATH");
      p.argv = {ctx.mpirun, "--oversubscribe", "--bind-to", "none", "-np", std::to_string(world), ctx.deepen_exe, "group",
                g.source};
      if (ctx.quiet) p.argv.push_back("--quiet");
      if (ctx.is_root) {
        p.env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
        p.env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
      }
      tag = "group " + g.name + " (" + std::to_string(pending.size()) + " runs, one teacher pass)";
      log_path = (fs::path(group_dir(plan, u)) / "job.log").string();
      std::cout << "study: " << tag << ": starting";
      for (size_t k : pending) std::cout << "\n  " << plan.jobs[k].id();
    }
    std::cout << "\n  " << shell_join(p.argv) << "\n" << std::flush;
    ++ran;
    const int rc = run_logged(p, ctx, log_path, runs);
    Outcome o = Outcome::kDone;
    if (rc == kExitOk) {
      std::cout << "study: " << tag << ": finished\n" << std::flush;
    } else if (rc == kExitRequeue) {
      std::cout << "study: " << tag << ": stopped with a checkpoint (exit 3); run the study again to resume\n"
                << std::flush;
      return kExitRequeue;
    } else if (rc == kExitBadInput) {
      o = Outcome::kBadInput;
      std::cerr << "study: " << tag << ": bad input (exit 2), see the messages above\n";
    } else {
      o = Outcome::kFailed;
      std::cerr << "study: " << tag << ": failed (exit " << rc << ")\n";
    }
    for (size_t k : pending) outcome[k] = o;
  }
  int done = 0;
  bool bad_input = false;
  bool failed = false;
  for (Outcome o : outcome) {
    done += o == Outcome::kDone;
    bad_input |= o == Outcome::kBadInput;
    failed |= o == Outcome::kFailed || o == Outcome::kBlocked;
  }
  std::cout << "study: " << done << "/" << plan.jobs.size() << " runs finished (" << ran << (ran == 1 ? " job" : " jobs")
            << " run now)\n";
  if (failed) return kExitFailure;
  if (bad_input) return kExitBadInput;
  return kExitOk;
}

std::vector<StudyGroup> plan_teacher_groups(const std::vector<StudyJob>& jobs, size_t max_runs) {
  std::vector<GroupCandidate> candidates;
  for (const StudyJob& j : jobs) candidates.push_back(GroupCandidate{j.id(), j.config, j.depends_on});
  std::vector<StudyGroup> out;
  for (TeacherGroup& g : group_for_teacher(candidates, max_runs)) out.push_back(StudyGroup{std::move(g.members), std::move(g.refused)});
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

// ---- Slurm ---------------------------------------------------------------------------------------

namespace {

// "curriculum.stages=[1, 2]" -> "curriculum.stages=[1,2]": the run list is split on whitespace.
std::string without_spaces(const std::string& word, const std::string& where) {
  std::string out;
  bool in_string = false;
  for (char c : word) {
    if (c == '"') in_string = !in_string;
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_string)
        throw InputError(where + ": \"" + word + "\" has whitespace inside a quoted value, which the Slurm run list "
                         "cannot carry");
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string find_deepen_home(const std::string& deepen_exe) {
  const fs::path up = fs::path(deepen_exe).parent_path().parent_path();
  if (fs::exists(up / "slurm" / "study_array.sbatch")) return up.lexically_normal().string();
  if (fs::exists(fs::current_path() / "slurm" / "study_array.sbatch")) return fs::current_path().string();
  return "";
}

SlurmScripts slurm_scripts(const StudyPlan& plan, const SlurmOptions& o, const std::string& dir) {
  if (o.gpus_per_node < 1) throw InputError("--gpus-per-node: must be >= 1");
  if (o.deepen_home.empty())
    throw InputError("cannot find the deepen checkout holding slurm/study_array.sbatch (run from the checkout)");
  const std::string abs_dir = fs::absolute(dir).lexically_normal().string();
  const std::string base = fs::absolute(plan.spec.base).lexically_normal().string();
  SlurmScripts s;

  // One array element per unit: a run alone, or a teacher group of several runs.
  const std::vector<StudyGroup> units = study_units(plan);
  std::vector<size_t> unit_of(plan.jobs.size(), 0);
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t k : units[u].members) unit_of[k] = u;
  auto unit_name = [&](size_t u) {
    std::string name;
    for (size_t k : units[u].members) name += (name.empty() ? "" : "+") + plan.jobs[k].id();
    return name;
  };
  std::vector<int64_t> tasks(units.size());
  std::vector<std::vector<size_t>> unit_deps(units.size());
  std::ostringstream list;
  list << "# Study " << plan.spec.name << " (" << plan.spec.source << "): one job per line; the array index is the\n"
       << "# line number counting from 0 (comment lines do not count). Written by `deepen study --slurm`.\n";
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t k : units[u].members)
      for (size_t d : plan.jobs[k].depends_on)
        if (unit_of[d] != u && std::find(unit_deps[u].begin(), unit_deps[u].end(), unit_of[d]) == unit_deps[u].end())
          unit_deps[u].push_back(unit_of[d]);
    if (units[u].members.size() == 1) {
      const StudyJob& j = plan.jobs[units[u].members.front()];
      std::string line = without_spaces(base, "study.base");
      for (const auto& ov : j.overrides) line += " --set " + without_spaces(ov, j.id());
      list << line << " --quiet\n";
      tasks[u] = job_tasks(plan, j);
      continue;
    }
    GroupSpec g = group_spec(plan, u, units[u].members);
    for (GroupRunSpec& r : g.runs) r.config = base;
    const std::string name = "groups/g" + std::to_string(u) + ".toml";
    g.source = without_spaces(abs_dir + "/" + name, "--slurm");
    s.group_files.emplace_back(name, group_file_text(g));
    list << "group " << g.source << " --quiet\n";
    tasks[u] = group_world_size(plan, units[u]);
  }
  s.study_list = list.str();

  auto resources = [&](int64_t n) {
    const int64_t nodes = (n + o.gpus_per_node - 1) / o.gpus_per_node;
    const int64_t per_node = std::min(n, o.gpus_per_node);
    return "--nodes=" + std::to_string(nodes) + " --ntasks=" + std::to_string(n) + " --ntasks-per-node=" +
           std::to_string(per_node) + " --gpus-per-node=" + std::to_string(per_node);
  };
  // A unit is finished when every run in it is.
  auto finished_test = [&](size_t u) {
    std::string t;
    for (size_t k : units[u].members) t += std::string(t.empty() ? "" : " && ") + "finished " + shell_quote(plan.jobs[k].out_dir);
    return t;
  };
  std::ostringstream sub;
  sub << "#!/usr/bin/env bash\n"
      << "# Submits study " << plan.spec.name << " (" << plan.jobs.size() << " runs";
  if (!plan.groups.empty()) sub << " in " << units.size() << " jobs, runs sharing a teacher in one";
  sub << ") to Slurm through slurm/study_array.sbatch.\n"
      << "# Runs that finished already are skipped, so submitting again after a failure is safe.\n"
      << "set -euo pipefail\n"
      << "list=" << shell_quote(abs_dir + "/study.list") << "\n"
      << "export DEEPEN_HOME=${DEEPEN_HOME:-" << shell_quote(o.deepen_home) << "}\n"
      << "export DEEPEN_BIN=${DEEPEN_BIN:-" << shell_quote(o.deepen_exe) << "}\n"
      << "export DEEPEN_CMD=" << option_name(plan.spec.command) << "\n"
      << "cd " << shell_quote(o.workdir) << "  # relative paths in the configs resolve here\n"
      << "common=(--job-name=" << shell_quote(plan.spec.name) << " --output=" << shell_quote(abs_dir + "/logs/%x-%A_%a.out")
      << " --time=" << o.time << " --cpus-per-task=" << o.cpus_per_task;
  if (!o.partition.empty()) sub << " --partition=" << shell_quote(o.partition);
  if (!o.account.empty()) sub << " --account=" << shell_quote(o.account);
  sub << ")\n"
      << "finished() { grep -qs '\"complete\": *true' \"" << RunFolder("$1").active_layer_tokens_json() << "\"; }\n"
      << "submit() { local id; id=$(sbatch --parsable \"${common[@]}\" \"$@\" \"$DEEPEN_HOME/slurm/study_array.sbatch\" \"$list\"); echo \"${id%%;*}\"; }\n"
      << "declare -A job  # array index -> \"<job id>_<index>\" once submitted\n"
      << "after() {  # the afterok list of the given indices that were submitted (finished ones need no wait)\n"
      << "  local d=\"\" i; for i in \"$@\"; do [[ -n ${job[$i]:-} ]] && d+=\"${d:+:}${job[$i]}\"; done; echo \"$d\"; }\n";
  std::map<int64_t, std::vector<size_t>> independent;
  for (size_t u = 0; u < units.size(); ++u)
    if (unit_deps[u].empty()) independent[tasks[u]].push_back(u);
  for (const auto& [n, members] : independent) {
    sub << "\n# " << members.size() << " independent job(s) of " << n << " task(s)\nidx=()\n";
    for (size_t u : members)
      sub << "if " << finished_test(u) << "; then echo \"" << unit_name(u) << ": finished, skipped\"; else idx+=(" << u
          << "); fi\n";
    sub << "if ((${#idx[@]})); then\n"
        << "  id=$(submit --array=\"$(IFS=,; echo \"${idx[*]}\")\" " << resources(n) << ")\n"
        << "  for i in \"${idx[@]}\"; do job[$i]=${id}_$i; done\n"
        << "  echo \"array $id: indices ${idx[*]}\"\nfi\n";
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (unit_deps[u].empty()) continue;
    sub << "\n# " << unit_name(u) << " waits for";
    for (size_t d : unit_deps[u]) sub << " " << unit_name(d);
    sub << "\nif " << finished_test(u) << "; then echo \"" << unit_name(u) << ": finished, skipped\"; else\n"
        << "  dep=$(after";
    for (size_t d : unit_deps[u]) sub << " " << d;
    sub << ")\n"
        << "  id=$(submit --array=" << u << " ${dep:+--dependency=afterok:$dep} " << resources(tasks[u]) << ")\n"
        << "  job[" << u << "]=${id}_" << u << "\n"
        << "  echo \"" << unit_name(u) << ": job ${id}_" << u << "${dep:+ after $dep}\"\nfi\n";
  }
  s.submit_sh = sub.str();
  return s;
}

void write_slurm_study(const StudyPlan& plan, const SlurmOptions& options, const std::string& dir) {
  const SlurmScripts s = slurm_scripts(plan, options, dir);
  fs::create_directories(fs::path(dir) / "logs");
  auto write = [&](const std::string& name, const std::string& text, bool exec) {
    const fs::path p = fs::path(dir) / name;
    std::ofstream out(p, std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error(p.string() + ": write failed");
    out.close();
    if (exec) fs::permissions(p, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
  };
  if (!s.group_files.empty()) fs::create_directories(fs::path(dir) / "groups");
  for (const auto& [name, text] : s.group_files) write(name, text, false);
  write("study.list", s.study_list, false);
  write("submit.sh", s.submit_sh, true);
}

}  // namespace deepen
