// Report plots through gnuplot: data files + scripts, each rendered as PNG and SVG (see report_plots.h).
#include "report/report_plots.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "report/factorial.h"
#include "report/number_text.h"
#include "report/paper_figures.h"
#include "report/scaling.h"
#include "child_process/child_process.h"

namespace deepen {
namespace fs = std::filesystem;
namespace {

const std::vector<std::string> kClasses = {"first", "special", "structural", "content"};
const std::vector<std::string> kClassColors = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
constexpr int kValCeWidth = 1100, kValCeHeight = 620;

// Pre-norm dashed, post-norm solid, so the pair of one kind shares a colour.
int dash(NormPlacement norm) { return norm == NormPlacement::kPre ? 2 : 1; }

std::string value_or_nan(const ClassValues& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? "NaN" : plot_number(it->second);
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string growth_arrows(const std::vector<int64_t>& steps) {
  std::string out;
  for (int64_t s : steps)
    out += "set arrow from " + std::to_string(s) + ", graph 0 to " + std::to_string(s) +
           ", graph 1 nohead dt 3 lw 1 lc rgb '#808080'\n";
  return out;
}

// Both terminals around one body: the PNG for the Markdown report, the SVG for papers.
std::string two_terminals(const std::string& name, int width, int height, const std::string& body) {
  std::ostringstream gp;
  gp << "set terminal pngcairo size " << width << "," << height << " noenhanced font ',10'\n"
     << "set output " << quoted(name + ".png") << "\n"
     << body << "unset output\n"
     << "set terminal svg size " << width << "," << height << " noenhanced dynamic font ',10'\n"
     << "set output " << quoted(name + ".svg") << "\n"
     << body << "unset output\n";
  return gp.str();
}

// The runs whose diagnostics are plotted: the first seed of every grow and freeze role.
using DiagnosedRun = std::pair<const RoleSummary*, const RunData*>;
std::vector<DiagnosedRun> diagnosed_runs(const Report& report) {
  std::vector<DiagnosedRun> out;
  for (const auto& s : report.roles)
    if (appends_blocks(s.kind) && !s.runs.empty()) out.push_back({&s, s.runs.front()});
  return out;
}

bool has_values(const ClassValues& m) { return !m.empty(); }

// One panel: a line per token class present in the data block `index`, class c in column
// first_column + c; growth steps (if any) as dotted verticals.
std::string class_panel(const std::string& file, int index, const std::string& title, int first_column,
                        const std::vector<bool>& present, const std::vector<int64_t>& growth_steps) {
  std::ostringstream panel;
  panel << "set title " << quoted(title) << "\nunset arrow\n" << growth_arrows(growth_steps) << "plot ";
  bool first = true;
  for (size_t c = 0; c < kClasses.size(); ++c) {
    if (!present[c]) continue;
    panel << (first ? "" : ", \\\n     ") << quoted(file) << " index " << index << " using 1:"
          << (first_column + static_cast<int>(c)) << " with linespoints pt 7 ps 0.5 lw 2 lc rgb '" << kClassColors[c]
          << "' title " << quoted(kClasses[c]);
    first = false;
  }
  if (first) panel << "NaN notitle";  // no class at all: an empty panel keeps the layout
  panel << "\n";
  return panel.str();
}

// The validation-CE plot for one terminal (val_ce_script gives it both).
std::string val_ce_body(const Report& report, const std::vector<int64_t>& growth_steps) {
  std::ostringstream body;
  body << "set title 'Validation CE (mean over seeds); dotted verticals: growth events'\n"
       << "set xlabel 'optimizer step'\nset ylabel 'validation CE (nats/token)'\n"
       << "set key outside right top\nset grid\nunset arrow\n"
       << growth_arrows(growth_steps) << "plot ";
  int index = 0;
  bool first = true;
  for (const auto& s : report.roles) {
    if (s.kind == RunKind::kPretrain) continue;
    body << (first ? "" : ", \\\n     ") << "'val_ce.dat' index " << index++ << " using 1:3 with linespoints pt 7 ps 0.4 dt "
         << dash(s.norm) << " lw 2 lc rgb '" << kind_color(s.kind) << "' title " << quoted(s.role);
    first = false;
  }
  body << "\n";
  return body.str();
}

}  // namespace

std::vector<int64_t> report_growth_steps(const Report& report) {
  std::set<int64_t> steps;
  for (const auto& s : report.roles) {
    if (!appends_blocks(s.kind)) continue;
    for (const RunData* r : s.runs)
      for (int64_t g : r->growth_steps()) steps.insert(g);
  }
  return {steps.begin(), steps.end()};
}

std::string val_ce_script(const Report& report, const std::vector<int64_t>& growth_steps) {
  return two_terminals("val_ce", kValCeWidth, kValCeHeight, val_ce_body(report, growth_steps));
}

namespace {

// 1. Validation CE curves, one data block per role (mean over seeds); the paper's Figure 5b.
std::optional<Figure> val_ce_figure(const Report& report) {
  std::ostringstream dat;
  int curves = 0;
  for (const auto& s : report.roles) {
    if (s.kind == RunKind::kPretrain) continue;
    dat << "# " << s.role << ": step tokens val_ce (mean over " << s.runs.size() << " seeds)\n";
    for (const auto& p : mean_curve(s)) dat << p.step << " " << p.tokens << " " << plot_number(p.val_ce) << "\n";
    dat << "\n\n";
    ++curves;
  }
  if (curves == 0) return std::nullopt;
  return Figure{"val_ce", dat.str(), val_ce_body(report, report_growth_steps(report)), kValCeWidth, kValCeHeight};
}

// 2. Residual RMS per token class over training: the boundary representation (the residual stream
//    an appended block would receive) at every diagnostic point of each grow/freeze run, a panel per
//    run on one y range, so pre and post compare by eye.
std::optional<Figure> residual_rms_figure(const std::vector<DiagnosedRun>& runs) {
  std::ostringstream dat, body;
  int panels = 0;
  std::vector<std::string> plots;
  double lo = INFINITY, hi = 0;
  for (const auto& [role, run] : runs) {
    std::vector<const DiagnosticPoint*> pts;
    for (const auto& d : run->diagnostics)
      if (has_values(d.boundary_rms)) pts.push_back(&d);
    if (pts.empty()) continue;
    dat << "# " << role->role << " (" << run->dir << "): step depth rms[first special structural content]\n";
    for (const DiagnosticPoint* d : pts) {
      dat << d->step << " " << d->depth;
      for (const auto& c : kClasses) dat << " " << value_or_nan(d->boundary_rms, c);
      dat << "\n";
      for (const auto& [c, v] : d->boundary_rms) {
        if (v > 0) lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
    dat << "\n\n";
    std::vector<bool> present(kClasses.size(), false);
    for (const DiagnosticPoint* d : pts)
      for (size_t c = 0; c < kClasses.size(); ++c) present[c] = present[c] || d->boundary_rms.count(kClasses[c]);
    const std::string panel = class_panel("residual_rms.dat", panels, role->role + " seed " +
                                          std::to_string(run->config.run.seed), 3, present, run->growth_steps());
    plots.push_back(panel);
    ++panels;
  }
  if (panels == 0) return std::nullopt;
  const int cols = std::min(panels, 2);
  const int rows = (panels + 1) / 2;
  body << "set datafile missing 'NaN'\nset logscale y\nset grid\nset key bottom right\n"
       << "set xlabel 'optimizer step'\nset ylabel 'RMS of the boundary representation'\n"
       << "set multiplot layout " << rows << "," << cols << " title 'Residual-stream RMS per token class (dotted: growth)'\n";
  if (hi > 0 && lo < hi) body << "set yrange [" << plot_number(lo / 1.25) << ":" << plot_number(hi * 1.25) << "]\n";
  for (const auto& p : plots) body << p;
  body << "unset multiplot\n";
  return Figure{"residual_rms", dat.str(), body.str(), 600 * cols, 420 * rows + 40};
}

// 3. Identity mapping of the last block before each growth: ||B(x)-x||/||x|| (top row) and
//    cos(B(x), x) (bottom row), one column per grow/freeze run, one line per token class.
std::optional<Figure> identity_figure(const std::vector<DiagnosedRun>& runs) {
  std::ostringstream dat;
  std::vector<std::string> top, bottom;
  int index = 0;
  for (const auto& [role, run] : runs) {
    std::vector<const DiagnosticPoint*> pts;
    for (const auto& d : run->diagnostics)
      if ((d.event == "growth" || d.event == "stage_end") && (has_values(d.identity_rel) || has_values(d.identity_cos))) pts.push_back(&d);
    if (pts.empty()) continue;
    dat << "# " << role->role << " (" << run->dir
        << "): depth step rel[first special structural content] cos[first special structural content]\n";
    std::vector<bool> rel_present(kClasses.size(), false), cos_present(kClasses.size(), false);
    for (const DiagnosticPoint* d : pts) {
      dat << d->depth << " " << d->step;
      for (size_t c = 0; c < kClasses.size(); ++c) {
        dat << " " << value_or_nan(d->identity_rel, kClasses[c]);
        rel_present[c] = rel_present[c] || d->identity_rel.count(kClasses[c]);
      }
      for (size_t c = 0; c < kClasses.size(); ++c) {
        dat << " " << value_or_nan(d->identity_cos, kClasses[c]);
        cos_present[c] = cos_present[c] || d->identity_cos.count(kClasses[c]);
      }
      dat << "\n";
    }
    dat << "\n\n";
    const std::string title = role->role + " seed " + std::to_string(run->config.run.seed);
    top.push_back(class_panel("identity.dat", index, title, 3, rel_present, {}));
    bottom.push_back(class_panel("identity.dat", index, title, 3 + static_cast<int>(kClasses.size()), cos_present, {}));
    ++index;
  }
  if (index == 0) return std::nullopt;
  std::ostringstream body;
  body << "set datafile missing 'NaN'\nset grid\nset key top right\nunset logscale y\n"
       << "set xlabel 'depth before growth (the last block is measured)'\nset xtics 1\n"
       << "set multiplot layout 2," << index << " title 'Identity mapping of the last block before each growth'\n"
       << "set ylabel '||B(x) - x|| / ||x||'\n";
  for (const auto& p : top) body << p;
  body << "set ylabel 'cos(B(x), x)'\n";
  for (const auto& p : bottom) body << p;
  body << "unset multiplot\n";
  return Figure{"identity", dat.str(), body.str(), 420 * index + 80, 760};
}

// Every plot the report has data for, in the report's order: ours, then the paper's figures
// (report/paper_figures.h) and the scaling figures (report/scaling.h); a plot without data becomes
// a line in `notes`.
std::vector<Figure> report_figures(const Report& report, std::vector<std::string>& notes) {
  std::vector<Figure> figures;
  if (std::optional<Figure> f = val_ce_figure(report)) figures.push_back(std::move(*f));
  else notes.push_back("no validation curves to plot");
  const std::vector<DiagnosedRun> runs = diagnosed_runs(report);
  if (std::optional<Figure> f = residual_rms_figure(runs)) figures.push_back(std::move(*f));
  else notes.push_back("no residual RMS diagnostics in the grow runs: residual_rms plot not made");
  if (std::optional<Figure> f = identity_figure(runs)) figures.push_back(std::move(*f));
  else notes.push_back("no growth-event identity diagnostics in the grow runs: identity plot not made");
  for (Figure& f : paper_figures(report, notes)) figures.push_back(std::move(f));
  if (const std::optional<Factorial> design = factorial_design(report))
    for (Figure& f : factorial_figures(*design, notes)) figures.push_back(std::move(f));
  for (Figure& f : scaling_figures(report.sweeps)) figures.push_back(std::move(f));
  return figures;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Runs gnuplot on <dir>/<name>.gp for each name; returns the images made (<name>.png, <name>.svg).
std::vector<std::string> render_plots(const fs::path& dir, const std::vector<std::string>& names,
                                      const std::string& gnuplot, std::vector<std::string>& notes) {
  std::vector<std::string> images;
  const std::string abs = fs::absolute(dir).string();
  for (const auto& name : names) {
    // gnuplot resolves file names against its working directory: start the script with a cd.
    const std::string wrapper = "cd " + quoted(abs) + "\nload " + quoted(name + ".gp") + "\n";
    write_text(dir / (name + ".run.gp"), wrapper);
    ProcessSpec p;
    p.argv = {gnuplot, (dir / (name + ".run.gp")).string()};
    p.log_path = (dir / "gnuplot.log").string();
    const int rc = run_process(p);
    fs::remove(dir / (name + ".run.gp"));
    if (rc != 0 || !fs::exists(dir / (name + ".png"))) {
      notes.push_back(name + ".gp: gnuplot failed (exit " + std::to_string(rc) + "), see gnuplot.log");
      continue;
    }
    images.push_back(name + ".png");
    images.push_back(name + ".svg");
  }
  return images;
}

}  // namespace

std::vector<std::string> write_report_plots(const Report& report, const ReportOptions& options,
                                            std::vector<std::string>& notes) {
  const fs::path dir(options.out_dir);
  std::vector<std::string> names;  // plots with a script ready
  for (const Figure& f : report_figures(report, notes)) {
    write_text(dir / (f.name + ".dat"), f.data);
    write_text(dir / (f.name + ".gp"), two_terminals(f.name, f.width, f.height, f.body));
    names.push_back(f.name);
  }
  if (names.empty()) return {};
  const std::string gnuplot = find_in_path(options.gnuplot);
  if (gnuplot.empty()) {
    notes.push_back("gnuplot not found: plot scripts (*.gp) and data (*.dat) written, images not rendered");
    return {};
  }
  return render_plots(dir, names, gnuplot, notes);
}

}  // namespace deepen
