// Norm placement per decoder layer (see norm_placement.h).
#include "model/norm_placement.h"

#include <cmath>
#include <stdexcept>

#include "config/config.h"

namespace deepen {

LayerPlacement layer_placement(NormPlacement placement, int64_t layer, int64_t final_depth, double mix_post_fraction) {
  if (layer < 0 || layer >= final_depth)
    throw std::out_of_range("layer_placement: layer " + std::to_string(layer) + " of " + std::to_string(final_depth));
  switch (placement) {
    case NormPlacement::kPre: return {LayerNorms::kPre};
    case NormPlacement::kPost: return {LayerNorms::kPost};
    case NormPlacement::kPeri: return {LayerNorms::kPeri};
    case NormPlacement::kPreScaled: return {LayerNorms::kPre, 1.0 / std::sqrt(static_cast<double>(layer + 1))};
    case NormPlacement::kMix:
      return {layer < mix_post_layers(final_depth, mix_post_fraction) ? LayerNorms::kPost : LayerNorms::kPre};
  }
  throw std::logic_error("layer_placement: unknown placement");
}

bool has_final_norm(NormPlacement placement) { return placement != NormPlacement::kPost; }

std::optional<std::string> hf_export_refusal(NormPlacement placement) {
  switch (placement) {
    case NormPlacement::kPeri:
      return "student.norm = \"peri\" has no Hugging Face architecture (four RMSNorms per layer: on each "
             "sub-layer's input and output; Qwen3 has two, both on inputs)";
    case NormPlacement::kMix:
      return "student.norm = \"mix\" has no Hugging Face architecture (post-norm layers before pre-norm ones; "
             "Qwen3's layers are all pre-norm)";
    default: return std::nullopt;
  }
}

}  // namespace deepen
