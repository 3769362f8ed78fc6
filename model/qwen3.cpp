// Qwen3 decoder pieces; each numerical step mirrors transformers' modeling_qwen3.py (5.x).
#include "model/qwen3.h"

#include <cmath>

#include <functional>
#include <numeric>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "config/input_error.h"
#include "model/fused_kernels.h"

namespace deepen {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool fusable(const at::Tensor& x) { return x.device().is_cpu() && x.scalar_type() == at::kFloat; }

// Rows per parallel_for task: a few KB of work each, so 2-16 threads split any realistic batch.
constexpr int64_t kRowGrain = 32;

// Per-thread partial sums of a weight gradient (dw = sum over rows), reduced at the end.
struct WeightGradParts {
  WeightGradParts(int64_t dim) : parts(at::zeros({at::get_num_threads(), dim}, at::kFloat)) {}
  float* mine() { return parts.data_ptr<float>() + at::get_thread_num() * parts.size(1); }
  at::Tensor sum() const { return parts.sum(0); }
  at::Tensor parts;
};

// RMSNorm over the last dim, fp32 CPU: one pass each way instead of pow/mean/add/rsqrt/mul/mul.
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w, double eps) {
    const at::Tensor x = x_in.contiguous();
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* rp = rstd.data_ptr<float>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
      kernels::rms_norm_forward(xp + b * dim, dim, wp, yp + b * dim, dim, rp + b, e - b, dim,
                                static_cast<float>(eps));
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& rstd = saved[2];
    const at::Tensor g = grads[0].contiguous();
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    at::Tensor dx = at::empty_like(x);
    WeightGradParts dw(dim);
    at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
      kernels::rms_norm_backward(g.data_ptr<float>() + b * dim, dim, x.data_ptr<float>() + b * dim, dim,
                                 w.data_ptr<float>(), rstd.data_ptr<float>() + b,
                                 dx.data_ptr<float>() + b * dim, dim, dw.mine(), e - b, dim);
    });
    return {dx, dw.sum(), at::Tensor()};
  }
};

