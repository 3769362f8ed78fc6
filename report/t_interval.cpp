// Student's t intervals (see t_interval.h).
#include "report/t_interval.h"

#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>

namespace deepen {
namespace {

// Continued fraction of the incomplete beta function (modified Lentz), as in Numerical Recipes' betacf.
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

// I_x(a, b), the regularized incomplete beta function.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, 1 - x) / b;
}

// P(T <= t) for Student's t with df degrees of freedom.
double t_cdf(double t, double df) {
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t));
  return t >= 0 ? 1 - tail : tail;
}

double mean_of(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); }

double sample_variance(const std::vector<double>& v) {
  const double m = mean_of(v);
  double sq = 0;
  for (double x : v) sq += (x - m) * (x - m);
  return sq / static_cast<double>(v.size() - 1);
}

}  // namespace

double t_quantile(double p, double df) {
  if (!(p > 0 && p < 1) || !(df > 0)) throw std::invalid_argument("t_quantile: needs 0 < p < 1 and df > 0");
  if (p < 0.5) return -t_quantile(1 - p, df);
  double lo = 0, hi = 1;
  while (t_cdf(hi, df) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Interval mean_interval(const std::vector<double>& values) {
  Interval out;
  out.n = static_cast<int>(values.size());
  out.method = "t";
  if (values.empty()) return out;
  out.mean = mean_of(values);
  if (out.n >= 2) {
    out.df = out.n - 1;
    out.half_width = t_quantile(0.975, out.df) * std::sqrt(sample_variance(values) / out.n);
  }
  return out;
}

Interval contrast_interval(const std::vector<ContrastCell>& cells) {
  // Paired: the seeds every cell has.
  std::set<long long> common;
  for (size_t c = 0; c < cells.size(); ++c) {
    std::set<long long> seeds;
    for (const auto& [seed, v] : cells[c].seed_values) seeds.insert(seed);
    if (c == 0) {
      common = seeds;
    } else {
      std::set<long long> both;
      for (long long s : common)
        if (seeds.count(s)) both.insert(s);
      common = both;
    }
  }
  if (common.size() >= 2) {
    std::vector<double> per_seed;
    for (long long seed : common) {
      double sum = 0;
      for (const ContrastCell& cell : cells)
        for (const auto& [s, v] : cell.seed_values)
          if (s == seed) sum += cell.coefficient * v;
      per_seed.push_back(sum);
    }
    Interval out = mean_interval(per_seed);
    out.method = "paired";
    return out;
  }
  Interval out;
  out.method = "Welch";
  double variance = 0, df_denominator = 0;
  bool every_cell_varies = true;
  out.n = cells.empty() ? 0 : static_cast<int>(cells.front().seed_values.size());
  for (const ContrastCell& cell : cells) {
    std::vector<double> v;
    for (const auto& [s, x] : cell.seed_values) v.push_back(x);
    if (v.empty()) return Interval{};
    out.mean += cell.coefficient * mean_of(v);
    out.n = std::min(out.n, static_cast<int>(v.size()));
    if (v.size() < 2) {
      every_cell_varies = false;
      continue;
    }
    const double term = cell.coefficient * cell.coefficient * sample_variance(v) / static_cast<double>(v.size());
    variance += term;
    df_denominator += term * term / static_cast<double>(v.size() - 1);
  }
  if (every_cell_varies && variance > 0) {
    out.df = variance * variance / df_denominator;
    out.half_width = t_quantile(0.975, out.df) * std::sqrt(variance);
  } else if (every_cell_varies) {
    out.df = 1;
    out.half_width = 0;
  }
  return out;
}

}  // namespace deepen
