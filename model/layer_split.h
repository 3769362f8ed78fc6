// How a teacher's decoder layers are split into pipeline stages (a pure function, torch-free).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/options.h"

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

// The same split when the last stage's head is counted: a stage costs its layers, the last one
// its layers plus `head_layers`, the LM head's cost in layers' worth (lm_head_layer_equivalents;
// 0 when distill.logits = "hidden", where the students run the head and the last stage has none).
// The last stage takes the number of layers L that minimises the most expensive stage,
// max(L + head_layers, ceil((num_layers − L) / (stages − 1))); among such L the largest whose
// cost L + head_layers stays within every other stage's (floor((num_layers − L) / (stages − 1))),
// or else the smallest: as in split_layers, the remainder goes to the front and the last stage
// costs no more than any other where it can. The others split the rest as split_layers does.
// head_layers = 0 gives split_layers exactly (checked for every split of up to 60 layers).
// Examples (Qwen3-8B: 36 layers, head ≈ 3.2 layers):
//   split_layers_with_head(36, 4, 3.2) -> [0,10) [10,20) [20,30) [30,36)   (costs 10 10 10 9.2)
//   split_layers_with_head(36, 4, 0)   -> [0,9) [9,18) [18,27) [27,36)     (hidden channel)
//   split_layers_with_head(36, 2, 3.2) -> [0,20) [20,36)                   (costs 20 19.2)
//   split_layers_with_head(28, 4, 3.2) -> [0,8) [8,16) [16,24) [24,28)     (Qwen3-1.7B: 8 8 8 7.2)
//   split_layers_with_head(10, 3, 3.2) -> [0,5) [5,9) [9,10)               (costs 5 4 4.2)
//   split_layers_with_head(5, 1, 3.2)  -> [0,5)
// Throws InputError unless 1 <= stages <= num_layers, or when head_layers < 0.
std::vector<std::pair<int, int>> split_layers_with_head(int num_layers, int stages, double head_layers);

// The LM head's forward cost in decoder layers' worth, by matmul multiply-adds per token:
// vocab·hidden against a layer's q, k, v, o and SwiGLU projections,
//   hidden·head_dim·(heads + 2·kv_heads) + heads·head_dim·hidden + 3·hidden·intermediate.
// Attention's own T-dependent FLOPs are left out (at the paper's 4096 tokens they add ~10% to a
// layer, so this slightly overstates the head). Example, Qwen3-8B (hidden 4096, 32/8 heads × 128,
// intermediate 12288, vocab 151936): 622.3M / 192.9M = 3.23 layers.
double lm_head_layer_equivalents(int64_t vocab, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 int64_t intermediate);

// The head_layers a run's teacher split counts for its last stage, by distill.logits: 0 with
// "hidden" (the students run the head), else lm_head_layer_equivalents. The one rule the
// distributed job and `deepen plan` both split by, so the plan costs the stages the job runs.
double last_stage_head_layers(TeacherOutput distill_logits, int64_t vocab, int64_t hidden, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, int64_t intermediate);

}  // namespace deepen
