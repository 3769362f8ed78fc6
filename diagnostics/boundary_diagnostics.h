// Boundary diagnostics: residual-stream RMS per token class, and how close a block is to identity.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace deepen {

// Token classes of DESIGN.md §1 are data/tokenizer.h's TokenClass; a [B, T] class tensor holds
// their integer values (classify_tokens: position 0 of every sequence is `first` whatever its id).

// The mean of a per-token quantity over each class that has tokens, and over all tokens ("all").
// Classes without a token in the batch are absent (not 0, which would read as a measurement).
// Example: values [1, 2, 3, 5] with classes [first, content, content, special]
//   mean = {"all": 2.75, "content": 2.5, "first": 1, "special": 5}
//   tokens = {"all": 4, "content": 2, "first": 1, "special": 1}
struct ClassMeans {
  std::map<std::string, double> mean;
  std::map<std::string, int64_t> tokens;
};

// Residual scale at one diagnostic point.
// Example: block inputs x0 (embeddings) and x1 (after block 0) of a depth-1 student, boundary x_out
// (after block 0, what an appended block 1 would receive):
//   entering[0] = RMS classes of x0, entering[1] is absent (depth 1 has one block), boundary = x_out.
struct ResidualScale {
  std::vector<ClassMeans> entering;  // [block b] mean per class of RMS over H of the stream entering b
  ClassMeans boundary;               // the same for the output of the last active block
};

// How close block B is to the identity on its input x (the last block before a growth).
struct IdentityMapping {
  ClassMeans relative_change;  // mean per class of ‖B(x) − x‖ / ‖x‖ (norms over H, per token)
  ClassMeans cosine;           // mean per class of cos(B(x), x)
};

// RMS over the last dim, per token: x [B, T, H] -> [B, T] fp32, sqrt(mean_h x²).
at::Tensor token_rms(const at::Tensor& x);

// The class of a right-padded position (unpacked documents): in no class and not in "all".
inline constexpr int64_t kPaddingTokenClass = -1;

// Means of `values` [B, T] per class of `token_class` [B, T] (integer, values 0..3, or
// kPaddingTokenClass: skipped). Throws std::invalid_argument on mismatched shapes or a class
// outside those.
ClassMeans class_means(const at::Tensor& values, const at::Tensor& token_class);

// block_inputs[b] = residual stream entering block b ([B, T, H] each, b = 0 .. depth-1);
// boundary = output of the last active block ([B, T, H]).
ResidualScale residual_scale(const std::vector<at::Tensor>& block_inputs, const at::Tensor& boundary,
                             const at::Tensor& token_class);

// x = input of block B, bx = B(x), both [B, T, H]. A token with ‖x‖ = 0 (or ‖B(x)‖ = 0 for the
// cosine) has no direction; it is left out of that mean and of its count.
IdentityMapping identity_mapping(const at::Tensor& x, const at::Tensor& bx, const at::Tensor& token_class);

// JSON for the trainer's diagnostics JSONL, e.g.
//   {"mean": {"all": 2.75, "first": 1.0}, "tokens": {"all": 4, "first": 1}}
//   {"entering": [<ClassMeans>, ...], "boundary": <ClassMeans>}
//   {"relative_change": <ClassMeans>, "cosine": <ClassMeans>}
nlohmann::json to_json(const ClassMeans& m);
nlohmann::json to_json(const ResidualScale& r);
nlohmann::json to_json(const IdentityMapping& m);

}  // namespace deepen