// Attention prologue, fp32 CPU: qkv [B, T, (H + 2 KV) d] (one fused projection) -> per-head
// RMSNorm of q and k over d, RoPE, and the [B, heads, T, d] layouts SDPA reads; v is copied into
// [B, KV, T, d]. One pass forward, one backward, instead of view/norm (6 ops)/transpose/RoPE
// (5 ops) for q and k each.
struct QkvRopeFn : torch::autograd::Function<QkvRopeFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv_in, const at::Tensor& qw,
                               const at::Tensor& kw, const at::Tensor& cos, const at::Tensor& sin,
                               int64_t heads, int64_t kv_heads, int64_t d, double eps) {
    const at::Tensor qkv = qkv_in.contiguous();
    const int64_t B = qkv.size(0), T = qkv.size(1), W = (heads + 2 * kv_heads) * d;
    // Shapes [B, n, T, d] laid out as [B, T, n, d] (what the projection produced and the layout
    // SDPA's CPU kernel allocates its gradients in), so neither direction needs a transposing copy.
    auto bnTd = [&](int64_t n) { return at::empty_strided({B, n, T, d}, {T * n * d, d, n * d, 1}, qkv.options()); };
    at::Tensor q = bnTd(heads), k = bnTd(kv_heads), v = bnTd(kv_heads);
    at::Tensor rq = at::empty({B * T, heads}, qkv.options());
    at::Tensor rk = at::empty({B * T, kv_heads}, qkv.options());
    const float* src = qkv.data_ptr<float>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    float *rqp = rq.data_ptr<float>(), *rkp = rk.data_ptr<float>();
    const float* qwp = qw.data_ptr<float>();
    const float* kwp = kw.data_ptr<float>();
    const float e = static_cast<float>(eps);
    at::parallel_for(0, B * T, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t bt = begin; bt < end; ++bt) {
        const int64_t t = bt % T;
        const float* row = src + bt * W;
        for (int64_t h = 0; h < heads; ++h) {
          float* dst = qp + (bt * heads + h) * d;
          kernels::rms_norm_forward(row + h * d, d, qwp, dst, d, rqp + bt * heads + h, 1, d, e);
          kernels::rope_forward_row(dst, cp + t * d, sp + t * d, d);
        }
        for (int64_t h = 0; h < kv_heads; ++h) {
          float* dst = kp + (bt * kv_heads + h) * d;
          kernels::rms_norm_forward(row + (heads + h) * d, d, kwp, dst, d, rkp + bt * kv_heads + h, 1, d, e);
          kernels::rope_forward_row(dst, cp + t * d, sp + t * d, d);
        }
        std::memcpy(vp + bt * kv_heads * d, row + (heads + kv_heads) * d, kv_heads * d * sizeof(float));
      }
    });
    ctx->save_for_backward({qkv, qw, kw, cos, sin, rq, rk});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    return {q, k, v};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &qkv = saved[0], &qw = saved[1], &kw = saved[2], &cos = saved[3], &sin = saved[4];
    const at::Tensor &rq = saved[5], &rk = saved[6];
    const int64_t heads = ctx->saved_data["heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    const int64_t B = qkv.size(0), T = qkv.size(1), d = qw.size(0), W = (heads + 2 * kv_heads) * d;
    // Gradients arrive as [B, n, T, d] in whatever layout SDPA chose: read them through their
    // strides (only the last dim must be dense).
    auto grad_or_zeros = [&](const at::Tensor& g, int64_t n) {
      if (!g.defined()) return at::zeros({B, n, T, d}, qkv.options());
      return g.stride(3) == 1 ? g : g.contiguous();
    };
    const at::Tensor dq = grad_or_zeros(grads[0], heads), dk = grad_or_zeros(grads[1], kv_heads),
                     dv = grad_or_zeros(grads[2], kv_heads);
    at::Tensor dqkv = at::empty_like(qkv);
    WeightGradParts dqw(d), dkw(d);
    const float *x = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    const float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
    const float *rqp = rq.data_ptr<float>(), *rkp = rk.data_ptr<float>();
    float* out = dqkv.data_ptr<float>();
    at::parallel_for(0, B * T, kRowGrain, [&](int64_t begin, int64_t end) {
      std::vector<float> tmp(static_cast<size_t>(d));
      float* dqw_part = dqw.mine();
      float* dkw_part = dkw.mine();
      for (int64_t bt = begin; bt < end; ++bt) {
        const int64_t b = bt / T, t = bt % T;
        const float* row = x + bt * W;
        float* drow = out + bt * W;
        for (int64_t h = 0; h < heads; ++h) {
          std::memcpy(tmp.data(), dqp + b * dq.stride(0) + h * dq.stride(1) + t * dq.stride(2), d * sizeof(float));
          kernels::rope_backward_row(tmp.data(), cp + t * d, sp + t * d, d);
          kernels::rms_norm_backward(tmp.data(), d, row + h * d, d, qw.data_ptr<float>(), rqp + bt * heads + h,
                                     drow + h * d, d, dqw_part, 1, d);
        }
        for (int64_t h = 0; h < kv_heads; ++h) {
          std::memcpy(tmp.data(), dkp + b * dk.stride(0) + h * dk.stride(1) + t * dk.stride(2), d * sizeof(float));
          kernels::rope_backward_row(tmp.data(), cp + t * d, sp + t * d, d);
          kernels::rms_norm_backward(tmp.data(), d, row + (heads + h) * d, d, kw.data_ptr<float>(),
                                     rkp + bt * kv_heads + h, drow + (heads + h) * d, d, dkw_part, 1, d);
          std::memcpy(drow + (heads + kv_heads + h) * d, dvp + b * dv.stride(0) + h * dv.stride(1) + t * dv.stride(2),
                      d * sizeof(float));
        }
      }
    });
    return {dqkv, dqw.sum(), dkw.sum(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// silu(gate) * up on the two projections' outputs, fp32 CPU: one pass forward and one backward
// where LibTorch's silu and mul take two each (and keep silu(gate) besides).
struct SwiGluFn : torch::autograd::Function<SwiGluFn> {
  static constexpr int64_t kGrain = 1 << 15;  // values per parallel chunk
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    at::Tensor out = at::empty_like(gate);
    at::parallel_for(0, gate.numel(), kGrain, [&](int64_t b, int64_t e) {
      kernels::swiglu_forward(gate.data_ptr<float>() + b, up.data_ptr<float>() + b, out.data_ptr<float>() + b, e - b);
    });
    ctx->save_for_backward({gate, up});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    at::parallel_for(0, gate.numel(), kGrain, [&](int64_t b, int64_t e) {
      kernels::swiglu_backward(g.data_ptr<float>() + b, gate.data_ptr<float>() + b, up.data_ptr<float>() + b,
                               dgate.data_ptr<float>() + b, dup.data_ptr<float>() + b, e - b);
    });
    return {dgate, dup};
  }
};

// The two implementations of each fusable step, as free functions of their inputs, so the
// modules and the calibration (which times them on random inputs) run the very same code.

// RMSNorm as transformers writes it, op for op; what bf16, CUDA and mixed precision run.
at::Tensor rms_norm_hf_ops(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto in_dtype = x.scalar_type();
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(var + eps)).to(in_dtype);
}

// fp32 RMSNorm in LibTorch's ops: the forward is transformers' sequence, value for value, but the
// backward is the closed form, dx = r * (g*w - xh * mean(g*w*xh)), dw = sum over rows of g*xh,
// in 6 passes over the activation. Autograd's derivation of pow/mean/add/rsqrt/mul/mul takes ~14
// (pow's backward alone recomputes x^1 and multiplies twice): in a profiled 1-thread step of the
// 9-layer bench student, PowBackward, MeanBackward and RMSNorm's MulBackward and sums were ~165 ms of
// 1,443. It also saves xh and r instead of x, xh and r.
struct RmsNormAtenFn : torch::autograd::Function<RmsNormAtenFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps) {
    const at::Tensor r = at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
    const at::Tensor xh = x * r;
    ctx->save_for_backward({xh, w, r});
    return w * xh;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xh = saved[0], &w = saved[1], &r = saved[2];
    const at::Tensor& g = grads[0];
    // xh first: the product takes xh's (dense) layout whatever g's, so the matrix-vector product
    // below reads it without a copy.
    const at::Tensor gxh = xh * g;
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(1)) {
      std::vector<int64_t> rows(static_cast<size_t>(g.dim() - 1));
      std::iota(rows.begin(), rows.end(), 0);
      dw = gxh.sum(rows);
    }
    if (ctx->needs_input_grad(0)) {
      // mean(g*w*xh) over a row as one matrix-vector product: a pass less than mul + mean.
      const at::Tensor m = at::matmul(gxh, w / static_cast<double>(w.size(0))).unsqueeze(-1);
      dx = at::addcmul(g * w, xh, m, /*value=*/-1) * r;
    }
    return {dx, dw, at::Tensor()};
  }
};

