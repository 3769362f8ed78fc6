// The factorial study's report (see factorial.h).
#include "report/factorial.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "report/number_text.h"

namespace deepen {
namespace {

// The operators' order in tables and plots: the paper's (random) first, then the teacher's layers,
// then the student's own, then the function-preserving one. The first present is the baseline.
int operator_rank(GrowInit op) {
  switch (op) {
    case GrowInit::kRandom: return 0;
    case GrowInit::kTeacher: return 1;
    case GrowInit::kStack: return 2;
    case GrowInit::kIdentity: return 3;
  }
  return 4;
}

bool in_design(RunKind kind) { return kind == RunKind::kJoint || kind == RunKind::kGrow; }

std::vector<std::pair<long long, double>> final_ce_by_seed(const RoleSummary& role) {
  std::vector<std::pair<long long, double>> out;
  for (const RunData* r : role.runs) out.emplace_back(r->config.run.seed, r->evals.back().val_ce);
  return out;
}

std::vector<double> values_of(const std::vector<std::pair<long long, double>>& by_seed) {
  std::vector<double> out;
  for (const auto& [seed, v] : by_seed) out.push_back(v);
  return out;
}

std::string name_of(NormPlacement n) { return option_name(n); }
std::string name_of(GrowInit o) { return option_name(o); }
std::string name_of(RunKind k) { return option_name(k); }

// "m ± h" (4 decimals), "m" when there is no interval.
std::string with_interval(const Interval& i, bool sign = false) {
  const std::string m = sign ? signed_fixed(i.mean) : fixed(i.mean);
  return i.half_width ? m + " ± " + fixed(*i.half_width) : m;
}

// "[lo, hi]" of the interval (signed: a difference), "—" without one.
std::string bounds(const Interval& i, bool sign = false) {
  if (!i.half_width) return "—";
  const auto text = [sign](double v) { return sign ? signed_fixed(v) : fixed(v); };
  return "[" + text(i.mean - *i.half_width) + ", " + text(i.mean + *i.half_width) + "]";
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

class Design {
 public:
  explicit Design(const Factorial& f) : f_(f) {}
  const FactorialCell* cell(NormPlacement norm, RunKind kind, GrowInit op) const {
    for (const FactorialCell& c : f_.cells)
      if (c.norm == norm && c.kind == kind && c.op == op) return &c;
    return nullptr;
  }
  // Σ coefficient · cell over the named cells; none when a cell is missing.
  std::optional<Interval> contrast(const std::vector<std::tuple<double, NormPlacement, RunKind, GrowInit>>& terms) const {
    std::vector<ContrastCell> cells;
    for (const auto& [coefficient, norm, kind, op] : terms) {
      const FactorialCell* c = cell(norm, kind, op);
      if (!c) return std::nullopt;
      cells.push_back({coefficient, final_ce_by_seed(*c->role)});
    }
    return contrast_interval(cells);
  }

 private:
  const Factorial& f_;
};

std::string cell_name(NormPlacement norm, RunKind kind) { return role_name(norm, kind); }

void add_contrasts(Factorial& f) {
  const Design d(f);
  constexpr NormPlacement pre = NormPlacement::kPre;
  constexpr RunKind joint = RunKind::kJoint, grow = RunKind::kGrow;
  for (const GrowInit op : f.operators)
    for (const NormPlacement p : f.placements) {
      if (p == pre) continue;
      if (auto v = d.contrast({{1, p, grow, op}, {-1, pre, grow, op}, {-1, p, joint, op}, {1, pre, joint, op}}))
        f.interactions.push_back({"I(" + name_of(p) + " | " + name_of(op) + ")",
                                  "(" + cell_name(p, grow) + " − " + cell_name(pre, grow) + ") − (" + cell_name(p, joint) +
                                      " − " + cell_name(pre, joint) + "), " + name_of(op),
                                  p, op, *v});
    }
  if (f.operators.size() < 2) return;
  const GrowInit base = f.operators.front();
  for (size_t k = 1; k < f.operators.size(); ++k) {
    const GrowInit op = f.operators[k];
    for (const NormPlacement p : f.placements) {
      if (auto v = d.contrast({{1, p, grow, op}, {-1, p, joint, op}, {-1, p, grow, base}, {1, p, joint, base}}))
        f.operator_contrasts.push_back({"G(" + name_of(p) + " | " + name_of(op) + ")",
                                        "(" + cell_name(p, grow) + " − " + cell_name(p, joint) + ") at " + name_of(op) +
                                            " − the same at " + name_of(base),
                                        p, op, *v});
      if (p == pre) continue;
      if (auto v = d.contrast({{1, p, grow, op}, {-1, pre, grow, op}, {-1, p, joint, op}, {1, pre, joint, op},
                               {-1, p, grow, base}, {1, pre, grow, base}, {1, p, joint, base}, {-1, pre, joint, base}}))
        f.operator_contrasts.push_back({"I(" + name_of(p) + " | " + name_of(op) + ") − I(" + name_of(p) + " | " +
                                            name_of(base) + ")",
                                        "the placement's interaction at " + name_of(op) + " minus at " + name_of(base), p,
                                        op, *v});
    }
  }
}

void add_crossovers(Factorial& f) {
  const Design d(f);
  for (const GrowInit op : f.operators)
    for (const RunKind kind : {RunKind::kGrow, RunKind::kJoint}) {
      const FactorialCell* pre = d.cell(NormPlacement::kPre, kind, op);
      if (!pre) continue;
      for (const NormPlacement p : f.placements) {
        const FactorialCell* other = p == NormPlacement::kPre ? nullptr : d.cell(p, kind, op);
        if (!other) continue;
        if (auto x = crossover(*pre->role, *other->role)) f.crossovers.push_back({op, kind, p, *x});
      }
    }
}

void add_growth_changes(Factorial& f) {
  for (const FactorialCell& c : f.cells) {
    if (c.kind != RunKind::kGrow) continue;
    // Per growth k: (seed, before, delta) over the seeds, with the first seed's step and depths.
    std::map<int, std::vector<const DiagnosticPoint*>> per_growth;
    std::map<int, std::vector<double>> before, delta;
    for (const RunData* r : c.role->runs) {
      int k = 0;
      for (const DiagnosticPoint& d : r->diagnostics) {
        if (!d.growth) continue;
        per_growth[k].push_back(&d);
        before[k].push_back(d.growth->ce_before);
        delta[k].push_back(d.growth->ce_after - d.growth->ce_before);
        ++k;
      }
    }
    for (const auto& [k, points] : per_growth) {
      const DiagnosticPoint& first = *points.front();
      f.growth_changes.push_back(
          {c.norm, c.op, k, first.step, first.growth->depth_before, first.depth, mean_interval(before[k]), mean_interval(delta[k])});
    }
  }
}

}  // namespace

const char* placement_color(NormPlacement norm) {
  switch (norm) {
    case NormPlacement::kPre: return "#1f77b4";
    case NormPlacement::kPost: return "#d62728";
    case NormPlacement::kPeri: return "#2ca02c";
    case NormPlacement::kMix: return "#9467bd";
    case NormPlacement::kPreScaled: return "#ff7f0e";
  }
  return "#7f7f7f";
}

std::optional<Factorial> factorial_design(const Report& report) {
  std::set<NormPlacement> placements;
  std::set<GrowInit> operators;
  for (const RoleSummary& s : report.roles)
    if (in_design(s.kind)) {
      placements.insert(s.norm);
      operators.insert(s.op);
    }
  const bool paper_placements =
      std::all_of(placements.begin(), placements.end(), [](NormPlacement n) { return n == NormPlacement::kPre || n == NormPlacement::kPost; });
  if (placements.empty() || (paper_placements && operators.size() <= 1)) return std::nullopt;
  Factorial f;
  f.placements.assign(placements.begin(), placements.end());
  f.operators.assign(operators.begin(), operators.end());
  std::sort(f.operators.begin(), f.operators.end(), [](GrowInit a, GrowInit b) { return operator_rank(a) < operator_rank(b); });
  for (const NormPlacement p : f.placements)
    for (const GrowInit op : f.operators)
      for (const RunKind kind : {RunKind::kJoint, RunKind::kGrow})
        if (const RoleSummary* s = find_role(report, p, kind, op)) {
          FactorialCell c{p, kind, op, s, mean_interval(values_of(final_ce_by_seed(*s))), std::nullopt};
          std::vector<double> kl;
          for (const RunData* r : s->runs)
            if (r->evals.back().val_kl) kl.push_back(*r->evals.back().val_kl);
          if (kl.size() == s->runs.size()) c.val_kl = mean_interval(kl);
          f.cells.push_back(c);
        }
  add_contrasts(f);
  add_crossovers(f);
  add_growth_changes(f);
  return f;
}

std::string factorial_markdown(const Factorial& f) {
  std::ostringstream md;
  auto list = [](const auto& items) {
    std::string out;
    for (const auto& x : items) out += (out.empty() ? "" : ", ") + name_of(x);
    return out;
  };
  md << "\n## Factorial design: norm placement × curriculum × growth operator\n\n"
     << "Factors: student.norm ∈ {" << list(f.placements) << "}, curriculum ∈ {joint, grow}, curriculum.grow_init ∈ {"
     << list(f.operators) << "}. A cell's value is the final validation CE (each run's last eval record) over its "
     << "seeds: mean ± the half-width of the two-sided 95% t-interval, t(0.975, n − 1) · s / √n (none for n = 1); "
     << "n is the number of seeds. In a joint run the operator decides only how the first blocks start "
     << "(teacher: the teacher's layers; random, stack, identity: the config's init).\n\n"
     << "| placement | curriculum | operator | n | val CE | 95% interval | val KL | steps | finished |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  for (const FactorialCell& c : f.cells)
    md << "| " << name_of(c.norm) << " | " << name_of(c.kind) << " | " << name_of(c.op) << " | " << c.val_ce.n << " | "
       << with_interval(c.val_ce) << " | " << bounds(c.val_ce) << " | " << (c.val_kl ? with_interval(*c.val_kl) : "—")
       << " | " << c.role->steps << " | " << (c.role->complete ? "yes" : "no") << " |\n";

  md << "\n### Interaction with the curriculum, against pre-norm\n\n"
     << "I(p | o) = (p-grow − pre-grow) − (p-joint − pre-joint) with operator o: the paper's interaction (theirs: "
     << "post-norm −0.0332) for every placement and operator. Negative: p gains more from growth than pre-norm. "
     << "Interval: paired by seed (the seeds all four cells have; per-seed contrast, t with n − 1 df), Welch's "
     << "otherwise.\n\n";
  auto contrast_table = [&](const std::vector<Contrast>& rows) {
    md << "| contrast | cells | estimate | 95% interval | n | interval from |\n|---|---|---|---|---|---|\n";
    for (const Contrast& c : rows)
      md << "| " << c.name << " | " << c.formula << " | " << with_interval(c.value, true) << " | " << bounds(c.value, true)
         << " | " << c.value.n << " | " << c.value.method << (c.value.half_width ? ", df " + general(c.value.df) : "")
         << " |\n";
  };
  if (f.interactions.empty()) md << "Needs the joint and grow cells of pre-norm and another placement at one operator.\n";
  else contrast_table(f.interactions);

  if (f.operators.size() > 1) {
    md << "\n### Growth operators against " << name_of(f.operators.front()) << "\n\n"
       << "G(p | o) = (p-grow − p-joint) at operator o minus the same at " << name_of(f.operators.front())
       << ": does the operator change what growth is worth to placement p? I(p | o) − I(p | "
       << name_of(f.operators.front()) << "): does the placement's interaction depend on the operator?\n\n";
    if (f.operator_contrasts.empty()) md << "Needs joint and grow cells at both operators.\n";
    else contrast_table(f.operator_contrasts);
  }

  md << "\n### Phase-wise crossover against pre-norm\n\n"
     << "Mean validation CE over seeds at the common eval steps of each pair; per stage, who leads at the stage's "
     << "last eval point and the step from which the placement stays ahead of pre-norm to the stage's end.\n\n";
  if (f.crossovers.empty()) {
    md << "Needs pre-norm and another placement with common eval steps.\n";
  } else {
    md << "| operator | curriculum | pair | stage | depth | eval steps | pre val CE | val CE | leads | − pre | ahead from step |\n"
       << "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const PairCrossover& p : f.crossovers)
      for (const StageCrossover& s : p.crossover.stages) {
        const std::string leader = s.post_ce < s.pre_ce ? name_of(p.other) : s.pre_ce < s.post_ce ? "pre" : "tie";
        md << "| " << name_of(p.op) << " | " << name_of(p.kind) << " | " << name_of(p.other) << " vs pre | " << s.stage
           << " | " << s.depth << " | " << s.first_step << "–" << s.last_step << " | " << fixed(s.pre_ce) << " | "
           << fixed(s.post_ce) << " | " << leader << " | " << signed_fixed(s.post_ce - s.pre_ce) << " | "
           << (s.post_ahead_from_step ? std::to_string(*s.post_ahead_from_step) : std::string("—")) << " |\n";
      }
    md << "\n";
    for (const PairCrossover& p : f.crossovers)
      md << "- " << name_of(p.op) << ", " << name_of(p.kind) << ": " << name_of(p.other)
         << (p.crossover.post_ahead_from_step
                 ? " stays ahead of pre-norm from step " + std::to_string(*p.crossover.post_ahead_from_step) + " to the end"
                 : " is not ahead of pre-norm at the last eval point")
         << " (" << p.crossover.eval_points << " common eval points).\n";
  }

  md << "\n### Loss change at each growth\n\n"
     << "CE on the labels of the fixed diagnostic batch just before and just after the blocks are appended (the "
     << "trainer's \"grown\" diagnostics event): what the operator does to the function, before any step at the "
     << "new depth. Identity is function-preserving for pre, pre_scaled, peri and mix's pre-norm layers (Δ = 0); "
     << "a post-norm layer renormalizes its input.\n\n";
  if (f.growth_changes.empty()) {
    md << "No \"grown\" records in the grow runs.\n";
  } else {
    md << "| placement | operator | growth | at step | depth | CE before | Δ CE (after − before) | 95% interval | n |\n"
       << "|---|---|---|---|---|---|---|---|---|\n";
    for (const GrowthStepChange& g : f.growth_changes)
      md << "| " << name_of(g.norm) << " | " << name_of(g.op) << " | " << g.growth + 1 << " | " << g.step << " | "
         << g.depth_before << " → " << g.depth_after << " | " << fixed(g.ce_before.mean) << " | "
         << with_interval(g.delta_ce, true) << " | " << bounds(g.delta_ce, true) << " | " << g.delta_ce.n << " |\n";
  }
  return md.str();
}

std::string factorial_csv(const Factorial& f) {
  std::ostringstream csv;
  csv << "placement,curriculum,operator,role,n,val_ce_mean,val_ce_half_width_95,val_kl_mean,val_kl_half_width_95,steps,complete\n";
  for (const FactorialCell& c : f.cells)
    csv << name_of(c.norm) << "," << name_of(c.kind) << "," << name_of(c.op) << "," << c.role->role << "," << c.val_ce.n
        << "," << precise(c.val_ce.mean) << "," << (c.val_ce.half_width ? precise(*c.val_ce.half_width) : "") << ","
        << (c.val_kl ? precise(c.val_kl->mean) : "") << "," << (c.val_kl && c.val_kl->half_width ? precise(*c.val_kl->half_width) : "")
        << "," << c.role->steps << "," << (c.role->complete ? 1 : 0) << "\n";
  return csv.str();
}

std::string contrasts_csv(const Factorial& f) {
  std::ostringstream csv;
  csv << "contrast,placement,operator,estimate,half_width_95,n,method,df\n";
  for (const auto* rows : {&f.interactions, &f.operator_contrasts})
    for (const Contrast& c : *rows)
      csv << "\"" << c.name << "\"," << name_of(c.norm) << "," << name_of(c.op) << "," << precise(c.value.mean) << ","
          << (c.value.half_width ? precise(*c.value.half_width) : "") << "," << c.value.n << "," << c.value.method << ","
          << (c.value.half_width ? precise(c.value.df) : "") << "\n";
  return csv.str();
}

std::vector<Figure> factorial_figures(const Factorial& f, std::vector<std::string>& notes) {
  std::vector<Figure> out;
  const Design d(f);
  const int panels = static_cast<int>(f.operators.size());
  const std::string layout = "set multiplot layout 1," + std::to_string(panels);

  // Final CE: joint and grow on x, a line per placement, one panel per operator.
  {
    std::ostringstream dat, body;
    body << "set xrange [-0.4:1.4]\nset xtics ('joint' 0, 'grow' 1)\nset ylabel 'final validation CE'\nset grid\n"
         << "set key outside bottom center horizontal\n" << layout
         << " title 'Final validation CE by placement (mean, 95% t-interval over seeds), a panel per growth operator'\n";
    int index = 0;
    for (const GrowInit op : f.operators) {
      std::string plot;
      for (const NormPlacement p : f.placements) {
        dat << "# " << name_of(op) << " " << name_of(p) << ": x mean half_width\n";
        for (const auto [x, kind] : {std::pair{0, RunKind::kJoint}, std::pair{1, RunKind::kGrow}})
          if (const FactorialCell* c = d.cell(p, kind, op))
            dat << x << " " << plot_number(c->val_ce.mean) << " " << plot_number(c->val_ce.half_width.value_or(0)) << "\n";
        dat << "\n\n";
        plot += (plot.empty() ? "plot " : ", \\\n     ") + quoted("factorial_interaction.dat") + " index " +
                std::to_string(index++) + " using 1:2:3 with yerrorlines pt 7 ps 1 lw 2 lc rgb '" + placement_color(p) +
                "' title " + quoted(name_of(p));
      }
      body << "set title " << quoted("operator: " + name_of(op)) << "\n" << plot << "\n";
    }
    body << "unset multiplot\n";
    out.push_back({"factorial_interaction", dat.str(), body.str(), 420 * panels + 120, 560});
  }

  // Validation CE over training: a curve per placement (grow solid, joint dashed), a panel per operator.
  {
    std::ostringstream dat, body;
    body << "set xlabel 'optimizer step'\nset ylabel 'validation CE'\nset grid\nset key outside bottom center horizontal\n"
         << layout << " title 'Validation CE (mean over seeds): grow solid, joint dashed, a panel per growth operator'\n";
    int index = 0;
    bool any = false;
    for (const GrowInit op : f.operators) {
      std::string plot;
      for (const NormPlacement p : f.placements)
        for (const RunKind kind : {RunKind::kGrow, RunKind::kJoint}) {
          const FactorialCell* c = d.cell(p, kind, op);
          if (!c) continue;
          dat << "# " << c->role->role << ": step val_ce\n";
          for (const CurvePoint& pt : mean_curve(*c->role)) dat << pt.step + 1 << " " << plot_number(pt.val_ce) << "\n";
          dat << "\n\n";
          plot += (plot.empty() ? "plot " : ", \\\n     ") + quoted("factorial_val_ce.dat") + " index " +
                  std::to_string(index++) + " using 1:2 with lines lw 2 dt " + (kind == RunKind::kGrow ? "1" : "2") +
                  " lc rgb '" + placement_color(p) + "' title " + quoted(name_of(p) + "-" + name_of(kind));
          any = true;
        }
      body << "set title " << quoted("operator: " + name_of(op)) << "\n" << (plot.empty() ? "plot NaN notitle" : plot) << "\n";
    }
    body << "unset multiplot\n";
    if (any) out.push_back({"factorial_val_ce", dat.str(), body.str(), 480 * panels + 120, 560});
  }

  // Interaction contrasts with their intervals, grouped by operator along x.
  if (f.interactions.empty()) {
    notes.push_back("factorial_contrasts needs the joint and grow cells of pre-norm and another placement");
  } else {
    std::ostringstream dat, body, xtics;
    std::string plot;
    double x = 0;
    std::map<NormPlacement, std::string> rows;
    for (const GrowInit op : f.operators) {
      bool any = false;
      for (const Contrast& c : f.interactions)
        if (c.op == op) {
          rows[c.norm] += plot_number(x) + " " + plot_number(c.value.mean) + " " +
                          plot_number(c.value.half_width.value_or(0)) + "\n";
          // Double quotes: gnuplot reads \n as a line break only there.
          xtics << (xtics.str().empty() ? "" : ", ") << "\"" << name_of(c.norm) << "\\n" << name_of(op) << "\" " << x;
          x += 1;
          any = true;
        }
      if (any) x += 0.5;  // a gap between operators
    }
    int index = 0;
    for (const auto& [norm, text] : rows) {
      dat << "# " << name_of(norm) << ": x I half_width\n" << text << "\n\n";
      plot += (plot.empty() ? "plot " : ", \\\n     ") + quoted("factorial_contrasts.dat") + " index " +
              std::to_string(index++) + " using 1:2:3 with yerrorbars pt 7 ps 1.2 lw 2 lc rgb '" + placement_color(norm) +
              "' title " + quoted(name_of(norm));
    }
    body << "set title 'Interaction I(p | o) = (p-grow - pre-grow) - (p-joint - pre-joint), 95% interval'\n"
         << "set ylabel 'I (validation CE)'\nset grid\nset key outside right top\nset xzeroaxis lt -1\nset bmargin 5\n"
         << "set xrange [-0.6:" << plot_number(x - 0.4) << "]\nset xtics (" << xtics.str() << ")\n"
         << plot << "\n";
    out.push_back({"factorial_contrasts", dat.str(), body.str(), std::max(700, 90 * static_cast<int>(x) + 260), 520});
  }
  return out;
}

}  // namespace deepen
