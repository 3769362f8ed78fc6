// Fused-or-ops choice for the fp32 CPU decoder steps: parsing, shape classes, the timing cache.
#include "model/cpu_kernel_choice.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "config/input_error.h"
#include "config/text_file.h"

namespace deepen {

const char* fused_step_name(FusedStep step) {
  switch (step) {
    case FusedStep::kRmsNorm: return "rms_norm";
    case FusedStep::kQkvRope: return "qkv_norm_rope";
    case FusedStep::kSwiGluMlp: return "swiglu_mlp";
  }
  return "?";
}

bool StepShape::operator<(const StepShape& o) const {
  return std::tie(step, rows, dims, threads) < std::tie(o.step, o.rows, o.dims, o.threads);
}

StepShape shape_class(FusedStep step, int64_t rows, std::array<int64_t, 4> dims, int64_t threads) {
  int64_t pow2 = 1;
  while (pow2 < rows) pow2 *= 2;
  return StepShape{step, pow2, dims, threads};
}

int64_t calibration_rows(int64_t rows, double row_flops) {
  constexpr double kBudgetFlops = 4e9;
  constexpr int64_t kMinRows = 64;
  const double cap = std::max(static_cast<double>(kMinRows), std::floor(kBudgetFlops / std::max(row_flops, 1.0)));
  return std::max<int64_t>(1, std::min(rows, static_cast<int64_t>(cap)));
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

bool fused_is_faster(std::vector<double> fused_ms, std::vector<double> ops_ms) {
  return median(std::move(fused_ms)) < median(std::move(ops_ms));
}

bool CpuKernelCalibration::use_fused(CpuKernels mode, const StepShape& shape, int64_t calibration_rows,
                                     const Timed& run_fused, const Timed& run_ops) {
  if (mode == CpuKernels::kFused) return true;
  if (mode == CpuKernels::kAten) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = cache_.find(shape); it != cache_.end()) return it->second.fused;
  auto ms = [](const Timed& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  // Alternating, so both see the same machine load (other processes, frequency changes).
  run_fused();
  run_ops();
  std::vector<double> fused_ms, ops_ms;
  for (int i = 0; i < reps; ++i) {
    fused_ms.push_back(ms(run_fused));
    ops_ms.push_back(ms(run_ops));
  }
  StepCalibration c{shape, median(fused_ms), median(ops_ms), calibration_rows, fused_is_faster(fused_ms, ops_ms)};
  cache_.emplace(shape, c);
  if (!record_path_.empty()) write_record_locked();
  return c.fused;
}

namespace {

std::string decisions_json(const std::map<StepShape, StepCalibration>& cache) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& [shape, c] : cache)
    list.push_back({{"step", fused_step_name(shape.step)}, {"rows", shape.rows}, {"dims", shape.dims},
                    {"threads", shape.threads}, {"fused", c.fused}, {"fused_ms", c.fused_ms}, {"ops_ms", c.ops_ms},
                    {"calibration_rows", c.calibration_rows}});
  return nlohmann::ordered_json{{"version", 1}, {"decisions", list}}.dump(1) + "\n";
}

FusedStep parse_step(const std::string& name, const std::string& where) {
  for (FusedStep s : {FusedStep::kRmsNorm, FusedStep::kQkvRope, FusedStep::kSwiGluMlp})
    if (name == fused_step_name(s)) return s;
  throw InputError(where + ": unknown step \"" + name + "\"");
}

}  // namespace

std::vector<StepCalibration> CpuKernelCalibration::from_json(const std::string& text, const std::string& where) {
  std::vector<StepCalibration> out;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.at("version").get<int>() != 1)
      throw InputError(where + ": version " + j.at("version").dump() + " (this build reads version 1)");
    for (const nlohmann::json& d : j.at("decisions")) {
      StepCalibration c;
      c.shape.step = parse_step(d.at("step").get<std::string>(), where);
      c.shape.rows = d.at("rows").get<int64_t>();
      c.shape.dims = d.at("dims").get<std::array<int64_t, 4>>();
      c.shape.threads = d.at("threads").get<int64_t>();
      c.fused = d.at("fused").get<bool>();
      c.fused_ms = d.value("fused_ms", 0.0);
      c.ops_ms = d.value("ops_ms", 0.0);
      c.calibration_rows = d.value("calibration_rows", int64_t{0});
      out.push_back(c);
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": not a record of CPU kernel decisions (" + e.what() +
                     "); delete it to time the kernels again");
  }
  return out;
}

void CpuKernelCalibration::record_to(const std::string& path, bool reuse) {
  std::lock_guard<std::mutex> lock(mutex_);
  record_path_ = path;
  if (!reuse || !std::filesystem::exists(path)) return;
  for (const StepCalibration& c : from_json(read_file_text(path, "CPU kernel record"), path)) cache_[c.shape] = c;
}

void CpuKernelCalibration::write_record_locked() const {
  namespace fs = std::filesystem;
  const fs::path path(record_path_), tmp(record_path_ + ".tmp");
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << decisions_json(cache_);
    if (!out.flush()) throw InputError(tmp.string() + ": cannot write the CPU kernel decisions");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw InputError(path.string() + ": cannot write the CPU kernel decisions (" + ec.message() + ")");
}

std::vector<StepCalibration> CpuKernelCalibration::measurements() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<StepCalibration> out;
  for (const auto& [shape, c] : cache_) out.push_back(c);
  return out;
}

CpuKernelCalibration& process_cpu_kernel_calibration() {
  static CpuKernelCalibration calibration;
  return calibration;
}

}  // namespace deepen
