// The growth operators: the student's primitives (random, stack, identity) and the teacher's layers.
#include "curriculum/growth_operator.h"

#include <vector>

#include "config/input_error.h"
#include "curriculum/teacher_layer_map.h"
#include "model/hf_config.h"
#include "model/student_from_teacher.h"

namespace deepen {
namespace {

// Student layers [first, last) from the teacher layers the map gives them.
void copy_mapped_teacher_layers(GrowableStudent& student, int64_t first, int64_t last, const std::string& teacher_dir) {
  const int64_t teacher_layers = read_qwen3_config(teacher_dir + "/config.json").num_hidden_layers;
  std::vector<TeacherLayerCopy> copies;
  for (int64_t i = first; i < last; ++i)
    copies.push_back({i, teacher_layer_of(i, student.spec().max_depth, teacher_layers)});
  copy_teacher_layers(student, copies, teacher_dir);
}

}  // namespace

GrowthOperator growth_operator_of(const Config& cfg) {
  GrowthOperator op;
  op.init = cfg.curriculum.grow_init;
  op.block_layers = cfg.curriculum.block_layers;
  op.teacher_dir = cfg.teacher.checkpoint;
  if (op.init == GrowInit::kTeacher && op.teacher_dir.empty())
    throw InputError(cfg.source + ": curriculum.grow_init = \"teacher\" needs teacher.checkpoint");
  return op;
}

void start_blocks(GrowableStudent& student, const GrowthOperator& op) {
  if (op.init == GrowInit::kTeacher) copy_mapped_teacher_layers(student, 0, student.depth(), op.teacher_dir);
}

void grow_student(GrowableStudent& student, int64_t new_depth, const GrowthOperator& op) {
  const int64_t before = student.depth();
  if (op.init != GrowInit::kTeacher) {
    student.grow_to(new_depth, op.init, op.block_layers);
    return;
  }
  student.grow_to(new_depth, GrowInit::kRandom);
  copy_mapped_teacher_layers(student, before, new_depth, op.teacher_dir);
}

}  // namespace deepen
