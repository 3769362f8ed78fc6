// Layout sweeps as a scaling table and figure (see scaling.h).
#include "report/scaling.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

#include "config/config.h"
#include "config/layout_label.h"
#include "plan/cost_model.h"
#include "report/number_text.h"
#include "report/paper_figures.h"
#include "report/report.h"
#include "run_folder/jsonl.h"
#include "run_folder/run_folder.h"
#include "run_folder/step_time.h"

namespace deepen {
namespace {

// Steps left out at the start of every run (and of every stage in the measured rate): allocator and
// first-touch warm-up, as plan/cost_model.h measured_tokens_per_s.
constexpr int64_t kWarmupSteps = 2;
// MPI shared-memory bytes/s between ranks on one machine (deepen plan's --p2p-bw default).
constexpr double kCpuP2pBytesPerS = 5e9;

// Same experiment and seed, whatever the layout.
std::pair<uint64_t, int64_t> sweep_key(const Config& cfg) { return {experiment_signature(cfg), cfg.run.seed}; }

// A run moved logits over a channel unless it ran as one process (then "channel_bytes" is 0).
bool ran_as_one_process(const std::string& dir) {
  const auto metrics = read_jsonl(RunFolder(dir).metrics_jsonl());
  return !metrics.empty() && metrics.front().value("channel_bytes", 0.0) == 0;
}

double mean_of(const std::map<int64_t, double>& by_depth) {
  double sum = 0;
  for (const auto& [depth, v] : by_depth) sum += v;
  return by_depth.empty() ? 0 : sum / static_cast<double>(by_depth.size());
}

std::map<std::string, std::map<std::string, double>> mean_breakdown(const std::string& dir) {
  std::map<std::string, std::map<std::string, double>> sums;
  std::map<std::string, int64_t> counts;
  for (const nlohmann::json& j : read_step_times(dir)) {
    if (j.value("step", int64_t{0}) < kWarmupSteps) continue;
    const std::string role = j.value("role", std::string("?"));
    auto& s = sums[role];
    s["step"] += j.value("time_s", 0.0);
    if (j.contains("parts"))
      for (const auto& [part, v] : j["parts"].items()) s[part] += v.get<double>();
    ++counts[role];
  }
  for (auto& [role, parts] : sums)
    for (auto& [part, v] : parts) v /= static_cast<double>(counts[role]);
  return sums;
}

std::string sweep_name(const std::string& run_name, const ScalingRow& r) {
  // "sweep-t1p2s2" (T, P, S) -> "sweep"; other names stay whole.
  const std::string tag = "-t" + std::to_string(r.T) + "p" + std::to_string(r.P) + "s" + std::to_string(r.S);
  if (run_name.size() > tag.size() && run_name.compare(run_name.size() - tag.size(), tag.size(), tag) == 0)
    return run_name.substr(0, run_name.size() - tag.size());
  return run_name;
}

}  // namespace

std::vector<ScalingSweep> find_scaling_sweeps(const std::vector<RunData>& runs, int64_t cores) {
  std::map<std::pair<uint64_t, int64_t>, std::vector<const RunData*>> groups;
  std::vector<std::pair<uint64_t, int64_t>> order;
  for (const RunData& r : runs) {
    const auto key = sweep_key(r.config);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&r);
  }
  std::vector<ScalingSweep> sweeps;
  for (const auto& key : order) {
    const auto& members = groups[key];
    std::vector<ScalingRow> rows;
    std::vector<std::string> names;
    for (const RunData* r : members) {
      ScalingRow row;
      row.dir = r->dir;
      const ParallelConfig& p = r->config.parallel;
      row.T = p.teacher_pipelines;
      row.P = p.teacher_stages;
      row.S = p.students;
      const bool one = ran_as_one_process(r->dir);
      row.layout = one ? "one process" : layout_label(p);
      row.devices = one ? 1 : row.T * row.P + row.S;
      try {
        row.tokens_per_s = mean_of(measured_tokens_per_s(r->dir, kWarmupSteps));
      } catch (const std::exception&) {
        continue;  // no steps after warm-up: nothing to measure
      }
      row.per_device = row.tokens_per_s / static_cast<double>(row.devices);
      row.breakdown = mean_breakdown(r->dir);
      rows.push_back(std::move(row));
      names.push_back(r->config.run.name);
    }
    // A sweep has at least two layouts; one layout run twice is not one.
    std::vector<std::string> layouts;
    for (const auto& row : rows) layouts.push_back(row.layout);
    std::sort(layouts.begin(), layouts.end());
    if (std::unique(layouts.begin(), layouts.end()) - layouts.begin() < 2) continue;

    ScalingSweep sweep;
    sweep.name = sweep_name(names.front(), rows.front());
    std::vector<size_t> idx(rows.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return std::tie(rows[a].devices, rows[a].T, rows[a].P, rows[a].S, rows[a].layout) <
             std::tie(rows[b].devices, rows[b].T, rows[b].P, rows[b].S, rows[b].layout);
    });
    for (size_t i : idx) sweep.rows.push_back(rows[i]);
    const double base = sweep.rows.front().per_device;
    for (auto& row : sweep.rows) row.efficiency = base > 0 ? row.per_device / base : 0;