// The op-sequence RMSNorm (cpu_kernels = "aten", and what "auto" times the fused kernel against).
at::Tensor rms_norm_ops(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (fusable(x) && weight.scalar_type() == at::kFloat) return RmsNormAtenFn::apply(x, weight, eps);
  return rms_norm_hf_ops(x, weight, eps);
}

// q|k|v projection weights (and biases, undefined without) and the q/k norm gains.
struct QkvWeights {
  at::Tensor q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm;
};

std::vector<at::Tensor> qkv_rope_fused(const at::Tensor& x, const QkvWeights& w, const Rotary& rope,
                                       const DecoderSpec& spec) {
  // One [q | k | v] projection (weights concatenated per call: cheap next to the matmul, and the
  // parameters keep HF's names), then the fused norm + RoPE + layout kernel.
  const at::Tensor weight = at::cat({w.q, w.k, w.v}, 0);
  const at::Tensor bias = w.q_bias.defined() ? at::cat({w.q_bias, w.k_bias, w.v_bias}, 0) : at::Tensor();
  return QkvRopeFn::apply(at::linear(x, weight, bias), w.q_norm, w.k_norm, rope.cos, rope.sin, spec.heads,
                          spec.kv_heads, spec.head_dim, spec.rms_eps);
}

// x * cos + rotate_half(x) * sin as x * cos + roll(x, d/2) * sin_signed (see apply_rotary), the
// tables broadcasting over x's leading dims.
at::Tensor rotary_ops(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin_signed) {
  // cat(-x2, x1) * sin written as cat(x2, x1) * cat(-sin1, sin2): roll's backward is one roll,
  // where cat(-x2, x1)'s is a neg and two zero-filled slice gradients added into x's.
  return x * cos + at::roll(x, x.size(-1) / 2, -1) * sin_signed;
}

