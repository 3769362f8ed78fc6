// The growth operators (curriculum.grow_init): how a student's new blocks start, at its first stage
// and at every growth, and what each one copies, per tensor.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "model/student.h"

namespace deepen {

// What the operator needs besides the student.
//   random    every new layer at the config's init (Qwen3's: weights N(0, 0.02), norms 1), drawn from
//             (run seed, layer index): the paper's new layers.
//   stack     each new layer a copy of the student's last block (block_layers layers, in order), every
//             tensor bit for bit: projections, QK-norms, the layer's norm gains (GrowableStudent::grow_to).
//   identity  random, then o_proj (and bias) and down_proj zeroed; everything else stays random.
//   teacher   each layer i (of the full depth) from the teacher's layer teacher_layer_of(i, ...):
//             projections and QK-norms copied; the two layer norms copied where they are input norms
//             as in the teacher, 1 where they are output norms (post); peri's output norms 1
//             (copy_teacher_layers, model/student_from_teacher.h). The first stage's blocks too.
// Never copied by any operator: optimizer state (the trainer gives new parameters fresh AdamW
// moments, and resets every parameter's at a phase start under phase_policy = "reset"); RoPE has
// no parameters; the embedding, head and boundary norm are the student's own (student.init).
struct GrowthOperator {
  GrowInit init = GrowInit::kRandom;
  int64_t block_layers = 1;  // curriculum.block_layers: the unit stack copies
  std::string teacher_dir;   // teacher.checkpoint (teacher only)
};

// From curriculum.grow_init, curriculum.block_layers and teacher.checkpoint. Throws InputError when
// "teacher" has no teacher.checkpoint.
GrowthOperator growth_operator_of(const Config& cfg);

// A fresh student's blocks (every layer it has): "teacher" copies the teacher's, the other operators
// leave the random init (they act on appended blocks only). Checks the teacher's layer shapes first.
void start_blocks(GrowableStudent& student, const GrowthOperator& op);

// Appends layers up to new_depth with the operator.
void grow_student(GrowableStudent& student, int64_t new_depth, const GrowthOperator& op);

}  // namespace deepen
