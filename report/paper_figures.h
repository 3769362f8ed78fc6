// The paper's figures as gnuplot data + scripts: interaction (3a), phase-wise crossover (3b),
// block-boundary RMS across phases (4), token-type RMS (5a), final per-token RMS distribution (A1)
// and block removal (A2). Figure 5b (validation CE with the appends marked) is val_ce.
#pragma once

#include <string>
#include <vector>

#include "report/report.h"

namespace deepen {

// One figure: `name`.dat holds the data, `name`.gp draws it into `name`.png and `name`.svg (the
// caller wraps the two terminals' output around `body` and runs gnuplot in the output folder).
struct Figure {
  std::string name;   // "fig3a_interaction"
  std::string data;   // the .dat file
  std::string body;   // gnuplot commands for one terminal
  int width = 900, height = 560;
};

// Every figure the report's runs have data for; a figure without data becomes a line in `notes`.
// Keys sit outside the plot area (right or below), so a legend never covers data.
std::vector<Figure> paper_figures(const Report& report, std::vector<std::string>& notes);

// Log-spaced histogram of positive values: `bins` bins per decade between the smallest and the
// largest value, as (bin centre, fraction of the values) pairs; fractions sum to 1.
// Example: {1, 1, 10, 100}, 1 bin per decade -> centres ~ 1.78, 17.8, 178 hold 0.5, 0.25, 0.25
// (the last edge includes the largest value).
std::vector<std::pair<double, double>> log_histogram(const std::vector<double>& values, int bins_per_decade);

}  // namespace deepen