std::vector<at::Tensor> qkv_rope_ops(const at::Tensor& x, const QkvWeights& w, const Rotary& rope,
                                     const DecoderSpec& spec) {
  // [B, T, heads, d] -> per-head RMSNorm over d -> RoPE -> [B, heads, T, d]. RoPE runs before the
  // transpose, on the norm's dense output with [T, 1, d] tables (transformers rotates after it,
  // the same products): roll copies into a dense tensor, and adding it to x * cos in x's
  // transposed layout made every RoPE op and its gradients mix layouts (q: 3.3 -> 2.8 ms forward
  // + backward, 1 thread).
  const int64_t b = x.size(0), t = x.size(1), d = spec.head_dim;
  auto heads_of = [&](const at::Tensor& weight, const at::Tensor& bias, int64_t n) {
    return at::linear(x, weight, bias).view({b, t, n, d});
  };
  const at::Tensor cos = rope.cos.unsqueeze(-2), sin_signed = rope.sin_signed.unsqueeze(-2);
  auto normed_rotated = [&](const at::Tensor& weight, const at::Tensor& bias, int64_t n, const at::Tensor& gain) {
    return rotary_ops(rms_norm_ops(heads_of(weight, bias, n), gain, spec.rms_eps), cos, sin_signed).transpose(1, 2);
  };
  return {normed_rotated(w.q, w.q_bias, spec.heads, w.q_norm), normed_rotated(w.k, w.k_bias, spec.kv_heads, w.k_norm),
          heads_of(w.v, w.v_bias, spec.kv_heads).transpose(1, 2)};
}

at::Tensor swiglu_mlp_fused(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up) {
  // Two projections, as the op sequence: with one gate|up matmul on weights concatenated per call
  // (and its split backward) the fused student ran 0.96x transformers against the op sequence's
  // 1.07x on an Intel Xeon; with two, 1.06-1.08x (student_step_bench, stop 20).
  return SwiGluFn::apply(at::linear(x, gate), at::linear(x, up));
}

at::Tensor swiglu_mlp_ops(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(at::linear(x, gate)) * at::linear(x, up);
}

// One forward + backward of a step on random leaf tensors of the given shapes, for
// CpuKernelCalibration. Inputs are drawn on first call from a generator of its own (the global RNG
// stream, which seeds nothing of the model but may seed a user's code, is left alone); grad mode
// is switched on, as a step may first run under NoGradGuard (evaluation, the teacher).
using StepFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
CpuKernelCalibration::Timed timed_step(std::vector<std::vector<int64_t>> shapes, StepFn step) {
  struct State {
    std::vector<at::Tensor> inputs, grads;
  };
  auto state = std::make_shared<State>();
  return [state, shapes = std::move(shapes), step = std::move(step)] {
    at::AutoGradMode grad_mode(true);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(20261201);
    if (state->inputs.empty()) {
      // shapes[0] is the activation (O(1) values); then weight matrices, scaled by 1/sqrt(fan_in)
      // as at initialization, and vectors (norm gains, biases) near 1.
      for (size_t i = 0; i < shapes.size(); ++i) {
        at::Tensor t = at::randn(shapes[i], gen, at::kFloat);
        if (i > 0 && shapes[i].size() == 2) t /= std::sqrt(static_cast<double>(shapes[i][1]));
        if (shapes[i].size() == 1) t = t * 0.1 + 1;
        state->inputs.push_back(t.requires_grad_());
      }
    }
    const std::vector<at::Tensor> outs = step(state->inputs);
    if (state->grads.empty())
      for (const at::Tensor& o : outs) state->grads.push_back(at::empty_like(o).normal_(0, 1, gen));
    torch::autograd::backward(outs, state->grads);
    for (at::Tensor& t : state->inputs) t.mutable_grad() = at::Tensor();
  };
}

bool use_fused_rms_norm(CpuKernels kernels, const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!fusable(x) || weight.scalar_type() != at::kFloat) return false;
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  const int64_t cal = calibration_rows(rows, 12.0 * static_cast<double>(dim));
  const std::vector<std::vector<int64_t>> shapes = {{cal, dim}, {dim}};
  return process_cpu_kernel_calibration().use_fused(
      kernels, shape_class(FusedStep::kRmsNorm, rows, {dim, 0, 0, 0}, at::get_num_threads()), cal,
      timed_step(shapes, [eps](const auto& in) { return std::vector<at::Tensor>{RmsNormFn::apply(in[0], in[1], eps)}; }),
      timed_step(shapes, [eps](const auto& in) { return std::vector<at::Tensor>{rms_norm_ops(in[0], in[1], eps)}; }));
}

