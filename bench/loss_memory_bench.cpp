// Peak memory and time of the chunked distillation loss vs the unchunked autograd loss, same run.
//
// Each variant runs in a fresh child process (this binary re-executed with --variant), so that its
// peak resident set is its own: the child builds the inputs (hidden [N, H], head weight [V, H],
// teacher logits [N, V], labels [N]), records its resident set, resets the kernel's peak counter
// (/proc/self/clear_refs = 5), runs forward + backward, and reads the peak (VmHWM). "loss memory"
// is that peak minus the resident set before the loss: what the loss itself needs on top of its
// inputs (the [V, H] weight gradient included, for both variants).
//
//   build-x/bench/loss_memory_bench                      # 4×1024 tokens, vocab 151936, hidden 1024
//   build-x/bench/loss_memory_bench --tokens 512 --repeats 2
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/peak_memory.h"
#include "train/compute_threads.h"
#include "train/distill_loss.h"

namespace {

using deepen::bench::cpu_seconds;
using deepen::bench::reset_peak_rss;
using deepen::bench::run_variant;
using deepen::bench::seconds_since;
using deepen::bench::status_bytes;

struct Options {
  int64_t tokens = 4 * 1024;
  int64_t hidden = 1024;
  int64_t vocab = 151936;
  int64_t chunk = 8192;
  double alpha = 0.5;
  double tau = 2.0;
  std::string teacher = "full";  // "full" | "topk"
  int64_t topk = 64;
  int64_t threads = 0;
  int64_t repeats = 1;
  std::string variant;  // child only: "chunked" | "unchunked"
};

int run_child(const Options& o) {
  // The unchunked variant at full size takes most of a small machine: if memory runs out, the kernel
  // should kill this child, not a neighbour.
  std::ofstream("/proc/self/oom_score_adj") << "1000";
  deepen::set_compute_threads(o.threads);
  torch::manual_seed(0);
  const at::Tensor hidden = torch::randn({o.tokens, o.hidden});
  const at::Tensor weight = torch::randn({o.vocab, o.hidden}) * (1.0 / std::sqrt(static_cast<double>(o.hidden)));
  const at::Tensor labels = torch::randint(0, o.vocab, {o.tokens}, torch::kLong);
  deepen::TeacherTargets teacher;
  {
    at::Tensor logits = torch::randn({o.tokens, o.vocab}) * 2.0;
    teacher = deepen::parse_option<deepen::TeacherOutput>(o.teacher, "--teacher") == deepen::TeacherOutput::kTopk
                  ? deepen::teacher_topk(logits, o.topk, o.tau) : deepen::TeacherTargets::full(logits);
  }
  deepen::DistillLossOptions lo;
  lo.alpha = o.alpha;
  lo.temperature = o.tau;
  lo.vocab_chunk = o.chunk;
  lo.tail = deepen::TopkTail::kBucket;
  const auto fn = o.variant == "chunked" ? deepen::distill_loss : deepen::distill_loss_reference;

  nlohmann::json runs = nlohmann::json::array();
  for (int64_t r = 0; r < o.repeats; ++r) {
    at::Tensor h = hidden.detach().requires_grad_(true);
    at::Tensor w = weight.detach().requires_grad_(true);
    const int64_t before = status_bytes("VmRSS");
    reset_peak_rss();
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    deepen::DistillLoss out = fn(h, w, teacher, labels, lo);
    const double forward_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    out.loss.backward();
    const double backward_s = seconds_since(t1);
    const double cpu_s = cpu_seconds() - cpu0;
    const int64_t peak = status_bytes("VmHWM");
    runs.push_back({{"rss_before", before},
                    {"peak_rss", peak},
                    {"loss_bytes", peak - before},
                    {"forward_s", forward_s},
                    {"backward_s", backward_s},
                    {"cpu_s", cpu_s},
                    {"loss", out.loss.item<double>()},
                    {"grad_w_norm", w.grad().norm().item<double>()}});
    h.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
  }
  std::cout << "RESULT " << runs.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Peak memory and time of the chunked distillation loss vs unchunked autograd"};
  app.add_option("--tokens", o.tokens, "tokens N (rows)");
  app.add_option("--hidden", o.hidden, "hidden size H");
  app.add_option("--vocab", o.vocab, "vocabulary V");
  app.add_option("--chunk", o.chunk, "vocabulary chunk of the chunked loss");
  app.add_option("--alpha", o.alpha, "KL weight (1 - alpha on CE)");
  app.add_option("--tau", o.tau, "temperature");
  app.add_option("--teacher", o.teacher, "full | topk (bucket tail)")->check(CLI::IsMember({"full", "topk"}));
  app.add_option("--topk", o.topk, "k for --teacher topk");
  app.add_option("--threads", o.threads, "compute threads (0 = all cores)");
  app.add_option("--repeats", o.repeats, "forward+backward runs per variant (the last is reported)");
  app.add_option("--variant", o.variant, "internal: run one variant in this process")
      ->check(CLI::IsMember({"chunked", "unchunked"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (!o.variant.empty()) return run_child(o);

    std::vector<std::string> base = {argv[0],
                                     "--tokens", std::to_string(o.tokens),
                                     "--hidden", std::to_string(o.hidden),
                                     "--vocab", std::to_string(o.vocab),
                                     "--chunk", std::to_string(o.chunk),
                                     "--alpha", std::to_string(o.alpha),
                                     "--tau", std::to_string(o.tau),
                                     "--teacher", o.teacher,
                                     "--topk", std::to_string(o.topk),
                                     "--threads", std::to_string(o.threads),
                                     "--repeats", std::to_string(o.repeats)};
    const double nv_gb = static_cast<double>(o.tokens) * static_cast<double>(o.vocab) * 4 / 1e9;
    std::printf("loss memory bench: N=%ld tokens, V=%ld, H=%ld, chunk=%ld, alpha=%g, tau=%g, teacher=%s, fp32; "
                "one [N,V] fp32 tensor = %.2f GB\n",
                o.tokens, o.vocab, o.hidden, o.chunk, o.alpha, o.tau, o.teacher.c_str(), nv_gb);
    nlohmann::json res[2];
    const char* names[2] = {"chunked", "unchunked"};
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> args = base;
      args.push_back("--variant");
      args.push_back(names[i]);
      res[i] = run_variant(args).back();
      std::printf("%-10s loss memory %7.3f GB  peak RSS %7.3f GB  forward %7.2f s  backward %7.2f s  CPU %7.2f s  "
                  "loss %.7f\n",
                  names[i], res[i]["loss_bytes"].get<double>() / 1e9, res[i]["peak_rss"].get<double>() / 1e9,
                  res[i]["forward_s"].get<double>(), res[i]["backward_s"].get<double>(), res[i]["cpu_s"].get<double>(),
                  res[i]["loss"].get<double>());
    }
    const double mem_ratio = res[0]["loss_bytes"].get<double>() / res[1]["loss_bytes"].get<double>();
    const double peak_ratio = res[0]["peak_rss"].get<double>() / res[1]["peak_rss"].get<double>();
    const double t0 = res[0]["forward_s"].get<double>() + res[0]["backward_s"].get<double>();
    const double t1 = res[1]["forward_s"].get<double>() + res[1]["backward_s"].get<double>();
    const double loss_rel = std::abs(res[0]["loss"].get<double>() - res[1]["loss"].get<double>()) /
                            std::abs(res[1]["loss"].get<double>());
    const double cpu_ratio = res[0]["cpu_s"].get<double>() / res[1]["cpu_s"].get<double>();
    std::printf("ratio chunked/unchunked: loss memory %.3fx (goal <= 0.4x), peak RSS %.3fx, wall time %.2fx, "
                "CPU time %.2fx; losses agree to %.1e relative\n",
                mem_ratio, peak_ratio, t0 / t1, cpu_ratio, loss_rel);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loss_memory_bench: %s\n", e.what());
    return 1;
  }
}
