// The CPU demo: prep -> pretrain the teacher -> the study -> the report, each step a child process of
// this binary (see demo.h).
#include "study/demo.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "config/input_error.h"
#include "config/toml_text.h"
#include "report/report_files.h"
#include "run_folder/progress.h"
#include "run_folder/run_folder.h"
#include "study/local_runner.h"
#include "child_process/child_process.h"

namespace deepen {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_since(Clock::time_point t0) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t0).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

std::vector<std::string> strings(const toml::table& t, const char* key, const std::string& where) {
  std::vector<std::string> out;
  const toml::node* n = t.get(key);
  if (!n) return out;
  const toml::array* a = n->as_array();
  if (!a) throw InputError(where + "." + key + ": expected an array of strings");
  for (const auto& item : *a) {
    if (!item.is_string()) throw InputError(where + "." + key + ": expected an array of strings");
    out.push_back(item.as_string()->get());
  }
  return out;
}

// Runs one child with a live progress line from `records_dir` (if any) and its output in `log`.
int run_step(const std::vector<std::string>& argv, const std::string& log, const std::string& records_dir,
             const std::string& label, bool log_runs) {
  ProcessSpec p;
  p.argv = argv;
  if (!log_runs) return run_process(p);
  fs::create_directories(fs::path(log).parent_path());
  p.log_path = log;
  const bool tty = ::isatty(STDOUT_FILENO);
  const auto t0 = Clock::now();
  auto last = t0;
  auto line = [&] {
    return "  " + label + "  " + (records_dir.empty() ? std::string("running") : run_progress(records_dir)) + "  " +
           seconds_since(t0);
  };
  const int rc = run_process(p, [&] {
    if (tty) {
      std::cout << "\r" << line() << "\033[K" << std::flush;
    } else if (Clock::now() - last >= std::chrono::seconds(30)) {
      std::cout << line() << "\n" << std::flush;
      last = Clock::now();
    }
  });
  std::cout << (tty ? "\r" : "") << line() << (tty ? "\033[K" : "") << "\n";
  if (rc != 0) std::cout << "  --- last lines of " << log << " ---\n" << tail_lines(log, 30);
  std::cout << std::flush;
  return rc;
}

}  // namespace

DemoPlan load_demo_plan(const std::string& configs_dir, bool small, const std::string& study) {
  const fs::path file = fs::path(configs_dir) / "demo.toml";
  const toml::table root = parse_toml_file(file.string(), "demo plan");
  const toml::table* demo = root["demo"].as_table();
  if (!demo) throw InputError(file.string() + ": [demo]: missing");
  DemoPlan plan;
  auto path = [&](const toml::table& t, const char* key, const std::string& where) {
    const auto v = t[key].value<std::string>();
    if (!v) throw InputError(file.string() + ": " + where + "." + key + ": expected a file name");
    return (fs::path(configs_dir) / *v).lexically_normal().string();
  };
  plan.teacher_config = path(*demo, "teacher", "demo");
  plan.study = path(*demo, "study", "demo");
  if (small) {
    const toml::table* s = root["small"].as_table();
    if (!s) throw InputError(file.string() + ": [small]: missing (needed by --small)");
    if (s->contains("study")) plan.study = path(*s, "study", "small");
    plan.prep_sets = strings(*s, "prep", file.string() + ": small");
    plan.teacher_sets = strings(*s, "teacher", file.string() + ": small");
  }
  if (!study.empty()) {
    const toml::table* studies = root["studies"].as_table();
    std::string known;
    if (studies)
      for (const auto& [name, value] : *studies) known += (known.empty() ? "" : ", ") + std::string(name.str());
    if (!studies || !studies->contains(study))
      throw InputError("--study " + study + ": not a study of " + file.string() + " [studies]" +
                       (known.empty() ? std::string(" (it has none)") : " (known: " + known + ")"));
    plan.study = path(*studies, study.c_str(), "studies");
  }
  return plan;
}

std::string find_demo_configs(const std::string& deepen_exe) {
  const fs::path beside = fs::path(deepen_exe).parent_path().parent_path() / "configs" / "demo";
  if (fs::exists(beside / "demo.toml")) return beside.lexically_normal().string();
  const fs::path here = fs::current_path() / "configs" / "demo";
  if (fs::exists(here / "demo.toml")) return here.string();
  return "";
}