bool use_fused_qkv_rope(const DecoderSpec& spec, const at::Tensor& x) {
  if (!fusable(x)) return false;
  const int64_t hidden = x.size(-1), t = x.size(1), rows = x.numel() / hidden, d = spec.head_dim;
  const int64_t width = (spec.heads + 2 * spec.kv_heads) * d;
  // Projection forward + two backward matmuls per row, plus the elementwise work (~30 flops/value).
  const int64_t cal = calibration_rows(rows, 6.0 * double(hidden) * double(width) + 30.0 * double(width));
  const int64_t cal_t = std::min(t, cal), cal_b = std::max<int64_t>(1, cal / cal_t);
  std::vector<std::vector<int64_t>> shapes = {{cal_b, cal_t, hidden}, {spec.heads * d, hidden}, {spec.kv_heads * d, hidden},
                                              {spec.kv_heads * d, hidden}, {d}, {d}};
  if (spec.attention_bias) shapes.insert(shapes.end(), {{spec.heads * d}, {spec.kv_heads * d}, {spec.kv_heads * d}});
  // The rope tables are built on the first timed call, not here: this runs on every attention
  // forward, and tables built eagerly (two per call, each a cos and a sin of [T, d]) added 36
  // elementwise ops to every step of a 9-layer student that nothing read once the decision was
  // cached, or never needed (fused, aten).
  auto run = [spec, cal_t](bool fused) -> StepFn {
    return [spec, cal_t, fused, rope = std::make_shared<std::optional<Rotary>>()](const std::vector<at::Tensor>& in) {
      if (!*rope) *rope = make_rotary(cal_t, spec.head_dim, spec.rope_theta, at::kFloat, at::kCPU);
      QkvWeights w{in[1], in[2], in[3], {}, {}, {}, in[4], in[5]};
      if (in.size() > 6) std::tie(w.q_bias, w.k_bias, w.v_bias) = std::tie(in[6], in[7], in[8]);
      return fused ? qkv_rope_fused(in[0], w, **rope, spec) : qkv_rope_ops(in[0], w, **rope, spec);
    };
  };
  return process_cpu_kernel_calibration().use_fused(
      spec.cpu_kernels,
      shape_class(FusedStep::kQkvRope, rows, {hidden, spec.heads, spec.kv_heads, d}, at::get_num_threads()), cal,
      timed_step(shapes, run(true)), timed_step(shapes, run(false)));
}

bool use_fused_swiglu_mlp(CpuKernels kernels, const at::Tensor& x, int64_t intermediate) {
  if (!fusable(x)) return false;
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  // Two projections forward and four matmuls backward per row, plus ~40 flops per SwiGLU value.
  const int64_t cal = calibration_rows(rows, 12.0 * double(hidden) * double(intermediate) + 40.0 * double(intermediate));
  const std::vector<std::vector<int64_t>> shapes = {{cal, hidden}, {intermediate, hidden}, {intermediate, hidden}};
  return process_cpu_kernel_calibration().use_fused(
      kernels, shape_class(FusedStep::kSwiGluMlp, rows, {hidden, intermediate, 0, 0}, at::get_num_threads()), cal,
      timed_step(shapes, [](const auto& in) { return std::vector<at::Tensor>{swiglu_mlp_fused(in[0], in[1], in[2])}; }),
      timed_step(shapes, [](const auto& in) { return std::vector<at::Tensor>{swiglu_mlp_ops(in[0], in[1], in[2])}; }));
}

}  // namespace

DecoderSpec decoder_spec_from(const Qwen3Config& config) {
  DecoderSpec spec;
  spec.hidden = config.hidden_size;
  spec.heads = config.num_attention_heads;
  spec.kv_heads = config.num_key_value_heads;
  spec.head_dim = config.head_dim;
  spec.intermediate = config.intermediate_size;
  spec.rope_theta = config.rope_theta;
  spec.rms_eps = config.rms_norm_eps;
  spec.attention_bias = config.attention_bias;
  return spec;
}

