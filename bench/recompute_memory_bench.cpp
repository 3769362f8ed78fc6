// Peak memory and time of one student forward + backward with student.recompute = none, layer and
// mlp, same run: each variant in a fresh child process (this binary re-executed with --variant) so
// its peak resident set is its own. "step memory" = peak resident set during forward + backward
// minus the resident set before it (weights, the batch and the process are already there): the
// activations kept for the backward pass and the gradients.
//
//   build/bench/recompute_memory_bench                          # 9 layers, hidden 512, 4 x 1024 tokens
//   build/bench/recompute_memory_bench --hidden 256 --tokens 2048
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "bench/peak_memory.h"
#include "model/recompute.h"
#include "model/student.h"
#include "train/compute_threads.h"

namespace {

using deepen::bench::cpu_seconds;
using deepen::bench::reset_peak_rss;
using deepen::bench::run_variant;
using deepen::bench::seconds_since;
using deepen::bench::status_bytes;

struct Options {
  int64_t layers = 9;
  int64_t hidden = 512;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t head_dim = 64;
  int64_t intermediate = 1536;
  int64_t vocab = 264;
  int64_t batch = 4;
  int64_t tokens = 1024;  // per sequence
  int64_t threads = 0;
  std::string variant;  // child only: none | layer | mlp
};

int run_child(const Options& o) {
  std::ofstream("/proc/self/oom_score_adj") << "1000";
  deepen::set_compute_threads(o.threads);
  deepen::StudentSpec spec;
  spec.decoder = deepen::DecoderSpec{.hidden = o.hidden, .heads = o.heads, .kv_heads = o.kv_heads,
                                     .head_dim = o.head_dim, .intermediate = o.intermediate};
  spec.decoder.cpu_kernels = deepen::CpuKernels::kAten;  // the same kernels in every variant
  spec.decoder.recompute = deepen::parse_option<deepen::Recompute>(o.variant, "--variant");
  spec.vocab_size = o.vocab;
  spec.max_depth = o.layers;
  spec.tie_embeddings = false;
  deepen::GrowableStudent student(spec, o.layers, 1);
  torch::manual_seed(0);
  const at::Tensor ids = torch::randint(0, o.vocab, {o.batch, o.tokens}, torch::kLong);
  const at::Tensor labels = torch::randint(0, o.vocab, {o.batch * o.tokens}, torch::kLong);
  nlohmann::json runs = nlohmann::json::array();
  for (int r = 0; r < 2; ++r) {  // the first warms up allocator and kernels; the second is reported
    for (auto& p : student.parameters()) p.mutable_grad() = at::Tensor();
    const int64_t before = status_bytes("VmRSS");
    reset_peak_rss();
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor loss = at::cross_entropy_loss(student.forward(ids).view({-1, o.vocab}), labels);
    loss.backward();
    const double step_s = seconds_since(t0);
    const double cpu_s = cpu_seconds() - cpu0;
    const int64_t peak = status_bytes("VmHWM");
    double grad_sq = 0;
    for (const auto& p : student.parameters()) grad_sq += p.grad().pow(2).sum().item<double>();
    runs.push_back({{"step_bytes", peak - before}, {"step_s", step_s}, {"cpu_s", cpu_s},
                    {"loss", loss.item<double>()}, {"grad_norm", std::sqrt(grad_sq)}});
  }
  std::cout << "RESULT " << runs.back().dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Student step peak memory and time with activation recomputation none / layer / mlp"};
  app.add_option("--layers", o.layers, "decoder layers");
  app.add_option("--hidden", o.hidden, "hidden size");
  app.add_option("--heads", o.heads, "query heads");
  app.add_option("--kv-heads", o.kv_heads, "key/value heads");
  app.add_option("--head-dim", o.head_dim, "head dimension");
  app.add_option("--intermediate", o.intermediate, "MLP width");
  app.add_option("--vocab", o.vocab, "vocabulary");
  app.add_option("--batch", o.batch, "sequences");
  app.add_option("--tokens", o.tokens, "tokens per sequence");
  app.add_option("--threads", o.threads, "compute threads (0 = all cores)");
  app.add_option("--variant", o.variant, "internal: run one variant in this process")
      ->check(CLI::IsMember({"none", "layer", "mlp"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (!o.variant.empty()) return run_child(o);
    std::vector<std::string> base = {argv[0], "--layers", std::to_string(o.layers), "--hidden", std::to_string(o.hidden),
                                     "--heads", std::to_string(o.heads), "--kv-heads", std::to_string(o.kv_heads),
                                     "--head-dim", std::to_string(o.head_dim), "--intermediate",
                                     std::to_string(o.intermediate), "--vocab", std::to_string(o.vocab), "--batch",
                                     std::to_string(o.batch), "--tokens", std::to_string(o.tokens), "--threads",
                                     std::to_string(o.threads)};
    std::printf("recompute memory bench: %ld layers, hidden %ld, %ld/%ld heads x %ld, intermediate %ld, vocab %ld, "
                "%ld x %ld tokens, fp32, one child process per variant (second step reported)\n",
                o.layers, o.hidden, o.heads, o.kv_heads, o.head_dim, o.intermediate, o.vocab, o.batch, o.tokens);
    nlohmann::json none;
    for (const char* v : {"none", "layer", "mlp"}) {
      std::vector<std::string> args = base;
      args.insert(args.end(), {"--variant", v});
      const nlohmann::json r = run_variant(args);
      if (none.is_null()) none = r;
      const double mem = r["step_bytes"].get<double>(), mem0 = none["step_bytes"].get<double>();
      std::printf("  %-6s step memory %8.1f MB (%.2fx none)  step %6.2f s (%.2fx none)  cpu %6.2f s  loss %.6f  "
                  "|grad| %.6f\n",
                  v, mem / 1e6, mem / mem0, r["step_s"].get<double>(),
                  r["step_s"].get<double>() / none["step_s"].get<double>(), r["cpu_s"].get<double>(),
                  r["loss"].get<double>(), r["grad_norm"].get<double>());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recompute_memory_bench: %s\n", e.what());
    return 1;
  }
}