int run_demo(const DemoOptions& options) {
  const auto t0 = Clock::now();
  const std::string exe = self_executable();
  const std::string configs = options.configs.empty() ? find_demo_configs(exe) : options.configs;
  if (configs.empty())
    throw InputError("cannot find configs/demo/demo.toml next to this binary's checkout or here; pass --configs");
  const DemoPlan plan = load_demo_plan(configs, options.small, options.study);
  const std::string out = !options.out_dir.empty() ? options.out_dir : options.small ? "runs/demo-small" : "runs/demo";
  fs::create_directories(out);
  const std::string train = (fs::path(out) / "data" / "train").string();
  const std::string valid = (fs::path(out) / "data" / "valid").string();
  const std::vector<std::string> data_sets = {"data.train=" + toml_quote(train), "data.valid=" + toml_quote(valid)};
  auto with_sets = [](std::vector<std::string> argv, const std::vector<std::string>& sets) {
    for (const auto& s : sets) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    return argv;
  };
  std::cout << "deepen demo: " << (options.small ? "reduced" : "full") << " CPU study "
            << (options.study.empty() ? std::string() : options.study + " ") << "from " << configs << " into " << out
            << "\n" << std::flush;

  // 1. Corpus. A marker records what was tokenized, so a different source list re-tokenizes.
  {
    std::vector<std::string> sets = data_sets;
    sets.insert(sets.end(), plan.prep_sets.begin(), plan.prep_sets.end());
    const std::vector<std::string> argv = with_sets({exe, "prep", plan.teacher_config, "--overwrite"}, sets);
    const fs::path marker = fs::path(out) / "data" / "prep.done";
    std::string want;
    for (const auto& s : sets) want += s + "\n";
    std::string have;
    if (std::ifstream in(marker); in) have.assign(std::istreambuf_iterator<char>(in), {});
    std::cout << "[1/4] corpus: byte-tokenize Python's documentation sources  (" << seconds_since(t0) << ")\n" << std::flush;
    if (have == want) {
      std::cout << "  done earlier (" << marker.string() << ")\n";
    } else {
      fs::create_directories(marker.parent_path());
      const int rc = run_step(argv, (fs::path(out) / "data" / "prep.log").string(), "", "prep", options.log_runs);
      if (rc != 0) return rc;
      std::ofstream(marker) << want;
      if (options.log_runs) std::cout << "  " << tail_lines((fs::path(out) / "data" / "prep.log").string(), 1);
    }
  }

  // 2. Teacher: pretrained with CE alone; its final/hf is the students' teacher.
  const std::string teacher_dir = (fs::path(out) / "teacher").string();
  {
    std::vector<std::string> sets = data_sets;
    sets.insert(sets.end(), plan.teacher_sets.begin(), plan.teacher_sets.end());
    sets.push_back("run.out_dir=" + toml_quote(teacher_dir));
    std::cout << "[2/4] teacher: deepen pretrain " << plan.teacher_config << "  (" << seconds_since(t0) << ")\n"
              << std::flush;
    if (job_state(teacher_dir) == JobState::kFinished && fs::exists(fs::path(RunFolder(teacher_dir).final_hf()) / "config.json")) {
      std::cout << "  done earlier (" << teacher_dir << ")\n";
    } else {
      std::vector<std::string> argv = with_sets({exe, "pretrain", plan.teacher_config}, sets);
      if (options.log_runs) argv.push_back("--quiet");
      const int rc = run_step(argv, RunFolder(teacher_dir).train_log(), teacher_dir, "teacher", options.log_runs);
      if (rc != 0) return rc;
    }
  }

  // 3. The study: pre/post-norm x joint/grow (or the named study), distilled from that teacher.
  const std::string study_dir = (fs::path(out) / (options.study.empty() ? "study" : options.study)).string();
  {
    StudySpec spec = load_study(plan.study);
    spec.out_dir = study_dir;
    if (options.launcher) spec.launcher = *options.launcher;
    std::vector<std::string> sets = data_sets;
    sets.push_back("teacher.checkpoint=" + toml_quote(RunFolder(teacher_dir).final_hf()));
    const StudyPlan sp = expand_study(spec, sets);
    LaunchContext ctx;
    ctx.deepen_exe = exe;
    ctx.mpirun = find_in_path("mpirun");
    ctx.is_root = ::geteuid() == 0;
    ctx.quiet = options.log_runs;
    ctx.log_runs = options.log_runs;
    std::cout << "[3/4] study  (" << seconds_since(t0) << ")\n" << describe_plan(sp, ctx) << std::flush;
    const int rc = run_study(sp, ctx);
    if (rc != 0) return rc;
  }

  // 4. The report, recomputed from the run records.
  ReportOptions ro;
  ro.out_dir = (fs::path(out) / (options.study.empty() ? "report" : options.study + "-report")).string();
  std::cout << "[4/4] report  (" << seconds_since(t0) << ")\n" << std::flush;
  const Report report = write_report({study_dir}, ro);
  std::cout << "\n" << (options.study.empty() ? report_markdown(report) : std::string()) << "\n"
            << report_files_line(report, ro.out_dir) << "\n"
            << "deepen demo: finished in " << seconds_since(t0) << "\n";
  return 0;
}

}  // namespace deepen