void validate_decoder_spec(const DecoderSpec& spec, const std::string& where) {
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) throw InputError(where + ": " + name + " must be positive, got " + std::to_string(v));
  };
  positive("hidden", spec.hidden);
  positive("heads", spec.heads);
  positive("kv_heads", spec.kv_heads);
  positive("head_dim", spec.head_dim);
  positive("intermediate", spec.intermediate);
  if (spec.heads % spec.kv_heads != 0)
    throw InputError(where + ": heads (" + std::to_string(spec.heads) +
                     ") must be a multiple of kv_heads (" + std::to_string(spec.kv_heads) + ")");
  if (spec.head_dim % 2 != 0)
    throw InputError(where + ": head_dim must be even for rotary embedding, got " +
                     std::to_string(spec.head_dim));
  if (!(spec.rope_theta > 0)) throw InputError(where + ": rope_theta must be positive");
  if (!(spec.rms_eps > 0)) throw InputError(where + ": rms_eps must be positive");
}

at::Tensor in_compute_dtype(const at::Tensor& w, at::ScalarType compute) {
  if (!w.defined() || compute == at::ScalarType::Undefined || w.scalar_type() == compute) return w;
  return w.to(compute);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, CpuKernels kernels) {
  if (use_fused_rms_norm(kernels, x, weight, eps)) return RmsNormFn::apply(x, weight, eps);
  return rms_norm_ops(x, weight, eps);
}

Rotary make_rotary(int64_t seq_len, int64_t head_dim, double theta, at::ScalarType dtype,
                   at::Device device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // HF: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), all in fp32 on CPU.
  const at::Tensor exponent = at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, exponent).reciprocal();
  // HF: position_ids[..., None].float() * inv_freq; emb = cat((freqs, freqs), -1).
  const at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kLong)).to(at::kFloat);
  const at::Tensor freqs = pos.unsqueeze(-1) * inv_freq;
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  const at::Tensor sin = emb.sin().to(device, dtype);
  const int64_t half = head_dim / 2;
  return Rotary{emb.cos().to(device, dtype), sin, at::cat({-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)}, -1)};
}

at::Tensor apply_rotary(const at::Tensor& x, const Rotary& rope) { return rotary_ops(x, rope.cos, rope.sin_signed); }

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, bool with_bias,
                               const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({out, in}, options));
  if (with_bias) bias = register_parameter("bias", at::zeros({out}, options));
}

