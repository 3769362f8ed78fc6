// Block-boundary residual scale (see block_boundary_rms.h).
#include "diagnostics/block_boundary_rms.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace deepen {
namespace {

constexpr int64_t kIgnore = -1;  // the label of a padding position (CONTRACTS.md)

}  // namespace

at::Tensor token_types(const at::Tensor& inputs, const at::Tensor& labels, int64_t eos_id) {
  if (inputs.dim() != 2 || inputs.sizes() != labels.sizes())
    throw std::invalid_argument("token types: inputs " + c10::str(inputs.sizes()) + " and labels " +
                                c10::str(labels.sizes()) + " must both be [B, T]");
  const at::Tensor ids = inputs.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor lab = labels.to(at::kCPU, at::kLong).contiguous();
  at::Tensor out = at::empty(ids.sizes(), at::kLong);
  const int64_t rows = ids.size(0), cols = ids.size(1);
  const int64_t* pi = ids.data_ptr<int64_t>();
  const int64_t* pl = lab.data_ptr<int64_t>();
  int64_t* po = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < cols; ++t) {
      const int64_t i = b * cols + t;
      TokenType type = TokenType::kRegular;
      if (pl[i] == kIgnore) type = TokenType::kPadding;
      else if (t == 0 || pi[i] == eos_id || pi[i - 1] == eos_id) type = TokenType::kDocumentBoundary;
      po[i] = static_cast<int64_t>(type);
    }
  }
  return out;
}

std::vector<at::Tensor> block_boundaries(const std::vector<at::Tensor>& stream, int64_t block_layers) {
  const int64_t depth = static_cast<int64_t>(stream.size()) - 1;
  if (block_layers < 1 || depth < 0 || depth % block_layers != 0)
    throw std::invalid_argument("block boundaries: " + std::to_string(depth) + " layers are not whole blocks of " +
                                std::to_string(block_layers));
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i <= depth; i += block_layers) out.push_back(stream[static_cast<size_t>(i)]);
  return out;
}

at::Tensor per_token_rms(const at::Tensor& x) {
  at::NoGradGuard no_grad;
  return x.detach().to(at::kCPU, at::kDouble).pow(2).mean(-1).sqrt();
}

std::vector<double> values_of_type(const at::Tensor& rms, const at::Tensor& types, TokenType type) {
  if (rms.sizes() != types.sizes())
    throw std::invalid_argument("block-boundary RMS: values " + c10::str(rms.sizes()) + " and token types " +
                                c10::str(types.sizes()) + " differ in shape");
  const at::Tensor v = rms.to(at::kCPU, at::kDouble).contiguous().view(-1);
  const at::Tensor c = types.to(at::kCPU, at::kLong).contiguous().view(-1);
  const double* pv = v.data_ptr<double>();
  const int64_t* pc = c.data_ptr<int64_t>();
  std::vector<double> out;
  for (int64_t i = 0; i < v.numel(); ++i)
    if (pc[i] == static_cast<int64_t>(type)) out.push_back(pv[i]);
  return out;
}

std::vector<BoundaryRms> block_boundary_rms(const std::vector<at::Tensor>& boundaries, const at::Tensor& types) {
  std::vector<BoundaryRms> out;
  for (size_t b = 0; b < boundaries.size(); ++b) {
    if (boundaries[b].dim() != 3 || boundaries[b].sizes().slice(0, 2) != types.sizes())
      throw std::invalid_argument("block-boundary RMS: boundary " + std::to_string(b) + " " +
                                  c10::str(boundaries[b].sizes()) + " does not match the token types " +
                                  c10::str(types.sizes()) + " (expected [B, T, H])");
    const at::Tensor rms = per_token_rms(boundaries[b]);
    std::vector<double> boundary = values_of_type(rms, types, TokenType::kDocumentBoundary);
    std::vector<double> regular = values_of_type(rms, types, TokenType::kRegular);
    std::vector<double> all = boundary;
    all.insert(all.end(), regular.begin(), regular.end());
    out.push_back({summarize(all), summarize(boundary), summarize(regular)});
  }
  return out;
}

nlohmann::json to_json(const BoundaryRms& r) {
  return {{"all", to_json(r.all)}, {"document_boundary", to_json(r.document_boundary)}, {"regular", to_json(r.regular)}};
}

}  // namespace deepen
