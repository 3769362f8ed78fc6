// The GEMMs of one distillation step, listed from the model shapes (bench/step_gemms.h).
#include "bench/step_gemms.h"

#include <utility>

namespace deepen::bench {
namespace {

// A block's projections as (name, in, out): the weights plan/cost_model.h counts in
// block_matmul_params, one linear each.
std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> projections(const ModelShape& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  return {{"q", {m.hidden, q}},       {"k", {m.hidden, kv}},          {"v", {m.hidden, kv}},
          {"o", {q, m.hidden}},       {"gate", {m.hidden, m.intermediate}}, {"up", {m.hidden, m.intermediate}},
          {"down", {m.intermediate, m.hidden}}};
}

Gemm forward(std::string name, std::string part, int64_t n_rows, int64_t in, int64_t out, FloatDtype dtype, int64_t count) {
  return Gemm{std::move(name) + " forward", std::move(part), n_rows, in, out, false, true, dtype, count};
}
Gemm grad_input(std::string name, std::string part, int64_t n_rows, int64_t in, int64_t out, FloatDtype dtype, int64_t count) {
  return Gemm{std::move(name) + " dX", std::move(part), n_rows, out, in, false, false, dtype, count};
}
Gemm grad_weight(std::string name, std::string part, int64_t n_rows, int64_t in, int64_t out, FloatDtype dtype, int64_t count) {
  return Gemm{std::move(name) + " dW", std::move(part), out, n_rows, in, true, false, dtype, count, true};
}

}  // namespace

std::vector<Gemm> step_gemms(const StepShape& s) {
  const int64_t n = s.tokens();
  std::vector<Gemm> out;
  for (const auto& [name, io] : projections(s.teacher))
    out.push_back(forward(std::string("teacher layer ") + name, "teacher layers", n, io.first, io.second, s.teacher_dtype,
                          s.teacher.layers));
  out.push_back(forward("teacher head", "teacher head", n, s.teacher.hidden, s.teacher.vocab, s.teacher_dtype, 1));
  for (const auto& [name, io] : projections(s.student)) {
    const std::string what = std::string("student layer ") + name;
    out.push_back(forward(what, "student layers forward", n, io.first, io.second, s.student_dtype, s.student.layers));
    out.push_back(grad_input(what, "student layers backward", n, io.first, io.second, s.student_dtype, s.student.layers));
    out.push_back(grad_weight(what, "student layers backward", n, io.first, io.second, s.student_dtype, s.student.layers));
  }
  const int64_t h = s.student.hidden, v = s.student.vocab;
  out.push_back(forward("student head", "student head forward", n, h, v, s.student_dtype, 1));
  out.push_back(grad_input("student head", "student head backward", n, h, v, s.student_dtype, 1));
  out.push_back(grad_weight("student head", "student head backward", n, h, v, s.student_dtype, 1));
  return out;
}

int64_t student_parameters(const StepShape& s) { return total_params(s.student); }

double attention_flops(const StepShape& s) {
  // plan/cost_model.h's forward count less its matmul weights leaves the attention term.
  auto attention = [&](const ModelShape& m) {
    const double per_token = forward_flops_per_token(m, m.layers, s.seq, false) -
                             2.0 * static_cast<double>(m.layers) * static_cast<double>(block_matmul_params(m));
    return per_token * static_cast<double>(s.tokens());
  };
  return attention(s.teacher) + 3.0 * attention(s.student);
}

}  // namespace deepen::bench
