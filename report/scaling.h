// Layout sweeps: the same run on several rank layouts, as a scaling table (tokens/s, per device,
// efficiency, the cost model's prediction, where the step time goes per role) and a figure.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace deepen {

struct RunData;
struct Figure;

// One layout of a sweep.
struct ScalingRow {
  std::string dir;
  std::string layout;          // config/layout_label.h: "1x2+2" (T x P + S), "2x1+4 pipelines", "1x1+4 grad_op"; "one process"
  int64_t T = 1, P = 1, S = 1;
  int64_t devices = 1;         // ranks of the job (T·P + S); 1 for one process
  double tokens_per_s = 0;     // measured: median over steps after warm-up (plan/cost_model.h)
  double per_device = 0;       // tokens_per_s / devices
  double efficiency = 1;       // per_device over the smallest layout's per_device
  std::optional<double> predicted;  // the cost model calibrated on the sweep's one-process run
  // Mean seconds per step by part, per role ("student", "teacher"), over the role's ranks and the
  // steps after warm-up (run_folder/step_time.h); "step" holds the mean step time.
  std::map<std::string, std::map<std::string, double>> breakdown;
  std::optional<double> error() const {
    return predicted ? std::optional<double>((*predicted - tokens_per_s) / tokens_per_s) : std::nullopt;
  }
};

struct ScalingSweep {
  std::string name;                // the first run's name with its layout taken off, e.g. "sweep"
  std::vector<ScalingRow> rows;    // by devices, then T, P, S, then the label (rank order, sharding)
  std::string calibration;         // the run the prediction was calibrated on ("" = none)
  std::vector<std::string> notes;  // why a prediction or breakdown is missing
};

// Runs that are the same experiment and seed (configs equal but for [parallel]'s layout, see
// config/without_layout) on at least two layouts form a sweep. Reads each run's metrics.jsonl and
// step_time/ records; predictions need a one-process run in the sweep (it calibrates the model's
// CPU FLOP/s: see plan/cost_model.h calibrate_cpu) and `cores`, the cores the runs shared.
// Example: runs layout-1x1+1 (one process), 1x1+2, 1x2+2, 2x1+2, 1x1+4 of configs/demo/sweep.toml
// -> one sweep of 5 rows, devices 1, 3, 4, 4, 5.
std::vector<ScalingSweep> find_scaling_sweeps(const std::vector<RunData>& runs, int64_t cores);

// The scaling section of report.md: per sweep a table of the layouts and the breakdown per role.
std::string scaling_markdown(const std::vector<ScalingSweep>& sweeps);
// One row per layout: sweep,layout,T,P,S,devices,tokens_per_s,per_device,efficiency,predicted,error
std::string scaling_csv(const std::vector<ScalingSweep>& sweeps);
// tokens/s against devices, measured and predicted, and the efficiency (one figure per sweep).
std::vector<Figure> scaling_figures(const std::vector<ScalingSweep>& sweeps);

}  // namespace deepen
