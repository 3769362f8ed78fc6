// The report's files: Markdown, CSV, plots (see report_files.h).
#include "report/report_files.h"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/layout_label.h"
#include "report/factorial.h"
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

std::string stat_text(const Stat& s) {
  return fixed(s.mean) + (s.std ? " ± " + fixed(*s.std) : "");
}

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
  // The roles point into the runs, and the report outlives this function: it owns them.
  auto owned = std::make_shared<std::vector<RunData>>();
  for (const auto& dir : find_run_dirs(paths)) owned->push_back(load_run(dir));
  const std::vector<RunData>& runs = *owned;
  Report report = build_report(runs);
  report.owned_runs = owned;
  // The runs are read where they ran: this machine's cores are the ones they shared.
  report.sweeps = find_scaling_sweeps(runs, std::max<int64_t>(1, std::thread::hardware_concurrency()));
  fs::create_directories(options.out_dir);
  if (options.plots) report.images = write_report_plots(report, options, report.notes);
  const std::optional<Factorial> factorial = factorial_design(report);
  std::string md = report_markdown(report) + (factorial ? factorial_markdown(*factorial) : std::string()) +
                   teacher_sharing_markdown(find_shared_teacher_jobs(paths)) + paper_tables_markdown(report) +
                   scaling_markdown(report.sweeps);
  bool plots_heading = false;
  for (const auto& img : report.images) {
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
  if (factorial) {
    write("factorial.csv", factorial_csv(*factorial));
    write("contrasts.csv", contrasts_csv(*factorial));
  }
  return report;
}

std::string report_files_line(const Report& report, const std::string& out_dir) {
  std::string line = "report: " + (fs::path(out_dir) / "report.md").string() + ", with report.csv, comparisons.csv, runs.csv";
  if (!report.sweeps.empty()) line += ", scaling.csv";
  if (factorial_design(report)) line += ", factorial.csv, contrasts.csv";
  std::vector<std::string> plots;
  for (const std::string& img : report.images)
    if (img.size() > 4 && img.substr(img.size() - 4) == ".png") plots.push_back(img.substr(0, img.size() - 4));
  if (plots.empty()) return line + "; no plots rendered";
  line += " and " + std::to_string(plots.size()) + (plots.size() == 1 ? " plot" : " plots") + " as PNG and SVG (";
  for (size_t i = 0; i < plots.size(); ++i) line += (i ? ", " : "") + plots[i];
  return line + ")";
}

}  // namespace deepen
