// Student layer -> teacher layer for the "teacher" growth operator (see teacher_layer_map.h).
#include "curriculum/teacher_layer_map.h"

#include <stdexcept>
#include <string>

namespace deepen {

int64_t teacher_layer_of(int64_t layer, int64_t student_layers, int64_t teacher_layers) {
  if (student_layers < 1 || teacher_layers < 1 || layer < 0 || layer >= student_layers)
    throw std::invalid_argument("teacher_layer_of: layer " + std::to_string(layer) + " of a " +
                                std::to_string(student_layers) + "-layer student, " + std::to_string(teacher_layers) +
                                "-layer teacher");
  return layer * teacher_layers / student_layers;
}

}  // namespace deepen
