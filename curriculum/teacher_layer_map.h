// Which teacher layer each student layer takes under curriculum.grow_init = "teacher": a pure map.
#pragma once

#include <cstdint>
#include <vector>

namespace deepen {

// Student layer i of a student whose full depth is S layers takes teacher layer floor(i · T / S) of a
// T-layer teacher: evenly spaced from the teacher's first layer, each of the student's blocks from
// its share of the teacher's depth, the same layer whenever it is created (at the start or by a
// growth). Fewer teacher than student layers repeat teacher layers.
// Examples: S 9, T 36 -> 0, 4, 8, ..., 32 (the paper's shapes);  S 9, T 4 -> 0 0 0 1 1 2 2 3 3;
//           S 3, T 3 -> 0 1 2.
// Throws std::invalid_argument for i outside [0, S) or S, T < 1.
int64_t teacher_layer_of(int64_t layer, int64_t student_layers, int64_t teacher_layers);

}  // namespace deepen
