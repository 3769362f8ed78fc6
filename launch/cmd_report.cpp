// `deepen report DIR...`: the study's table, comparisons, crossover and plots from run folders.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "launch/command_line.h"
#include "report/report_files.h"

namespace deepen {

void register_report_command(CLI::App& app) {
  auto paths = std::make_shared<std::vector<std::string>>();
  auto options = std::make_shared<ReportOptions>();
  auto no_plots = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("report", "table (Markdown, CSV), phase-wise crossover and plots from run folders");
  cmd->add_option("dirs", *paths, "run folders, or folders holding them (a study's out_dir)")->required();
  cmd->add_option("--out", options->out_dir, "where report.md, report.csv and the plots go")->capture_default_str();
  cmd->add_flag("--no-plots", *no_plots, "skip gnuplot");
  cmd->callback([paths, options, no_plots] {
    options->plots = !*no_plots;
    const Report report = write_report(*paths, *options);
    std::cout << report_markdown(report) << "\n" << report_files_line(report, options->out_dir) << "\n";
  });
}

}  // namespace deepen
