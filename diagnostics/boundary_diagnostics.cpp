// Boundary diagnostics (see boundary_diagnostics.h): per-token statistics averaged per token class.
#include "diagnostics/boundary_diagnostics.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

namespace deepen {
namespace {

void check_same_tokens(const at::Tensor& x, const at::Tensor& token_class, const char* what) {
  if (x.dim() < 1 || x.sizes().slice(0, x.dim() - 1) != token_class.sizes())
    throw std::invalid_argument(std::string("boundary diagnostics: ") + what + " " + c10::str(x.sizes()) +
                                " does not match the token classes " + c10::str(token_class.sizes()) + " (expected [B, T, H])");
}

// Means per class of the finite entries of `values`; a NaN marks a token without a value.
ClassMeans means_of_finite(const at::Tensor& values, const at::Tensor& token_class) {
  if (values.sizes() != token_class.sizes())
    throw std::invalid_argument("boundary diagnostics: values " + c10::str(values.sizes()) + " and token classes " +
                                c10::str(token_class.sizes()) + " differ in shape");
  if (!at::isIntegralType(token_class.scalar_type(), false))
    throw std::invalid_argument("boundary diagnostics: token classes must be integers");
  const at::Tensor v = values.detach().to(at::kCPU, at::kDouble).contiguous().view(-1);
  const at::Tensor c = token_class.to(at::kCPU, at::kLong).contiguous().view(-1);
  const double* pv = v.data_ptr<double>();
  const int64_t* pc = c.data_ptr<int64_t>();
  std::array<double, 4> sum{};
  std::array<int64_t, 4> count{};
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (pc[i] == kPaddingTokenClass) continue;
    if (pc[i] < 0 || pc[i] > 3)
      throw std::invalid_argument("boundary diagnostics: token class " + std::to_string(pc[i]) + " outside 0..3");
    if (std::isnan(pv[i])) continue;
    sum[static_cast<size_t>(pc[i])] += pv[i];
    count[static_cast<size_t>(pc[i])] += 1;
  }
  ClassMeans out;
  double all_sum = 0;
  int64_t all_count = 0;
  for (size_t k = 0; k < 4; ++k) {
    all_sum += sum[k];
    all_count += count[k];
    if (count[k] == 0) continue;
    out.mean[token_class_name(static_cast<TokenClass>(k))] = sum[k] / static_cast<double>(count[k]);
    out.tokens[token_class_name(static_cast<TokenClass>(k))] = count[k];
  }
  if (all_count > 0) {
    out.mean["all"] = all_sum / static_cast<double>(all_count);
    out.tokens["all"] = all_count;
  }
  return out;
}

}  // namespace

at::Tensor token_rms(const at::Tensor& x) {
  at::NoGradGuard no_grad;
  return x.detach().to(at::kFloat).pow(2).mean(-1).sqrt();
}

ClassMeans class_means(const at::Tensor& values, const at::Tensor& token_class) {
  return means_of_finite(values, token_class);
}

ResidualScale residual_scale(const std::vector<at::Tensor>& block_inputs, const at::Tensor& boundary,
                             const at::Tensor& token_class) {
  ResidualScale r;
  for (size_t b = 0; b < block_inputs.size(); ++b) {
    check_same_tokens(block_inputs[b], token_class, ("input of block " + std::to_string(b)).c_str());
    r.entering.push_back(class_means(token_rms(block_inputs[b]), token_class));
  }
  check_same_tokens(boundary, token_class, "boundary representation");
  r.boundary = class_means(token_rms(boundary), token_class);
  return r;
}

IdentityMapping identity_mapping(const at::Tensor& x, const at::Tensor& bx, const at::Tensor& token_class) {
  check_same_tokens(x, token_class, "block input");
  check_same_tokens(bx, token_class, "block output");
  if (x.sizes() != bx.sizes())
    throw std::invalid_argument("boundary diagnostics: block input " + c10::str(x.sizes()) + " and output " +
                                c10::str(bx.sizes()) + " differ in shape");
  at::NoGradGuard no_grad;
  // fp64 so that a block very close to identity (‖B(x) − x‖ ≪ ‖x‖) is not lost to rounding.
  const at::Tensor xd = x.detach().to(at::kDouble), bd = bx.detach().to(at::kDouble);
  const at::Tensor nx = xd.norm(2, -1), nb = bd.norm(2, -1);
  const double nan = std::nan("");
  const at::Tensor rel = at::where(nx > 0, (bd - xd).norm(2, -1) / nx, at::full_like(nx, nan));
  const at::Tensor cos = at::where((nx > 0) & (nb > 0), (bd * xd).sum(-1) / (nx * nb), at::full_like(nx, nan));
  return {class_means(rel, token_class), class_means(cos, token_class)};
}

nlohmann::json to_json(const ClassMeans& m) {
  return {{"mean", m.mean}, {"tokens", m.tokens}};
}

nlohmann::json to_json(const ResidualScale& r) {
  nlohmann::json entering = nlohmann::json::array();
  for (const auto& e : r.entering) entering.push_back(to_json(e));
  return {{"entering", entering}, {"boundary", to_json(r.boundary)}};
}

nlohmann::json to_json(const IdentityMapping& m) {
  return {{"relative_change", to_json(m.relative_change)}, {"cosine", to_json(m.cosine)}};
}

}  // namespace deepen