at::Tensor ProjectionImpl::forward(const at::Tensor& x) {
  return at::linear(x, in_compute_dtype(weight, compute_dtype), in_compute_dtype(bias, compute_dtype));
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({vocab, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  return at::embedding(in_compute_dtype(weight, compute_dtype), ids);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, const at::TensorOptions& options, CpuKernels kernels_)
    : eps(eps_), kernels(kernels_) {
  weight = register_parameter("weight", at::ones({dim}, options));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor gain = output_scale == 1.0 ? weight : weight * output_scale;
  return rms_norm(x, in_compute_dtype(gain, compute_dtype), eps, kernels);
}

AttentionImpl::AttentionImpl(const DecoderSpec& s, const at::TensorOptions& options) : spec(s) {
  auto linear = [&](int64_t in, int64_t out) {
    Projection p(in, out, spec.attention_bias, options);
    p->compute_dtype = spec.compute_dtype;
    return p;
  };
  auto norm = [&] {
    RMSNorm n(spec.head_dim, spec.rms_eps, options, spec.cpu_kernels);
    n->compute_dtype = spec.compute_dtype;
    return n;
  };
  q_proj = register_module("q_proj", linear(spec.hidden, spec.heads * spec.head_dim));
  k_proj = register_module("k_proj", linear(spec.hidden, spec.kv_heads * spec.head_dim));
  v_proj = register_module("v_proj", linear(spec.hidden, spec.kv_heads * spec.head_dim));
  o_proj = register_module("o_proj", linear(spec.heads * spec.head_dim, spec.hidden));
  q_norm = register_module("q_norm", norm());
  k_norm = register_module("k_norm", norm());
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const Rotary& rope) {
  const int64_t b = x.size(0), t = x.size(1), d = spec.head_dim;
  auto c = [this](const at::Tensor& t) { return in_compute_dtype(t, spec.compute_dtype); };
  const QkvWeights w{c(q_proj->weight), c(k_proj->weight), c(v_proj->weight), c(q_proj->bias),
                     c(k_proj->bias),   c(v_proj->bias),   c(q_norm->weight), c(k_norm->weight)};
  const std::vector<at::Tensor> qkv =
      use_fused_qkv_rope(spec, x) ? qkv_rope_fused(x, w, rope, spec) : qkv_rope_ops(x, w, rope, spec);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  // Fused SDPA (flash kernel on CPU and CUDA); enable_gqa lets it read the shared KV heads without
  // materializing repeat_kv. Scale 1/sqrt(head_dim) as HF's `head_dim ** -0.5`.
  const at::Tensor o = at::scaled_dot_product_attention(
      q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/t > 1,
      /*scale=*/std::pow(static_cast<double>(d), -0.5),
      /*enable_gqa=*/spec.kv_heads != spec.heads);
  return o_proj(o.transpose(1, 2).reshape({b, t, spec.heads * d}));
}

MlpImpl::MlpImpl(const DecoderSpec& spec, const at::TensorOptions& options)
    : cpu_kernels(spec.cpu_kernels), compute_dtype(spec.compute_dtype) {
  auto linear = [&](int64_t in, int64_t out) {
    Projection p(in, out, false, options);
    p->compute_dtype = spec.compute_dtype;
    return p;
  };
  gate_proj = register_module("gate_proj", linear(spec.hidden, spec.intermediate));
  up_proj = register_module("up_proj", linear(spec.hidden, spec.intermediate));
  down_proj = register_module("down_proj", linear(spec.intermediate, spec.hidden));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  const at::Tensor gate = in_compute_dtype(gate_proj->weight, compute_dtype);
  const at::Tensor up = in_compute_dtype(up_proj->weight, compute_dtype);
  return down_proj(use_fused_swiglu_mlp(cpu_kernels, x, gate.size(0)) ? swiglu_mlp_fused(x, gate, up)
                                                                       : swiglu_mlp_ops(x, gate, up));
}

DecoderBlockImpl::DecoderBlockImpl(const DecoderSpec& spec, LayerPlacement layer_placement,
                                   const at::TensorOptions& options)
    : placement(layer_placement), recompute_mlp(spec.recompute == Recompute::kMlp) {
  self_attn = register_module("self_attn", Attention(spec, options));
  mlp = register_module("mlp", Mlp(spec, options));
  auto make_norm = [&] {
    RMSNorm n(spec.hidden, spec.rms_eps, options, spec.cpu_kernels);
    n->compute_dtype = spec.compute_dtype;
    n->output_scale = placement.output_scale;
    return n;
  };
  input_layernorm = register_module("input_layernorm", make_norm());
  post_attention_layernorm = register_module("post_attention_layernorm", make_norm());
  if (placement.norms == LayerNorms::kPeri) {
    attn_output_layernorm = register_module("attn_output_layernorm", make_norm());
    mlp_output_layernorm = register_module("mlp_output_layernorm", make_norm());
  }
}

at::Tensor DecoderBlockImpl::forward(const at::Tensor& x, const Rotary& rope) {
  const LayerNorms norms = placement.norms;
  // The MLP sub-layer with its residual add (and its input norm, and peri's output norm): what
  // recompute = "mlp" reruns. The add is inside so that h's gradient sums its two uses in the same
  // order either way. Post-norm's norm2 follows the add, outside.
  auto mlp_sublayer = [norms, m = mlp, in = post_attention_layernorm,
                       out = mlp_output_layernorm](const at::Tensor& h) mutable {
    switch (norms) {
      case LayerNorms::kPre: return h + m->forward(in->forward(h));
      case LayerNorms::kPeri: return h + out->forward(m->forward(in->forward(h)));
      case LayerNorms::kPost: break;
    }
    return h + m->forward(h);
  };
  auto mlp_part = [&](const at::Tensor& h) { return recompute_mlp ? recomputed(mlp_sublayer, h) : mlp_sublayer(h); };
  switch (norms) {
    case LayerNorms::kPre: return mlp_part(x + self_attn(input_layernorm(x), rope));
    case LayerNorms::kPeri: return mlp_part(x + attn_output_layernorm(self_attn(input_layernorm(x), rope)));
    case LayerNorms::kPost: break;
  }
  return post_attention_layernorm(mlp_part(input_layernorm(x + self_attn(x, rope))));
}

}  // namespace deepen
