// The step's GEMM bound, measured on this machine (bench/step_bound.h).
#include "bench/step_bound.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "config/float_dtype.h"
#include "model/torch_dtype.h"

namespace deepen::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const auto& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The N to time a GEMM at: the step's, unless its three matrices pass max_bytes; then the most rows
// (a multiple of 256) that fit.
int64_t timed_tokens(const Gemm& g, int64_t tokens, int64_t max_bytes) {
  const double e = float_dtype_bytes(g.dtype);
  // Bytes per token row, and of the matrix that has no token dimension (the weight, or dW's output).
  const double per_row = g.tokens_in_k ? e * static_cast<double>(g.m + g.n) : e * static_cast<double>(g.k + g.n);
  const double fixed = g.tokens_in_k ? e * static_cast<double>(g.m * g.n) : e * static_cast<double>(g.k * g.n);
  if (fixed + per_row * static_cast<double>(tokens) <= static_cast<double>(max_bytes)) return tokens;
  const auto rows = static_cast<int64_t>((static_cast<double>(max_bytes) - fixed) / per_row) / 256 * 256;
  return std::clamp<int64_t>(rows, 256, tokens);
}

// One GEMM's best time of at least `reps` calls after a warm-up, operands in the step's layouts, the output
// allocated once (the bound is the arithmetic, not a fresh [N, V] tensor's page faults).
double time_gemm(const Gemm& g, int64_t tokens, int reps) {
  const int64_t m = g.tokens_in_k ? g.m : tokens, k = g.tokens_in_k ? tokens : g.k, n = g.n;
  const auto opt = at::TensorOptions().dtype(to_scalar_type(g.dtype));
  const at::Tensor a = g.a_transposed ? at::rand({k, m}, opt).t() : at::rand({m, k}, opt);
  const at::Tensor b = g.b_transposed ? at::rand({n, k}, opt).t() : at::rand({k, n}, opt);
  at::Tensor c = at::empty({m, n}, opt);
  // Small GEMMs take milliseconds, and one neighbour's burst on a shared machine spoils a few calls:
  // they get more calls (up to ~0.3 s of them), the head's second-long ones `reps`.
  const double warm = seconds_of([&] { at::mm_out(c, a, b); });
  const int calls = std::max(reps, std::min(50, static_cast<int>(0.3 / std::max(warm, 1e-6))));
  double best = 1e300;  // the warm-up call (first touch of the output, kernel selection) does not count
  for (int r = 0; r < calls; ++r) best = std::min(best, seconds_of([&] { at::mm_out(c, a, b); }));
  return best;
}

// Bytes per second of an AdamW-shaped pass at the current thread count: p, g, m, v read, p, m, v
// written (28 bytes per element), one fused loop that the compiler vectorises, split over the
// threads as at::parallel_for splits element-wise work. The arithmetic is a few FMAs per element, so
// the loop runs at the memory's pace: the least time any AdamW over these bytes can take here.
double stream_bytes_per_s(int64_t elements, int reps) {
  const auto opt = at::TensorOptions().dtype(at::kFloat);
  std::vector<at::Tensor> bufs;
  for (int i = 0; i < 4; ++i) bufs.push_back(at::rand({elements}, opt));
  float* p = bufs[0].data_ptr<float>();
  const float* g = bufs[1].data_ptr<float>();
  float* m = bufs[2].data_ptr<float>();
  float* v = bufs[3].data_ptr<float>();
  auto pass = [&] {
    at::parallel_for(0, elements, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float gi = g[i];
        const float mi = 0.9f * m[i] + 0.1f * gi;
        const float vi = 0.95f * v[i] + 0.05f * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * 0.99999f - 1e-4f * (mi + vi);
      }
    });
  };
  pass();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) best = std::min(best, seconds_of(pass));
  return 28.0 * static_cast<double>(elements) / best;
}

std::string shape_text(const Gemm& g, int64_t tokens) {
  const int64_t m = g.tokens_in_k ? g.m : tokens, k = g.tokens_in_k ? tokens : g.k;
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%ld,%ld]%sx[%ld,%ld]%s", long(m), long(k), g.a_transposed ? "T" : "", long(k),
                long(g.n), g.b_transposed ? "T" : "");
  return buf;
}

}  // namespace

double StepBound::gemm_seconds() const {
  double s = 0;
  for (const GemmTime& t : gemms) s += t.seconds;
  return s;
}

double StepBound::gemm_flops() const {
  double f = 0;
  for (const GemmTime& t : gemms) f += t.gemm.flops();
  return f;
}

std::vector<std::pair<std::string, double>> StepBound::parts() const {
  std::vector<std::pair<std::string, double>> out;
  for (const GemmTime& t : gemms) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == t.gemm.part; });
    if (it == out.end()) out.emplace_back(t.gemm.part, t.seconds);
    else it->second += t.seconds;
  }
  out.emplace_back("AdamW", adamw_seconds());
  return out;
}

