// 95% confidence intervals from Student's t: the quantile, a mean's interval over seeds, and a
// contrast of cell means (paired by seed when every cell has the seed, Welch otherwise).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace deepen {

// The p-quantile of Student's t with df > 0 degrees of freedom (df need not be whole: Welch's),
// from the regularized incomplete beta function by bisection, to ~1e-10.
// Examples: t_quantile(0.975, 1) = 12.706, (0.975, 2) = 4.303, (0.975, 10) = 2.228, (0.975, 1e9) = 1.960.
double t_quantile(double p, double df);

// mean ± half_width, the two-sided 95% interval of a mean, and what it rests on.
struct Interval {
  int n = 0;                         // seeds (paired contrasts: seeds every cell has)
  double mean = 0;
  std::optional<double> half_width;  // none for n < 2 (Welch: any cell with n < 2)
  double df = 0;                     // degrees of freedom of the t quantile
  std::string method;                // "t" (one cell), "paired" or "Welch"
};

// The mean of `values` with t_{0.975, n-1} · s / sqrt(n). Example: {1, 2, 3} -> 2 ± 4.303 · 1 / sqrt(3)
// = 2 ± 2.484 (df 2); {5} -> 5, no interval.
Interval mean_interval(const std::vector<double>& values);

// A contrast Σ coefficient_c · mean(cell c) over cells holding one value per seed:
//   paired (the seeds every cell has, at least 2): the per-seed contrast's mean_interval; seeds
//     missing from a cell are left out, and n says how many remain;
//   Welch otherwise: variance Σ c²·s_c²/n_c, Welch–Satterthwaite degrees of freedom.
// Example: cells a = {1, 2, 3}, b = {0, 1, 1} by seeds 1, 2, 3, contrast a − b: per seed {1, 1, 2}
//   -> 1.333 ± 4.303 · 0.577 / sqrt(3) = 1.333 ± 1.434, paired, n 3.
struct ContrastCell {
  double coefficient = 1;
  std::vector<std::pair<long long, double>> seed_values;  // (seed, value)
};
Interval contrast_interval(const std::vector<ContrastCell>& cells);

}  // namespace deepen
