// Fused-or-ops choice for the fp32 CPU decoder steps: parsing, shape classes, the timing cache.
#include "model/cpu_kernel_choice.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "config/input_error.h"

namespace deepen {

CpuKernels parse_cpu_kernels(const std::string& text, const std::string& where) {
  if (text == "auto") return CpuKernels::kAuto;
  if (text == "fused") return CpuKernels::kFused;
  if (text == "aten") return CpuKernels::kAten;
  throw InputError(where + ": must be \"auto\", \"fused\" or \"aten\", got \"" + text + "\"");
}

const char* cpu_kernels_name(CpuKernels mode) {
  switch (mode) {
    case CpuKernels::kAuto: return "auto";
    case CpuKernels::kFused: return "fused";
    case CpuKernels::kAten: return "aten";
  }
  return "?";
}

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
  return c.fused;
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