    // The cost model, calibrated on the sweep's one-process run (its measured rate fixes the CPU's
    // FLOP/s), predicts every layout from its config alone.
    const auto cal = std::find_if(sweep.rows.begin(), sweep.rows.end(), [](const ScalingRow& r) { return r.devices == 1; });
    if (cal == sweep.rows.end()) {
      sweep.notes.push_back("no one-process run in the sweep: no prediction (add a layout that runs as one process, "
                            "or compare with `deepen plan --cluster`)");
    } else {
      try {
        const Config cal_cfg = load_config(RunFolder(cal->dir).config_toml());
        const PlanInput in = plan_input_from_config(cal_cfg);
        const int64_t threads = cal_cfg.run.threads > 0 ? cal_cfg.run.threads : cores;
        int64_t ranks = 1;
        for (const auto& r : sweep.rows) ranks = std::max(ranks, r.devices);
        const ClusterSpec c = calibrate_cpu(in, measured_tokens_per_s(cal->dir, kWarmupSteps), threads, cores, ranks,
                                            kCpuP2pBytesPerS);
        sweep.calibration = cal->dir;
        std::vector<std::string> dirs;
        for (const auto& r : sweep.rows) dirs.push_back(r.dir);
        std::map<std::string, std::map<int64_t, double>> predicted;
        for (const CheckRow& cr : check_against_runs(c, dirs)) predicted[cr.run][cr.depth] = cr.predicted;
        for (auto& r : sweep.rows)
          if (predicted.count(r.dir)) r.predicted = mean_of(predicted[r.dir]);
      } catch (const std::exception& e) {
        sweep.notes.push_back(std::string("no prediction: ") + e.what());
      }
    }
    sweeps.push_back(std::move(sweep));
  }
  return sweeps;
}

