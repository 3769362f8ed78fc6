// The report's files: report.md, the CSV tables and the plots of a study's run folders.
#pragma once

#include <string>
#include <vector>

#include "report/report.h"

namespace deepen {

std::string report_markdown(const Report& report);
// One row per role: role,norm,kind,n,seeds,val_ce_mean,val_ce_std,val_kl_mean,val_kl_std,steps,
// tokens,active_layer_tokens,complete; then comparisons in comparisons.csv and runs in runs.csv.
std::string report_csv(const Report& report);
std::string comparisons_csv(const Report& report);
std::string runs_csv(const Report& report);

struct ReportOptions {
  std::string out_dir = "report";
  bool plots = true;              // needs gnuplot; without it the .gp and .dat files are still written
  std::string gnuplot = "gnuplot";
};

// Loads every run under `paths`, writes report.md, report.csv, comparisons.csv, runs.csv and the
// plots into options.out_dir, and for a factorial study (report/factorial.h) its section of
// report.md, factorial.csv and contrasts.csv; returns the report (the caller prints the table), which
// owns the runs its roles point into.
Report write_report(const std::vector<std::string>& paths, const ReportOptions& options);

// The closing line of `deepen report` and the demo: what write_report wrote into `out_dir`, the plots
// by name (each as PNG and SVG). Example: out_dir "r", images {"val_ce.png", "val_ce.svg",
// "identity.png", "identity.svg"} ->
//   "report: r/report.md, with report.csv, comparisons.csv, runs.csv and 2 plots as PNG and SVG (val_ce, identity)"
// and without images "... runs.csv; no plots rendered" (--no-plots, no gnuplot, or no data: report.md's
// notes say which).
std::string report_files_line(const Report& report, const std::string& out_dir);

}  // namespace deepen
