// Norm placement per decoder layer: what student.norm (pre, post, peri, mix, pre_scaled) makes of
// layer i, whether the student has a final norm, and whether a Hugging Face architecture computes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/options.h"

namespace deepen {

// Where one decoder layer's RMSNorms sit (F = attention or MLP, N = RMSNorm with its own gain):
//   pre:  x + F(N_in(x))             (Qwen3; the norms' gains may be scaled, see output_scale)
//   post: N_out(x + F(x))
//   peri: x + N_out(F(N_in(x)))      (Peri-LN: a norm on each sub-layer's input and output)
enum class LayerNorms { kPre, kPost, kPeri };

struct LayerPlacement {
  LayerNorms norms = LayerNorms::kPre;
  // Multiplies each of the layer's norm outputs (pre_scaled: 1/sqrt(l), l the 1-based layer index;
  // LayerNorm-Scaling). 1 for every other placement.
  double output_scale = 1.0;
  LayerPlacement(LayerNorms n = LayerNorms::kPre, double scale = 1.0) : norms(n), output_scale(scale) {}
};

// What layer `layer` (0-based) of a student with `final_depth` layers at the end of its curriculum
// computes. A layer's placement depends on its index and the final depth only, never on the depth the
// student has reached: while a mix student is shallower than its boundary, all its layers are
// post-norm (docs/model.md says why).
//   pre        -> pre, scale 1              post -> post
//   peri       -> peri                      pre_scaled, layer 3 -> pre, scale 1/sqrt(4) = 0.5
//   mix, final depth 9, fraction 0.25: ceil(2.25) = 3 post-norm layers -> layers 0..2 post, 3..8 pre
LayerPlacement layer_placement(NormPlacement placement, int64_t layer, int64_t final_depth, double mix_post_fraction);

// Whether an RMSNorm sits between the last active block and the head: every placement whose
// residual stream is not normalized by its last layer (pre, peri, mix: its last layers are
// pre-norm, pre_scaled); post-norm ends each layer with a norm and has none.
bool has_final_norm(NormPlacement placement);

// Why `deepen export` cannot write a Hugging Face folder for this placement, or none when it can:
// pre (Qwen3 as is), pre_scaled (Qwen3 with 1/sqrt(l) folded into the norm gains), post (Qwen3's
// tensor layout read back by deepen forward, as documented). peri (four norms per layer) and mix
// (post-norm layers before pre-norm ones) have no such layout.
std::optional<std::string> hf_export_refusal(NormPlacement placement);

}  // namespace deepen