StepBound measure_step_bound(const StepShape& shape, int64_t parameters, const BoundOptions& options) {
  StepBound b;
  b.shape = shape;
  b.threads = at::get_num_threads();
  b.parameters = parameters > 0 ? parameters : student_parameters(shape);
  // Equal shapes (the teacher's and student's heads at equal widths, their layers) are timed once.
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, FloatDtype, bool, int64_t>, double> seen;
  for (const Gemm& g : step_gemms(shape)) {
    const int64_t t = timed_tokens(g, shape.tokens(), options.max_gemm_bytes);
    const auto key = std::tuple(g.m, g.k, g.n, g.a_transposed, g.b_transposed, g.dtype, g.tokens_in_k, t);
    if (!seen.contains(key)) seen[key] = time_gemm(g, t, options.reps);
    const double scale = static_cast<double>(shape.tokens()) / static_cast<double>(t);
    b.gemms.push_back(GemmTime{g, t, seen[key] * scale * static_cast<double>(g.count)});
  }
  b.stream_bytes_per_s = stream_bytes_per_s(std::min(options.stream_elements, b.parameters), options.reps);
  return b;
}

void print_step_bound(std::FILE* out, const StepBound& b) {
  const StepShape& s = b.shape;
  std::fprintf(out, "GEMM bound at this step's shapes (at::mm, best of a few calls after a warm-up, %d threads; teacher %s, "
               "student %s; N = %ld tokens):\n", b.threads, option_name(s.teacher_dtype), option_name(s.student_dtype),
               long(s.tokens()));
  for (const GemmTime& t : b.gemms) {
    const Gemm& g = t.gemm;
    const double per_call = t.seconds / static_cast<double>(g.count);
    std::fprintf(out, "  %-28s %s x%-2ld %-30s %8.2f GFLOP %9.1f ms  %6.1f GFLOP/s%s\n", g.name.c_str(),
                 option_name(g.dtype), long(g.count), shape_text(g, s.tokens()).c_str(), g.flops() / 1e9, t.seconds * 1e3,
                 g.flops() / static_cast<double>(g.count) / per_call / 1e9,
                 t.timed_tokens != s.tokens() ? (" (timed at N = " + std::to_string(t.timed_tokens) + ", scaled)").c_str() : "");
  }
  std::fprintf(out, "  AdamW: %ld parameters x 28 B (read p, g, m, v; write p, m, v) = %.2f GB at %.1f GB/s (an "
               "AdamW-shaped fused pass, %d threads) = %.1f ms\n", long(b.parameters), adamw_bytes(b.parameters) / 1e9,
               b.stream_bytes_per_s / 1e9, b.threads, b.adamw_seconds() * 1e3);
  std::fprintf(out, "  by part:");
  for (const auto& [part, sec] : b.parts()) std::fprintf(out, " %s %.0f ms;", part.c_str(), sec * 1e3);
  std::fprintf(out, "\n  bound: %.0f ms (GEMMs %.0f ms for %.1f GFLOP, AdamW %.0f ms)\n", b.seconds() * 1e3,
               b.gemm_seconds() * 1e3, b.gemm_flops() / 1e9, b.adamw_seconds() * 1e3);
  std::fprintf(out, "  not in the bound: attention's scores and weighted sums (SDPA, causal) %.2f GFLOP (%.1f%% of the "
               "GEMMs' FLOPs); the loss's element-wise passes over N x V = %.1fM logits a side (a few FLOP each per "
               "pass); norms, RoPE, SwiGLU's products, the embedding's gather and scatter\n",
               attention_flops(s) / 1e9, 100.0 * attention_flops(s) / b.gemm_flops(), loss_elements(s) / 1e6);
}

void print_step_against_bound(std::FILE* out, const char* who, double step_seconds, const StepBound& b) {
  std::fprintf(out, "%s's step is %.0f%% of the bound (bound %.0f ms / step %.0f ms); step / bound = %.2fx\n", who,
               100.0 * b.seconds() / step_seconds, b.seconds() * 1e3, step_seconds * 1e3, step_seconds / b.seconds());
}

nlohmann::json to_json(const StepBound& b) {
  nlohmann::json gemms = nlohmann::json::array();
  for (const GemmTime& t : b.gemms)
    gemms.push_back({{"name", t.gemm.name}, {"part", t.gemm.part}, {"m", t.gemm.tokens_in_k ? t.gemm.m : b.shape.tokens()},
                     {"k", t.gemm.tokens_in_k ? b.shape.tokens() : t.gemm.k}, {"n", t.gemm.n},
                     {"dtype", option_name(t.gemm.dtype)}, {"count", t.gemm.count}, {"flops", t.gemm.flops()},
                     {"timed_tokens", t.timed_tokens}, {"seconds", t.seconds}});
  nlohmann::json parts = nlohmann::json::object();
  for (const auto& [part, sec] : b.parts()) parts[part] = sec;
  return {{"bound_s", b.seconds()},
          {"gemm_s", b.gemm_seconds()},
          {"gemm_flops", b.gemm_flops()},
          {"adamw_s", b.adamw_seconds()},
          {"adamw_bytes", adamw_bytes(b.parameters)},
          {"parameters", b.parameters},
          {"stream_gb_per_s", b.stream_bytes_per_s / 1e9},
          {"attention_flops", attention_flops(b.shape)},
          {"loss_elements", loss_elements(b.shape)},
          {"threads", b.threads},
          {"tokens", b.shape.tokens()},
          {"parts_s", parts},
          {"gemms", gemms}};
}

}  // namespace deepen::bench
