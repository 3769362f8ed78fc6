// The draws a teacher cache stores: K samples per token from the teacher's distribution at τ (their
// uniforms a pure function of the token's place), the teacher's entropy, and the sampled targets
// the loss takes (Random Sampling KD, arXiv 2503.16870; the estimator: train/distill_loss.h).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/distill_loss.h"

namespace deepen {

// Where a target position sits; a token's draws depend on it and the seed only, so the cache's
// contents do not depend on how the writer batched, ordered or split its work.
struct TokenPlace {
  int64_t split = 0;     // 0 train, 1 validation
  int64_t sequence = 0;  // the split's sequence (document) index
  int64_t position = 0;  // the target's position in the sequence
};

// K uniforms in [0, 1), ascending, for one token, into out[0..K): the K values
// (mix64(h + j·φ) >> 11)·2^-53, j < K, sorted, with h = mix64 chained over (seed, split, sequence,
// position) (config/hash.h). Pure and the same on every machine.
void token_uniforms(uint64_t seed, const TokenPlace& place, int64_t samples, double* out);

// The uniforms of many tokens as an [R, K] fp64 CPU tensor, row r for places[r].
at::Tensor token_uniforms(uint64_t seed, const std::vector<TokenPlace>& places, int64_t samples);

struct TeacherDraws {
  at::Tensor ids;      // [R, K] int64 on the CPU, ascending per row (an id drawn twice appears twice)
  at::Tensor entropy;  // [R] fp64 on the CPU: H(p) = −Σ_i p_i log p_i, p = softmax(t/τ)
};

// Inverse-CDF draws: with x = t/τ in fp64, m = max x, c_i = Σ_{j<=i} e^{x_j − m}, the draw for
// uniform u is the smallest i with c_i > u·c_{V−1}: id i comes up with probability p_i exactly (up
// to fp64 rounding of the c_i), and an id of probability 0 never does. Ascending uniforms give
// ascending ids. logits [R, V] (any float dtype, any device: the arithmetic runs there, row_chunk
// rows at a time, [row_chunk, V] fp64 a few times over), uniforms [R, K] fp64 ascending per row.
TeacherDraws draw_from_teacher(const at::Tensor& logits, double temperature, const at::Tensor& uniforms,
                               int64_t row_chunk = 32);

// The loss's sampled targets from draws: per row its distinct ids with weights count / K (the
// estimate p̂ of p), padded to the row with the most distinct ids with id 0, weight 0.
// Example: K = 4, row draws {3, 3, 3, 9} -> ids [3, 9], weights [0.75, 0.25].
TeacherTargets sampled_targets(const TeacherDraws& draws);

// For tests and benches: K fresh draws per row of `logits` [R, V] at τ, keyed by `seed` (row r is
// sequence r of split 0, position 0), as sampled targets.
TeacherTargets sample_teacher_targets(const at::Tensor& logits, double temperature, int64_t samples, uint64_t seed);

}  // namespace deepen
