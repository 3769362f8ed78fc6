// How a teacher's decoder layers are split into pipeline stages (a pure function, torch-free).
#pragma once

#include <utility>
#include <vector>

namespace deepen {

// Contiguous, balanced ranges [first, last) covering 0..num_layers-1, one per stage. When the
// layers do not divide evenly, the FIRST `num_layers % stages` stages take one extra layer: stage
// 0 also runs the embedding (a cheap gather) while the last stage runs the final norm and the
// head (for Qwen3-8B a [151936 x 4096] matmul, about 3 layers' worth of FLOPs), so the remainder
// goes to the front and the last stage never gets more layers than any other.
// Examples:
//   split_layers(36, 4) -> [0,9) [9,18) [18,27) [27,36)
//   split_layers(10, 3) -> [0,4) [4,7) [7,10)
//   split_layers(5, 1)  -> [0,5)                (a whole teacher is one stage)
// Throws InputError unless 1 <= stages <= num_layers (every stage needs a layer).
std::vector<std::pair<int, int>> split_layers(int num_layers, int stages);

}  // namespace deepen
