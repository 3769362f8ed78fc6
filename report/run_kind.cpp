// A run's kind from its config (see run_kind.h).
#include "report/run_kind.h"

namespace deepen {

RunKind run_kind(const Config& cfg, const std::string& teacher, int64_t full_depth) {
  if (teacher.rfind("none", 0) == 0) return RunKind::kPretrain;
  const auto& cur = cfg.curriculum;
  if (cur.mode == CurriculumMode::kGrow) return cur.freeze_prefix ? RunKind::kFreeze : RunKind::kGrow;
  if (!cur.budget.empty()) return RunKind::kJointMatched;
  if (cfg.student.layers < full_depth) return RunKind::kSingleBlock;
  if (cur.stages.size() == 1) return RunKind::kJoint;
  return cur.stages.size() == 2 ? RunKind::kJointLong : RunKind::kJointLonger;
}

bool is_joint_control(RunKind kind) {
  return kind == RunKind::kJoint || kind == RunKind::kJointMatched || kind == RunKind::kJointLong ||
         kind == RunKind::kJointLonger;
}

bool appends_blocks(RunKind kind) { return kind == RunKind::kGrow || kind == RunKind::kFreeze; }

std::string role_name(NormPlacement norm, RunKind kind) {
  return std::string(option_name(norm)) + "-" + option_name(kind);
}

const char* kind_color(RunKind kind) {
  static constexpr std::array<const char*, 8> colors{"#1f77b4", "#d62728", "#2ca02c", "#17becf",
                                                     "#8c564b", "#9467bd", "#ff7f0e", "#7f7f7f"};
  return colors[static_cast<size_t>(kind)];
}

}  // namespace deepen
