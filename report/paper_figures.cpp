// The paper's figures as gnuplot data and scripts (see paper_figures.h).
#include "report/paper_figures.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "report/number_text.h"

namespace deepen {
namespace {

std::string opt(const std::optional<double>& v) { return v ? plot_number(*v) : "NaN"; }

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Pre-norm dashed, post-norm solid; one colour per kind (as val_ce).
std::string style(const RoleSummary& s) {
  const std::string color = kind_color(s.kind);
  return std::string("dt ") + (s.norm == NormPlacement::kPre ? "2" : "1") + " lw 2 lc rgb '" + color + "'";
}

std::string append_arrows(const RunData& run) {
  std::string out = "unset arrow\n";
  for (int64_t s : run.growth_steps())
    out += "set arrow from " + std::to_string(s) + ", graph 0 to " + std::to_string(s) +
           ", graph 1 nohead dt 3 lw 1 lc rgb '#808080'\n";
  return out;
}

// 3a: final validation CE of the 2×2, joint and grow on x, one line per placement, ±std bars.
std::optional<Figure> interaction_figure(const Report& r) {
  std::ostringstream dat;
  bool any = false;
  for (const NormPlacement norm : {NormPlacement::kPre, NormPlacement::kPost}) {
    dat << "# " << option_name(norm) << ": x curriculum val_ce_mean val_ce_std\n";
    for (auto [x, kind] : {std::pair{0, RunKind::kJoint}, std::pair{1, RunKind::kGrow}}) {
      const RoleSummary* s = find_role(r, norm, kind);
      if (!s) continue;
      any = true;
      dat << x << " " << option_name(kind) << " " << plot_number(s->val_ce.mean) << " " << plot_number(s->val_ce.std.value_or(0)) << "\n";
    }
    dat << "\n\n";
  }
  if (!any) return std::nullopt;
  Figure f{"fig3a_interaction", dat.str(), "", 760, 520};
  f.body = "set title 'Figure 3a: normalization x curriculum (final validation CE, mean +/- std over seeds)'\n"
           "set xrange [-0.4:1.4]\nset xtics ('joint' 0, 'grow' 1)\nset ylabel 'validation CE'\nset grid\n"
           "set key outside right top\n"
           "plot 'fig3a_interaction.dat' index 0 using 1:3:4 with yerrorlines pt 7 ps 1 dt 2 lw 2 lc rgb '#1f77b4' title 'pre-norm', \\\n"
           "     'fig3a_interaction.dat' index 1 using 1:3:4 with yerrorlines pt 5 ps 1 dt 1 lw 2 lc rgb '#d62728' title 'post-norm'\n";
  return f;
}

// 3b: post − pre validation CE at the common eval steps, per kind with both placements.
std::optional<Figure> crossover_figure(const Report& r) {
  std::ostringstream dat, plot;
  int index = 0;
  const RunData* marks = nullptr;
  for (const RunKind kind : {RunKind::kGrow, RunKind::kFreeze, RunKind::kJoint}) {
    const RoleSummary *pre = find_role(r, NormPlacement::kPre, kind), *post = find_role(r, NormPlacement::kPost, kind);
    if (!pre || !post) continue;
    const auto a = mean_curve(*post), b = mean_curve(*pre);
    std::map<int64_t, double> pre_at;
    for (const auto& p : b) pre_at[p.step] = p.val_ce;
    dat << "# " << option_name(kind) << ": step post_minus_pre\n";
    for (const auto& p : a)
      if (auto it = pre_at.find(p.step); it != pre_at.end()) dat << p.step + 1 << " " << plot_number(p.val_ce - it->second) << "\n";
    dat << "\n\n";
    plot << (index ? ", \\\n     " : "") << "'fig3b_crossover.dat' index " << index << " using 1:2 with linespoints pt 7 ps 0.5 "
         << style(*post) << " title " << quoted(std::string("post - pre, ") + option_name(kind));
    if (kind == RunKind::kGrow) marks = post->runs.front();
    ++index;
  }
  if (index == 0) return std::nullopt;
  Figure f{"fig3b_crossover", dat.str(), "", 1000, 560};
  f.body = std::string("set title 'Figure 3b: phase-wise crossover (below 0: post-norm ahead; dotted: block appends)'\n") +
           "set xlabel 'optimizer step'\nset ylabel 'validation CE, post - pre'\nset grid\nset key outside right top\n" +
           (marks ? append_arrows(*marks) : std::string("unset arrow\n")) + "set xzeroaxis lt -1\nplot " + plot.str() + "\n";
  return f;
}

// The grow/freeze roles whose first seed has block-boundary RMS records, one panel each.
std::vector<const RoleSummary*> diagnosed(const Report& r) {
  std::vector<const RoleSummary*> out;
  for (const auto& s : r.roles) {
    if (s.runs.empty() || !appends_blocks(s.kind)) continue;
    const auto& d = s.runs.front()->diagnostics;
    if (std::any_of(d.begin(), d.end(), [](const DiagnosticPoint& p) { return !p.block_rms.empty(); })) out.push_back(&s);
  }
  return out;
}

std::string multiplot(size_t panels, const std::string& title) {
  const size_t cols = std::min<size_t>(panels, 2), rows = (panels + 1) / 2;
  return "set multiplot layout " + std::to_string(rows) + "," + std::to_string(cols) + " title " + quoted(title) + "\n";
}

// 4: std over tokens of the per-token RMS at every block boundary, one line per phase end.
std::optional<Figure> block_rms_figure(const Report& r) {
  const auto roles = diagnosed(r);
  if (roles.empty()) return std::nullopt;
  std::ostringstream dat, body;
  body << "set datafile missing 'NaN'\nset logscale y\nset grid\nset key outside right top\nset xtics 1\n"
       << "set xlabel 'block boundary (0 = entering block 0)'\nset ylabel 'std over tokens of the per-token RMS'\n"
       << multiplot(roles.size(), "Figure 4: block-boundary residual RMS across phases (first seed)");
  int index = 0;
  for (const RoleSummary* s : roles) {
    std::ostringstream plot;
    int lines = 0;
    for (const DiagnosticPoint& d : s->runs.front()->diagnostics) {
      if (d.event == "periodic" || d.block_rms.empty()) continue;
      dat << "# " << s->role << " after step " << d.step + 1 << ": boundary mean std kurtosis\n";
      for (size_t b = 0; b < d.block_rms.size(); ++b)
        dat << b << " " << opt(d.block_rms[b].all.mean) << " " << opt(d.block_rms[b].all.std) << " "
            << opt(d.block_rms[b].all.kurtosis) << "\n";
      dat << "\n\n";
      plot << (lines ? ", \\\n     " : "") << "'fig4_block_rms.dat' index " << index++ << " using 1:3 with linespoints pt 7 lw 2 title "
           << quoted("after step " + std::to_string(d.step + 1) + " (depth " + std::to_string(d.depth) + ")");
      ++lines;
    }
    body << "set title " << quoted(s->role) << "\nplot " << (lines ? plot.str() : "NaN notitle") << "\n";
  }
  body << "unset multiplot\n";
  const int cols = static_cast<int>(std::min<size_t>(roles.size(), 2)), rows = static_cast<int>((roles.size() + 1) / 2);
  return Figure{"fig4_block_rms", dat.str(), body.str(), 620 * cols, 420 * rows + 40};
}

// 5a: mean per-token RMS of document-boundary and regular tokens at the last boundary, over steps.
std::optional<Figure> token_type_figure(const Report& r) {
  const auto roles = diagnosed(r);
  if (roles.empty()) return std::nullopt;
  std::ostringstream dat, body;
  body << "set datafile missing 'NaN'\nset logscale y\nset grid\nset key outside right top\n"
       << "set xlabel 'optimizer step'\nset ylabel 'mean per-token RMS, last block boundary'\n"
       << multiplot(roles.size(), "Figure 5a: residual RMS by token type (first seed; dotted: block appends)");
  int index = 0;
  for (const RoleSummary* s : roles) {
    dat << "# " << s->role << ": step document_boundary_mean regular_mean\n";
    for (const DiagnosticPoint& d : s->runs.front()->diagnostics)
      if (!d.block_rms.empty())
        dat << d.step + 1 << " " << opt(d.block_rms.back().document_boundary.mean) << " "
            << opt(d.block_rms.back().regular.mean) << "\n";
    dat << "\n\n";
    body << "set title " << quoted(s->role) << "\n" << append_arrows(*s->runs.front())
         << "plot 'fig5a_token_types.dat' index " << index << " using 1:2 with linespoints pt 7 lw 2 lc rgb '#d62728' title 'document boundary', \\\n"
         << "     'fig5a_token_types.dat' index " << index << " using 1:3 with linespoints pt 5 lw 2 lc rgb '#1f77b4' title 'regular'\n";
    ++index;
  }
  body << "unset multiplot\n";
  const int cols = static_cast<int>(std::min<size_t>(roles.size(), 2)), rows = static_cast<int>((roles.size() + 1) / 2);
  return Figure{"fig5a_token_types", dat.str(), body.str(), 620 * cols, 420 * rows + 40};
}

// A1: the finished students' per-token RMS at the last boundary, as log-binned distributions.
std::optional<Figure> final_distribution_figure(const Report& r) {
  std::ostringstream dat, plot;
  int index = 0;
  for (const auto& s : r.roles) {
    if (s.runs.empty() || !s.runs.front()->final_token_rms) continue;
    const FinalTokenRms& f = *s.runs.front()->final_token_rms;
    if (f.regular.empty()) continue;
    std::vector<double> all = f.regular.back();
    all.insert(all.end(), f.document_boundary.back().begin(), f.document_boundary.back().end());
    dat << "# " << s.role << ": rms fraction_of_tokens (last boundary, " << all.size() << " tokens)\n";
    for (const auto& [x, frac] : log_histogram(all, 10)) dat << plot_number(x) << " " << plot_number(frac) << "\n";
    dat << "\n\n";
    plot << (index ? ", \\\n     " : "") << "'figA1_token_rms.dat' index " << index << " using 1:2 with steps " << style(s)
         << " title " << quoted(s.role);
    ++index;
  }
  if (index == 0) return std::nullopt;
  Figure f{"figA1_token_rms", dat.str(), "", 1000, 560};
  f.body = "set title 'Figure A1: per-token RMS at the last block boundary of the finished students (first seed)'\n"
           "set logscale x\nset logscale y\nset grid\nset key outside right top\n"
           "set xlabel 'per-token RMS (log bins, 10 per decade)'\nset ylabel 'fraction of tokens'\nplot " + plot.str() + "\n";
  return f;
}

// A2: ΔCE and angle of every block at the last removal point, one line per role (mean over seeds).
std::optional<Figure> removal_figure(const Report& r) {
  std::ostringstream dat, top, bottom;
  int index = 0;
  for (const auto& s : r.roles) {
    std::map<int64_t, std::pair<double, double>> sum;  // block -> (ΔCE, angle) sums
    int n = 0;
    for (const RunData* run : s.runs) {
      const DiagnosticPoint* last = nullptr;
      for (const auto& d : run->diagnostics)
        if (!d.block_removal.empty()) last = &d;
      if (!last) continue;
      ++n;
      for (const auto& b : last->block_removal) {
        sum[b.block].first += b.delta_ce;
        sum[b.block].second += b.angle;
      }
    }
    if (n == 0) continue;
    dat << "# " << s.role << ": block delta_ce angle (mean over " << n << " seeds)\n";
    for (const auto& [b, v] : sum) dat << b << " " << plot_number(v.first / n) << " " << plot_number(v.second / n) << "\n";
    dat << "\n\n";
    const std::string sep = index ? ", \\\n     " : "";
    top << sep << "'figA2_block_removal.dat' index " << index << " using 1:2 with linespoints pt 7 " << style(s)
        << " title " << quoted(s.role);
    bottom << sep << "'figA2_block_removal.dat' index " << index << " using 1:3 with linespoints pt 7 " << style(s)
           << " title " << quoted(s.role);
    ++index;
  }
  if (index == 0) return std::nullopt;
  Figure f{"figA2_block_removal", dat.str(), "", 1000, 760};
  f.body = "set grid\nset key outside right top\nset xtics 1\nset xlabel 'block'\n"
           "set multiplot layout 2,1 title 'Figure A2: block removal at the end of each run'\n"
           "set ylabel 'CE without the block - CE'\nplot " + top.str() + "\n"
           "set ylabel 'arccos(cos(h_in, h_out)) / pi'\nplot " + bottom.str() + "\nunset multiplot\n";
  return f;
}

}  // namespace

std::vector<std::pair<double, double>> log_histogram(const std::vector<double>& values, int bins_per_decade) {
  std::vector<double> v;
  for (double x : values)
    if (x > 0 && std::isfinite(x)) v.push_back(x);
  if (v.empty() || bins_per_decade < 1) return {};
  const auto [lo_it, hi_it] = std::minmax_element(v.begin(), v.end());
  const double lo = std::log10(*lo_it), hi = std::log10(*hi_it);
  const double width = 1.0 / bins_per_decade;
  const int bins = std::max(1, static_cast<int>(std::ceil((hi - lo) / width - 1e-12)));
  std::vector<double> count(static_cast<size_t>(bins), 0);
  for (double x : v) {
    const int b = std::min(bins - 1, static_cast<int>(std::floor((std::log10(x) - lo) / width)));
    count[static_cast<size_t>(b)] += 1;
  }
  std::vector<std::pair<double, double>> out;
  for (int b = 0; b < bins; ++b)
    out.push_back({std::pow(10.0, lo + (b + 0.5) * width), count[static_cast<size_t>(b)] / static_cast<double>(v.size())});
  return out;
}

std::vector<Figure> paper_figures(const Report& report, std::vector<std::string>& notes) {
  std::vector<Figure> out;
  const auto add = [&](std::optional<Figure> f, const char* missing) {
    if (f) out.push_back(std::move(*f));
    else notes.push_back(missing);
  };
  add(interaction_figure(report), "figure 3a (interaction) needs joint or grow runs");
  add(crossover_figure(report), "figure 3b (crossover) needs pre and post runs of one kind");
  add(block_rms_figure(report), "figure 4 (block-boundary RMS) needs grow runs with block_rms diagnostics");
  add(token_type_figure(report), "figure 5a (token-type RMS) needs grow runs with block_rms diagnostics");
  add(final_distribution_figure(report), "figure A1 (final per-token RMS) needs finished runs with final_token_rms.json");
  add(removal_figure(report), "figure A2 (block removal) needs runs with block_removal diagnostics");
  return out;
}

}  // namespace deepen
