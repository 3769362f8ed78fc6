// Block-boundary residual scale: per-token RMS at every block boundary, summarised per token type.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "diagnostics/distribution_summary.h"

namespace deepen {

// Token types of the paper's token-type diagnostic, per position of a [B, T] batch.
//   kPadding           label == -1 (kIgnoreLabel): right padding, excluded from every statistic
//   kDocumentBoundary  # ASSUMPTION (the paper names "document-boundary (structural) tokens" but
//                      does not list them): the first position of every sequence (a document's
//                      first token when data.packing = "documents", where each row is one
//                      document; the start of a window otherwise), every <|endoftext|> (the
//                      separator `deepen prep` writes after each document) and the position after
//                      one (the next document's first token in a packed window). These are the
//                      positions where a causal model sees a new context begin, which is where
//                      pre-norm residual streams grow their massive activations.
//   kRegular           every other non-padding position
// Example (eos = 0, labels −1 mark padding):
//   inputs [[5, 6, 0, 7, 8], [9, 1, 2, 3, 3]]  labels [[6, 0, 7, 8, -1], [1, 2, 3, -1, -1]]
//   -> [[boundary, regular, boundary, boundary, padding], [boundary, regular, regular, padding, padding]]
enum class TokenType : int64_t { kPadding = -1, kRegular = 0, kDocumentBoundary = 1 };
// inputs and labels [B, T] int64 (any device): a [B, T] int64 CPU tensor of TokenType values.
// Throws std::invalid_argument on shapes that differ or are not 2-D.
at::Tensor token_types(const at::Tensor& inputs, const at::Tensor& labels, int64_t eos_id);

// Residual scale at one block boundary: per-token RMS over the hidden dimension, summarised over
// all non-padding tokens and per type.
struct BoundaryRms {
  DistributionSummary all, document_boundary, regular;
};

// Block boundaries of a student whose layer-wise residual stream is `stream` (depth+1 tensors
// [B, T, H]: stream[i] enters layer i, the last is the last layer's output, before any final
// norm; GrowableStudent::residual_stream) with blocks of `block_layers` layers: boundary b is
// stream[b·L], b = 0 .. depth/L. Boundary 0 is what enters block 0 (post-norm: after the entry
// norm), the last is what an appended block would receive.
// Example: depth 6, L = 3 -> boundaries stream[0], stream[3], stream[6].
// Throws std::invalid_argument when depth is not a multiple of block_layers.
std::vector<at::Tensor> block_boundaries(const std::vector<at::Tensor>& stream, int64_t block_layers);

// Per-token RMS sqrt(mean_h x²) in double, [B, T, H] -> [B, T] (CPU).
at::Tensor per_token_rms(const at::Tensor& x);

// The summaries of every boundary ([B, T, H] each) over the tokens of `types` ([B, T], token_types).
std::vector<BoundaryRms> block_boundary_rms(const std::vector<at::Tensor>& boundaries, const at::Tensor& types);

// The per-token values of `rms` ([B, T]) at positions of type `type` (kPadding never asked for),
// in row-major order: the full distribution the report's histogram reads.
std::vector<double> values_of_type(const at::Tensor& rms, const at::Tensor& types, TokenType type);

// {"all": <summary>, "document_boundary": <summary>, "regular": <summary>} (distribution_summary.h).
nlohmann::json to_json(const BoundaryRms& r);

}  // namespace deepen