std::string scaling_markdown(const std::vector<ScalingSweep>& sweeps) {
  std::ostringstream md;
  for (const ScalingSweep& s : sweeps) {
    md << "\n## Scaling: " << s.name << "\n\n"
       << "The same run on " << s.rows.size() << " layouts (T pipelines x P stages + S students). tokens/s: median "
       << "per step after " << kWarmupSteps << " warm-up steps; efficiency: tokens/s per device against the "
       << "smallest layout; predicted: `deepen plan`'s cost model"
       << (s.calibration.empty() ? "" : ", calibrated on " + s.calibration) << ".\n\n"
       << "| layout | devices | tokens/s | per device | efficiency | predicted | error |\n"
       << "|---|---:|---:|---:|---:|---:|---:|\n";
    for (const ScalingRow& r : s.rows) {
      md << "| " << r.layout << " | " << r.devices << " | " << fixed(r.tokens_per_s, 0) << " | " << fixed(r.per_device, 0)
         << " | " << fixed(r.efficiency, 2) << " | " << (r.predicted ? fixed(*r.predicted, 0) : "—") << " | "
         << (r.error() ? signed_fixed(100 * *r.error(), 1) + "%" : "—") << " |\n";
    }
    for (const char* role : {"student", "teacher"}) {
      const std::vector<std::string>& parts = std::string(role) == "student" ? student_time_parts() : teacher_time_parts();
      bool any = false;
      for (const ScalingRow& r : s.rows) any |= r.breakdown.count(role) > 0;
      if (!any) continue;
      md << "\nWhere a " << role << " rank's step goes (mean over its ranks; share of the step; "
         << "run_folder/step_time.h names the parts):\n\n| layout | step ms |";
      for (const auto& p : parts) md << " " << p << " |";
      md << "\n|---|---:|";
      for (size_t i = 0; i < parts.size(); ++i) md << "---:|";
      md << "\n";
      for (const ScalingRow& r : s.rows) {
        const auto it = r.breakdown.find(role);
        if (it == r.breakdown.end()) continue;
        const double step = it->second.count("step") ? it->second.at("step") : 0;
        md << "| " << r.layout << " | " << fixed(1e3 * step, 1) << " |";
        for (const auto& p : parts) {
          const auto v = it->second.find(p);
          md << " " << (v == it->second.end() || step <= 0 ? "—" : fixed(100 * v->second / step, 1) + "%") << " |";
        }
        md << "\n";
      }
    }
    for (const auto& n : s.notes) md << "\n- " << n << "\n";
    if (!s.rows.empty()) {
      double worst = 0;
      bool any = false;
      for (const auto& r : s.rows)
        if (r.error()) {
          worst = std::max(worst, std::abs(*r.error()));
          any = true;
        }
      if (any) md << "\nWorst prediction error: " << fixed(100 * worst, 1) << "%.\n";
      md << "\n![scaling_" << s.name << "](scaling_" << s.name << ".png)\n";
    }
  }
  return md.str();
}

std::string scaling_csv(const std::vector<ScalingSweep>& sweeps) {
  std::ostringstream csv;
  csv << "sweep,layout,T,P,S,devices,tokens_per_s,per_device,efficiency,predicted,error\n";
  for (const ScalingSweep& s : sweeps)
    for (const ScalingRow& r : s.rows)
      csv << s.name << "," << r.layout << "," << r.T << "," << r.P << "," << r.S << "," << r.devices << ","
          << precise(r.tokens_per_s) << "," << precise(r.per_device) << "," << precise(r.efficiency) << ","
          << (r.predicted ? precise(*r.predicted) : "") << "," << (r.error() ? precise(*r.error()) : "") << "\n";
  return csv.str();
}

std::vector<Figure> scaling_figures(const std::vector<ScalingSweep>& sweeps) {
  std::vector<Figure> out;
  for (const ScalingSweep& s : sweeps) {
    Figure f;
    f.name = "scaling_" + s.name;
    std::ostringstream data;
    data << "# devices tokens_per_s predicted efficiency layout\n";
    for (const ScalingRow& r : s.rows)
      data << r.devices << " " << plot_number(r.tokens_per_s) << " " << (r.predicted ? plot_number(*r.predicted) : "NaN")
           << " " << plot_number(r.efficiency) << " \"" << r.layout << "\"\n";
    f.data = data.str();
    const std::string dat = "'" + f.name + ".dat'";
    std::ostringstream gp;
    gp << "set multiplot layout 1,2 title 'Scaling: " << s.name << "'\n"
       << "set xlabel 'devices (ranks)'\nset ylabel 'tokens/s'\nset key top left\nset grid\n"
       << "set offsets 0.5, 0.5, 0, 0\n"
       << "plot " << dat << " using 1:2 with linespoints pt 7 lc rgb '#1f77b4' title 'measured', \\\n"
       << "     " << dat << " using 1:3 with points pt 6 ps 1.5 lc rgb '#d62728' title 'predicted', \\\n"
       << "     " << dat << " using 1:2:5 with labels offset 0,1 font ',8' notitle\n"
       << "set ylabel 'efficiency (tokens/s per device vs smallest)'\nset yrange [0:*]\nset key top right\n"
       << "plot " << dat << " using 1:4 with linespoints pt 7 lc rgb '#2ca02c' title 'efficiency', \\\n"
       << "     " << dat << " using 1:4:5 with labels offset 0,1 font ',8' notitle\n"
       << "unset multiplot\nunset yrange\n";
    f.body = gp.str();
    f.width = 1100;
    f.height = 480;
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace deepen
