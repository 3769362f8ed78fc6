// RunKind: what a run is in the study (joint, grow, a control), read from its config, never its name.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "config/config.h"

namespace deepen {

// In the table's order: the paper's core runs first, then the controls, then pretraining.
//   joint         curriculum.mode = "joint", no budget, student.layers = the study's full depth
//   grow          curriculum.mode = "grow", freeze_prefix = false
//   joint-matched curriculum.mode = "joint" with budget = "active_layer_tokens:<run>"
//   joint-long    curriculum.mode = "joint" at full depth, no budget, two phases (the paper's
//                 post-joint-long: the LR restarts at the grow runs' boundary)
//   joint-longer  the same over three or more phases (the paper's post-joint-longer)
//   single-block  curriculum.mode = "joint", student.layers < the study's full depth (the deepest
//                 student among the runs of the report)
//   freeze        curriculum.mode = "grow", freeze_prefix = true
//   pretrain      no teacher (run.json teacher starts with "none"): listed, not compared
enum class RunKind { kJoint, kGrow, kJointMatched, kJointLong, kJointLonger, kSingleBlock, kFreeze, kPretrain };
template <> struct OptionSpelling<RunKind> {
  static constexpr std::array names{"joint",        "grow",         "joint-matched", "joint-long",
                                    "joint-longer", "single-block", "freeze",        "pretrain"};
};

//   run_kind(joint, 9 layers, full 9) = kJoint    run_kind(joint, 1 layer, full 9) = kSingleBlock
RunKind run_kind(const Config& cfg, const std::string& teacher, int64_t full_depth);

// Every joint-trained kind but the single block: the controls Table 3 sets beside post-grow.
bool is_joint_control(RunKind kind);
// Grow and freeze: the runs that append blocks (growth events, transition metrics).
bool appends_blocks(RunKind kind);

// A role is "<student.norm>-<kind>": role_name(kPost, kJointMatched) = "post-joint-matched".
std::string role_name(NormPlacement norm, RunKind kind);

// One colour per kind, the same in every plot (val_ce and the paper's figures).
const char* kind_color(RunKind kind);

}  // namespace deepen
