// The local study runner: jobs and teacher groups as child processes, in order, skipping finished runs.
#include "study/local_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "config/input_error.h"
#include "config/layout_label.h"
#include "run_folder/guard_events.h"
#include "run_folder/progress.h"
#include "run_folder/run_folder.h"

namespace deepen {
namespace fs = std::filesystem;
namespace {

// A whole text file, or std::runtime_error naming it: a study never runs a job from a half-written file.
void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(path + ": write failed");
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

// The job's exit code as its coordinator wrote it (launch/job_control.h), if it did.
std::optional<int> read_exit_code_file(const std::string& path) {
  std::ifstream in(path);
  int code;
  if (in >> code) return code;
  return std::nullopt;
}

}  // namespace


ProcessSpec cache_process(const StudyPlan& plan, const LaunchContext& ctx) {
  ProcessSpec p;
  p.argv = {ctx.deepen_exe, "cache", plan.spec.base};
  for (const auto& o : plan.cache->overrides) {
    p.argv.push_back("--set");
    p.argv.push_back(o);
  }
  p.argv.push_back("--out");
  p.argv.push_back(plan.cache->dir);
  if (ctx.quiet) p.argv.push_back("--quiet");
  return p;
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
  if (plan.cache)
    out << "  0. the teacher cache (study.teacher = \"cache\"), before every run: " << shell_join(cache_process(plan, ctx).argv)
        << "\n     -> " << plan.cache->dir << "; the runs train from it with no teacher ranks\n";
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
                                                        (fs::path(group_dir(plan, g)) / "group.toml").string())
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
    const std::optional<std::string> folder = budget_folder(job.config);
    if (!folder) continue;
    const std::string& dir = *folder;
    const bool in_plan = std::any_of(plan.jobs.begin(), plan.jobs.end(),
                                     [&](const StudyJob& j) { return normalized_path(j.out_dir) == normalized_path(dir); });
    if (!in_plan && job_state(dir) != JobState::kFinished)
      throw InputError(plan.spec.source + ": run " + job.id() + " takes its budget from " + dir +
                       ", which has not finished and is not part of this invocation (drop --only or add that run)");
  }
  if (plan.cache) {
    // The teacher cache first (a complete one is checked and kept: `deepen cache` returns at once).
    const ProcessSpec p = cache_process(plan, ctx);
    std::cout << "study: teacher cache " << plan.cache->dir << "\n  " << shell_join(p.argv) << "\n" << std::flush;
    const int rc = run_process(p);
    if (rc != kExitOk) {
      std::cerr << "study: the teacher cache failed (exit " << rc << "); no run started\n";
      return rc == kExitBadInput ? kExitBadInput : kExitFailure;
    }
  }
  enum class Outcome { kPending, kDone, kDiverged, kFailed, kBadInput, kBlocked };
  std::vector<Outcome> outcome(plan.jobs.size(), Outcome::kPending);
  const std::vector<StudyGroup> units = study_units(plan);
  int ran = 0;
  auto tag_of = [&](size_t k) {
    return "[" + std::to_string(k + 1) + "/" + std::to_string(plan.jobs.size()) + "] " + plan.jobs[k].id();
  };
  for (size_t u = 0; u < units.size(); ++u) {
    // A unit runs again at once when a run of it rolled back (exit 5): it resumes from its last good
    // checkpoint at a lower LR; the guard bounds how often (guard.max_rollbacks).
    for (int attempt = 0;; ++attempt) {
      std::vector<size_t> pending;
      for (size_t k : units[u].members) {
        const StudyJob& job = plan.jobs[k];
        if (outcome[k] != Outcome::kPending) continue;
        if (job_state(job.out_dir) == JobState::kFinished) {
          if (attempt == 0)
            std::cout << "study: " << tag_of(k) << ": finished earlier, not rerun (" << job.out_dir << ")\n" << std::flush;
          outcome[k] = Outcome::kDone;
          continue;
        }
        if (const auto why = unretried_divergence(job.out_dir, job.config.run.name, job.config.guard.lr_scale)) {
          std::cout << "study: " << tag_of(k) << ": " << *why << "\n" << std::flush;
          outcome[k] = Outcome::kDiverged;
          continue;
        }
        const bool blocked = std::any_of(job.depends_on.begin(), job.depends_on.end(),
                                         [&](size_t d) { return outcome[d] != Outcome::kDone; });
        if (blocked) {
          std::cout << "study: " << tag_of(k) << ": skipped, a run it depends on did not finish\n" << std::flush;
          outcome[k] = Outcome::kBlocked;
          continue;
        }
        pending.push_back(k);
      }
      if (pending.empty()) break;
      ProcessSpec p;
      std::string tag, log_path, exit_file;
      std::vector<const StudyJob*> runs;
      for (size_t k : pending) runs.push_back(&plan.jobs[k]);
      if (pending.size() == 1) {
        const StudyJob& job = plan.jobs[pending.front()];
        p = job_process(plan, job, ctx);
        tag = tag_of(pending.front());
        log_path = RunFolder(job.out_dir).train_log();
        std::cout << "study: " << tag << ": " << (job_state(job.out_dir) == JobState::kNew ? "starting" : "resuming");
      } else {
        // One job for the group: its file names every pending member's config and overrides.
        const GroupSpec g = group_spec(plan, u, pending);
        fs::create_directories(group_dir(plan, u));
        write_text_file(g.source, group_file_text(g));
        const int64_t world = group_world_size(plan, StudyGroup{pending, {}});
        if (ctx.mpirun.empty())
          throw InputError(plan.spec.source + ": study.share_teacher: group " + g.name + " needs mpirun (" +
                           std::to_string(world) + " ranks), and there is none in PATH");
        // The runs of a group leave with codes of their own (one finished, one stopped, one diverged):
        // the job's code is the one its coordinator writes (dist/control/policy.h, job_exit_code)
        // before any rank exits, not mpirun's, which is the first non-zero rank's.
        exit_file = (fs::path(group_dir(plan, u)) / "exit_code").string();
        p.argv = {ctx.mpirun, "--oversubscribe", "--bind-to", "none", "-np", std::to_string(world), ctx.deepen_exe,
                  "group", g.source};
        if (ctx.quiet) p.argv.push_back("--quiet");
        if (ctx.is_root) {
          p.env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
          p.env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        }
        p.env.emplace_back("DEEPEN_EXIT_CODE_FILE", exit_file);
        fs::remove(exit_file);
        tag = "group " + g.name + " (" + std::to_string(pending.size()) + " runs, one teacher pass)";
        log_path = (fs::path(group_dir(plan, u)) / "job.log").string();
        std::cout << "study: " << tag << ": " << (attempt == 0 ? "starting" : "resuming");
        for (size_t k : pending) std::cout << "\n  " << plan.jobs[k].id();
      }
      std::cout << "\n  " << shell_join(p.argv) << "\n" << std::flush;
      ++ran;
      int rc = run_logged(p, ctx, log_path, runs);
      if (!exit_file.empty()) {
        if (const auto job_rc = read_exit_code_file(exit_file); job_rc && *job_rc != rc) {
          std::cout << "study: " << tag << ": mpirun returned " << rc << "; the job's exit code is " << *job_rc << " ("
                    << exit_file << ")\n";
          rc = *job_rc;
        }
      }
      if (rc == kExitOk || rc == kExitDiverged) {
        // Every run's own state on disk says how it ended (a group: some may have diverged).
        for (size_t k : pending) {
          const bool finished = job_state(plan.jobs[k].out_dir) == JobState::kFinished;
          outcome[k] = finished ? Outcome::kDone : Outcome::kDiverged;
          if (!finished) std::cerr << "study: " << tag_of(k) << ": diverged (see " << RunFolder(plan.jobs[k].out_dir).guard_jsonl() << ")\n";
        }
        std::cout << "study: " << tag << ": " << (rc == kExitOk ? "finished" : "ended, a run diverged") << "\n" << std::flush;
        break;
      }
      if (rc == kExitRequeue) {
        std::cout << "study: " << tag << ": stopped with a checkpoint (exit 3); run the study again to resume\n"
                  << std::flush;
        return kExitRequeue;
      }
      if (rc == kExitRollback) {
        std::cout << "study: " << tag << ": a run rolled back (exit 5); resuming it from its last good checkpoint\n"
                  << std::flush;
        continue;
      }
      const Outcome o = rc == kExitBadInput ? Outcome::kBadInput : Outcome::kFailed;
      if (o == Outcome::kBadInput) std::cerr << "study: " << tag << ": bad input (exit 2), see the messages above\n";
      else std::cerr << "study: " << tag << ": failed (exit " << rc << ")\n";
      for (size_t k : pending) outcome[k] = o;
      break;
    }
  }
  int done = 0;
  bool bad_input = false, failed = false, diverged = false;
  for (Outcome o : outcome) {
    done += o == Outcome::kDone;
    bad_input |= o == Outcome::kBadInput;
    failed |= o == Outcome::kFailed || o == Outcome::kBlocked;
    diverged |= o == Outcome::kDiverged;
  }
  std::cout << "study: " << done << "/" << plan.jobs.size() << " runs finished (" << ran << (ran == 1 ? " job" : " jobs")
            << " run now)\n";
  if (failed) return kExitFailure;
  if (bad_input) return kExitBadInput;
  if (diverged) return kExitDiverged;
  return kExitOk;
}

}  // namespace deepen
