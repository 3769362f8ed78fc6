// Block removal (see block_removal.h): the student's forward with one block left out.
#include "diagnostics/block_removal.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace deepen {
namespace {

constexpr int64_t kIgnore = -1;      // the label of a padding position (CONTRACTS.md)
constexpr int64_t kChunkTokens = 1024;  // [1024, 151936] fp32 logits = 622 MB at Qwen3's vocabulary

}  // namespace

CeSum cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels) {
  at::NoGradGuard no_grad;
  const int64_t h = hidden.size(-1);
  const at::Tensor x = hidden.reshape({-1, h});
  const at::Tensor y = labels.to(hidden.device(), at::kLong).reshape({-1});
  if (x.size(0) != y.size(0))
    throw std::invalid_argument("block removal: " + std::to_string(y.size(0)) + " labels for " +
                                std::to_string(x.size(0)) + " positions");
  CeSum out;
  for (int64_t c0 = 0; c0 < x.size(0); c0 += kChunkTokens) {
    const int64_t c = std::min(kChunkTokens, x.size(0) - c0);
    const at::Tensor yc = y.narrow(0, c0, c);
    const at::Tensor keep = yc != kIgnore;
    const int64_t n = keep.sum().item<int64_t>();
    if (n == 0) continue;
    const at::Tensor logits = at::matmul(x.narrow(0, c0, c).index({keep}), head.t()).to(at::kFloat);
    const at::Tensor logp = at::log_softmax(logits, -1);
    const at::Tensor picked = logp.gather(1, yc.index({keep}).unsqueeze(1));
    out.sum -= picked.to(at::kDouble).sum().item<double>();
    out.tokens += n;
  }
  return out;
}

at::Tensor angular_distance(const at::Tensor& a, const at::Tensor& b) {
  at::NoGradGuard no_grad;
  const at::Tensor x = a.detach().to(at::kCPU, at::kDouble), y = b.detach().to(at::kCPU, at::kDouble);
  const at::Tensor nx = x.norm(2, -1), ny = y.norm(2, -1);
  // Rounding can put |cos| a few ulps above 1, where acos is NaN: clamp to [−1, 1].
  const at::Tensor cos = ((x * y).sum(-1) / (nx * ny)).clamp(-1.0, 1.0);
  const at::Tensor angle = at::acos(cos) / M_PI;
  return at::where((nx > 0) & (ny > 0), angle, at::full_like(angle, std::nan("")));
}

BlockRemovalResult block_removal(GrowableStudent& student, const at::Tensor& inputs, const at::Tensor& labels,
                                 int64_t block_layers) {
  at::NoGradGuard no_grad;
  const int64_t depth = student.depth();
  if (block_layers < 1 || depth % block_layers != 0)
    throw std::invalid_argument("block removal: " + std::to_string(depth) + " layers are not whole blocks of " +
                                std::to_string(block_layers));
  const std::vector<at::Tensor> stream = student.residual_stream(inputs);
  const at::Tensor head = student.head_weight();
  const at::Tensor real = (labels != kIgnore).to(at::kCPU);
  BlockRemovalResult r;
  r.block_layers = block_layers;
  const CeSum full = cross_entropy_sum(student.head_input(stream.back()), head, labels);
  if (full.tokens == 0) throw std::invalid_argument("block removal: the batch has no non-padding label");
  r.full_ce = full.sum / static_cast<double>(full.tokens);
  r.tokens = full.tokens;
  for (int64_t b = 0; b * block_layers < depth; ++b) {
    const int64_t first = b * block_layers, after = first + block_layers;
    at::Tensor x = stream[static_cast<size_t>(first)];
    for (int64_t i = after; i < depth; ++i) x = student.apply_block(i, x);
    const CeSum without = cross_entropy_sum(student.head_input(x), head, labels);
    const at::Tensor angle = angular_distance(stream[static_cast<size_t>(first)], stream[static_cast<size_t>(after)]);
    const at::Tensor scored = angle.index({real & angle.isfinite()});
    BlockRemoval br;
    br.block = b;
    br.ce_without = without.sum / static_cast<double>(without.tokens);
    br.delta_ce = br.ce_without - r.full_ce;
    br.angle = scored.numel() > 0 ? scored.mean().item<double>() : std::nan("");
    r.blocks.push_back(br);
  }
  return r;
}

nlohmann::json to_json(const BlockRemovalResult& r) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const BlockRemoval& b : r.blocks)
    blocks.push_back({{"block", b.block}, {"ce_without", b.ce_without}, {"delta_ce", b.delta_ce}, {"angle", b.angle}});
  return {{"full_ce", r.full_ce}, {"tokens", r.tokens}, {"block_layers", r.block_layers}, {"blocks", blocks}};
}

}  // namespace deepen
