// Report plots: gnuplot data and scripts for validation CE, residual RMS per token class, and the
// identity-mapping of the last pre-growth block, rendered to PNG and SVG.
#pragma once

#include <string>
#include <vector>

#include "report/report_files.h"

namespace deepen {

// Writes <name>.dat and <name>.gp for each plot into options.out_dir and runs gnuplot on them.
// Returns the image file names written (relative to out_dir, e.g. "val_ce.png"); a plot without
// data, or a missing gnuplot, becomes a line in `notes` instead.
std::vector<std::string> write_report_plots(const Report& report, const ReportOptions& options,
                                            std::vector<std::string>& notes);

// The gnuplot script of the validation-CE plot: one curve per role (mean over seeds; pre-norm
// dashed, post-norm solid), a vertical dotted line at every growth step of the grow runs, and both
// terminals (pngcairo, svg). Pure, for tests.
std::string val_ce_script(const Report& report, const std::vector<int64_t>& growth_steps);

// Growth steps of every grow/freeze run in the report, sorted and without repeats.
std::vector<int64_t> report_growth_steps(const Report& report);

}  // namespace deepen
