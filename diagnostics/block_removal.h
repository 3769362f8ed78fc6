// Block removal: the CE cost of bypassing each whole block, and how far each block turns its input.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "model/student.h"

namespace deepen {

// For block b (layers [b·L, (b+1)·L)) of a student with blocks of L = block_layers layers, on one
// fixed batch (the paper: 2 × 2048 tokens, seed 42):
//   ce_without  CE on the labels when the block is bypassed: h_in = the stream entering layer b·L
//               goes straight to layer (b+1)·L, and the model-boundary norm stays in place
//               (post-norm: the entry norm inside embed(); pre-norm: the final norm before the head)
//   delta_ce    ce_without − CE of the full model (the paper: pre-grow's last block 0.02; every
//               post-grow block >= 2.38)
//   angle       mean over tokens of arccos(cos(h_in, h_out)) / π, h_out = the stream leaving the
//               block: 0 = the block keeps every token's direction, 0.5 = orthogonal
// CE and angle cover the positions whose label is not −1 (padding never counts). Logits are made
// in the student's compute dtype and reduced in fp32 per 1024-token chunk, as the loss does; the
// sums over tokens and the angles are in double.
// Example: a pre-norm student of 2 blocks whose block 1 is identity-initialised (o_proj and
//   down_proj zero) -> blocks[1] = {delta_ce 0, angle 0}.
struct BlockRemoval {
  int64_t block = 0;
  double ce_without = 0;
  double delta_ce = 0;
  double angle = 0;
};
struct BlockRemovalResult {
  double full_ce = 0;
  int64_t tokens = 0;  // non-padding positions scored
  int64_t block_layers = 0;
  std::vector<BlockRemoval> blocks;
};

// inputs and labels [B, T] int64. Throws std::invalid_argument when the depth is not a multiple of
// block_layers or the batch has no non-padding label.
BlockRemovalResult block_removal(GrowableStudent& student, const at::Tensor& inputs, const at::Tensor& labels,
                                 int64_t block_layers);

// Mean CE over the positions whose label is not −1 of hidden [B, T, H] through head [V, H]:
// {sum of −log p(label), count}. The helper block_removal scores every variant with.
struct CeSum {
  double sum = 0;
  int64_t tokens = 0;
};
CeSum cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels);

// Per-token arccos(cos(a, b)) / π over H ([B, T, H] each -> [B, T] double on the CPU); a token
// where either vector is zero has no direction and gets NaN.
at::Tensor angular_distance(const at::Tensor& a, const at::Tensor& b);

// {"full_ce": .., "tokens": .., "block_layers": L, "blocks": [{"block": b, "ce_without": ..,
//  "delta_ce": .., "angle": ..}, ...]}
nlohmann::json to_json(const BlockRemovalResult& r);

}  // namespace deepen
