// Draws from the teacher's distribution: keyed uniforms, inverse-CDF sampling, sampled targets.
#include "teacher_cache/teacher_draws.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "config/hash.h"

namespace deepen {
namespace {

constexpr uint64_t kPhi = 0x9e3779b97f4a7c15ULL;

}  // namespace

void token_uniforms(uint64_t seed, const TokenPlace& place, int64_t samples, double* out) {
  uint64_t h = mix64(seed + kPhi);
  h = mix64(h ^ static_cast<uint64_t>(place.split));
  h = mix64(h ^ static_cast<uint64_t>(place.sequence));
  h = mix64(h ^ static_cast<uint64_t>(place.position));
  for (int64_t j = 0; j < samples; ++j)
    out[j] = static_cast<double>(mix64(h + static_cast<uint64_t>(j + 1) * kPhi) >> 11) * 0x1.0p-53;
  std::sort(out, out + samples);
}

at::Tensor token_uniforms(uint64_t seed, const std::vector<TokenPlace>& places, int64_t samples) {
  at::Tensor u = at::empty({static_cast<int64_t>(places.size()), samples}, at::kDouble);
  double* p = u.data_ptr<double>();
  for (size_t r = 0; r < places.size(); ++r) token_uniforms(seed, places[r], samples, p + r * samples);
  return u;
}

TeacherDraws draw_from_teacher(const at::Tensor& logits, double temperature, const at::Tensor& uniforms,
                               int64_t row_chunk) {
  if (logits.dim() != 2 || uniforms.dim() != 2 || uniforms.size(0) != logits.size(0))
    throw std::invalid_argument("draw_from_teacher: logits [R, V] and uniforms [R, K], got " +
                                std::to_string(logits.dim()) + " and " + std::to_string(uniforms.dim()) + " dims");
  if (!(temperature > 0)) throw std::invalid_argument("draw_from_teacher: temperature must be > 0");
  at::NoGradGuard no_grad;
  const int64_t R = logits.size(0), V = logits.size(1), K = uniforms.size(1);
  TeacherDraws d;
  d.ids = at::empty({R, K}, at::kLong);
  d.entropy = at::empty({R}, at::kDouble);
  const at::Tensor u_all = uniforms.to(logits.device(), at::kDouble);
  for (int64_t r0 = 0; r0 < R; r0 += row_chunk) {
    const int64_t r = std::min(row_chunk, R - r0);
    const at::Tensor x = logits.narrow(0, r0, r).to(at::kDouble) / temperature;
    const at::Tensor m = std::get<0>(x.max(1, true));
    const at::Tensor shifted = x - m;
    const at::Tensor e = at::exp(shifted);
    const at::Tensor c = at::cumsum(e, 1);
    const at::Tensor total = c.narrow(1, V - 1, 1);
    // H = log Z − Σ_i e_i (x_i − m) / Z, Z = Σ_i e_i: the entropy of softmax(x), shift-invariant.
    const at::Tensor h = at::log(total.squeeze(1)) - (e * shifted).sum(1) / total.squeeze(1);
    const at::Tensor ids = at::searchsorted(c, u_all.narrow(0, r0, r) * total, /*out_int32=*/false, /*right=*/true);
    d.ids.narrow(0, r0, r).copy_(ids.clamp_max(V - 1));
    d.entropy.narrow(0, r0, r).copy_(h);
  }
  return d;
}

TeacherTargets sampled_targets(const TeacherDraws& draws) {
  const at::Tensor ids = draws.ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t R = ids.size(0), K = ids.size(1);
  const int64_t* in = ids.data_ptr<int64_t>();
  std::vector<int64_t> distinct(static_cast<size_t>(R), 0);
  int64_t widest = 1;
  for (int64_t r = 0; r < R; ++r) {
    int64_t m = 0;
    for (int64_t j = 0; j < K; ++j) m += (j == 0 || in[r * K + j] != in[r * K + j - 1]) ? 1 : 0;
    distinct[static_cast<size_t>(r)] = m;
    widest = std::max(widest, m);
  }
  at::Tensor out_ids = at::zeros({R, widest}, at::kLong);
  at::Tensor out_w = at::zeros({R, widest}, at::kFloat);
  int64_t* oi = out_ids.data_ptr<int64_t>();
  float* ow = out_w.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    int64_t slot = -1;
    for (int64_t j = 0; j < K; ++j) {
      if (j == 0 || in[r * K + j] != in[r * K + j - 1]) oi[r * widest + ++slot] = in[r * K + j];
      ow[r * widest + slot] += 1.0f;
    }
    for (int64_t s = 0; s <= slot; ++s) ow[r * widest + s] /= static_cast<float>(K);
  }
  return TeacherTargets::sampled(out_ids, out_w, draws.entropy.to(at::kFloat));
}

TeacherTargets sample_teacher_targets(const at::Tensor& logits, double temperature, int64_t samples, uint64_t seed) {
  const at::Tensor rows = logits.reshape({-1, logits.size(-1)});
  std::vector<TokenPlace> places(static_cast<size_t>(rows.size(0)));
  for (size_t r = 0; r < places.size(); ++r) places[r].sequence = static_cast<int64_t>(r);
  return sampled_targets(draw_from_teacher(rows, temperature, token_uniforms(seed, places, samples)));
}

}  // namespace deepen
