// Peak memory and time of the distillation loss (rows in chunks, gradients made in the forward) and of
// the unchunked autograd loss, same run.
//
// Each variant runs in a fresh child process (this binary re-executed with --variant), so that its
// peak resident set is its own: the child builds the inputs (hidden [N, H], head weight [V, H],
// the teacher's targets: logits [N, V] fp32 or bf16, top-k, or hidden states [N, Ht] and a head
// [V, Ht]; labels [N]), records its resident set, resets the kernel's peak counter
// (/proc/self/clear_refs = 5), runs forward + backward, and reads the peak (VmHWM). "loss memory"
// is that peak minus the resident set before the loss: what the loss itself needs on top of its
// inputs (the [V, H] weight gradient included, for every variant; for rows, its workspace, made
// during the call as a trainer's first micro-batch makes it).
//
// Malloc (--mallocs): every variant runs once per setting listed, glibc's defaults ("default") and
// GLIBC_TUNABLES=glibc.malloc.hugetlb=1 ("hugetlb": large mmap'd chunks madvised for transparent huge
// pages, so a [N, V] tensor is faulted in 2 MB pages, not 4 KB ones). The unchunked loss allocates
// [N, V] tensors, so the setting may change its time, and its peak (a huge page is resident whole):
// the bench prints each and the ratios against the unchunked loss at its fastest and at its smallest.
//
//   build-x/bench/loss_memory_bench                      # 4×1024 tokens, vocab 151936, hidden 1024
//   build-x/bench/loss_memory_bench --tokens 512 --repeats 2
//   build-x/bench/loss_memory_bench --tokens 16384 --hidden 256 --teacher hidden --variants rows --mallocs default
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
#include <map>
#include <string>
#include <vector>

#include "bench/peak_memory.h"
#include "model/cpu_kernel_choice.h"
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
  double alpha = 0.5;
  double tau = 2.0;
  std::string teacher = "full";  // "full" | "topk" | "hidden"
  std::string logit_dtype = "fp32";  // full: "fp32" | "bf16"
  int64_t teacher_hidden = 256;     // hidden: Ht
  int64_t topk = 64;
  int64_t threads = 0;
  int64_t repeats = 1;
  int64_t row_chunk = 0;
  std::string kernels = "auto";
  std::string variants = "rows,unchunked";
  std::string mallocs = "default,hugetlb";
  std::string variant;  // child only: "rows" | "unchunked"
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
  // The bench's --teacher words, mapped once (scripts/check_option_strings.py: no option text compared).
  enum class Target { kFull, kTopk, kHidden, kNone };
  const std::map<std::string, Target> targets{
      {"full", Target::kFull}, {"topk", Target::kTopk}, {"hidden", Target::kHidden}, {"none", Target::kNone}};
  const Target target = targets.at(o.teacher);
  const bool bf16_logits = deepen::parse_option<deepen::FloatDtype>(o.logit_dtype, "--logit-dtype") == deepen::FloatDtype::kBf16;
  deepen::TeacherTargets teacher;
  if (target == Target::kNone) {
    // CE alone (pretraining): alpha must be 0.
  } else if (target == Target::kHidden) {
    teacher = deepen::TeacherTargets::from_hidden(
        torch::randn({o.tokens, o.teacher_hidden}),
        torch::randn({o.vocab, o.teacher_hidden}) * (2.0 / std::sqrt(static_cast<double>(o.teacher_hidden))));
  } else {
    // Made in the wire's dtype: an fp32 [N, V] first would double what a bf16 input needs.
    const auto dtype = target == Target::kFull && bf16_logits ? at::kBFloat16 : at::kFloat;
    at::Tensor logits = torch::randn({o.tokens, o.vocab}, torch::dtype(dtype)).mul_(2.0);
    if (target == Target::kTopk) teacher = deepen::teacher_topk(logits, o.topk, o.tau);
    else teacher = deepen::TeacherTargets::full(logits);
  }
  deepen::DistillLossOptions lo;
  lo.alpha = target == Target::kNone ? 0.0 : o.alpha;
  lo.temperature = o.tau;
  lo.row_chunk = o.row_chunk;
  lo.kernels = deepen::parse_option<deepen::CpuKernels>(o.kernels, "--kernels");
  lo.tail = deepen::TopkTail::kBucket;

  nlohmann::json runs = nlohmann::json::array();
  for (int64_t r = 0; r < o.repeats; ++r) {
    at::Tensor h = hidden.detach().requires_grad_(true);
    at::Tensor w = weight.detach().requires_grad_(true);
    const int64_t before = status_bytes("VmRSS");
    reset_peak_rss();
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    deepen::DistillLossWorkspace workspace;  // a trainer's, at its first micro-batch
    deepen::DistillLoss out = o.variant == "unchunked" ? deepen::distill_loss_reference(h, w, teacher, labels, lo)
                                                       : deepen::distill_loss(h, w, teacher, labels, lo, &workspace);
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
  CLI::App app{"Peak memory and time of the row-chunked distillation loss vs unchunked autograd"};
  app.add_option("--tokens", o.tokens, "tokens N (rows)");
  app.add_option("--hidden", o.hidden, "hidden size H");
  app.add_option("--vocab", o.vocab, "vocabulary V");
  app.add_option("--row-chunk", o.row_chunk, "rows per chunk of the row-chunked loss (0 = auto)");
  app.add_option("--kernels", o.kernels, "auto | fused | aten: the row-chunked loss's CPU path");
  app.add_option("--alpha", o.alpha, "KL weight (1 - alpha on CE)");
  app.add_option("--tau", o.tau, "temperature");
  app.add_option("--teacher", o.teacher, "full | topk (bucket tail) | hidden | none (CE alone)")
      ->check(CLI::IsMember({"full", "topk", "hidden", "none"}));
  app.add_option("--logit-dtype", o.logit_dtype, "full: fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--teacher-hidden", o.teacher_hidden, "hidden: the teacher's width Ht");
  app.add_option("--variants", o.variants, "which to run, comma-separated: rows, unchunked");
  app.add_option("--mallocs", o.mallocs, "malloc settings each variant runs under, comma-separated: default, hugetlb");
  app.add_option("--topk", o.topk, "k for --teacher topk");
  app.add_option("--threads", o.threads, "compute threads (0 = all cores)");
  app.add_option("--repeats", o.repeats, "forward+backward runs per variant (the last is reported)");
  app.add_option("--variant", o.variant, "internal: run one variant in this process")
      ->check(CLI::IsMember({"rows", "unchunked"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (!o.variant.empty()) return run_child(o);

    std::vector<std::string> base = {argv[0],
                                     "--tokens", std::to_string(o.tokens),
                                     "--hidden", std::to_string(o.hidden),
                                     "--vocab", std::to_string(o.vocab),
                                     "--row-chunk", std::to_string(o.row_chunk),
                                     "--kernels", o.kernels,
                                     "--alpha", std::to_string(o.alpha),
                                     "--tau", std::to_string(o.tau),
                                     "--teacher", o.teacher,
                                     "--logit-dtype", o.logit_dtype,
                                     "--teacher-hidden", std::to_string(o.teacher_hidden),
                                     "--topk", std::to_string(o.topk),
                                     "--threads", std::to_string(o.threads),
                                     "--repeats", std::to_string(o.repeats)};
    const double nv_gb = static_cast<double>(o.tokens) * static_cast<double>(o.vocab) * 4 / 1e9;
    std::printf("loss memory bench: N=%ld tokens, V=%ld, H=%ld, row chunk %ld (0 = auto), alpha=%g, "
                "tau=%g, teacher=%s%s, fp32; one [N,V] fp32 tensor = %.2f GB\n",
                o.tokens, o.vocab, o.hidden, o.row_chunk, o.alpha, o.tau, o.teacher.c_str(),
                o.teacher.rfind("full", 0) == 0 ? (" " + o.logit_dtype).c_str() : "", nv_gb);
    auto split = [](const std::string& list) {
      std::vector<std::string> out;
      std::stringstream in(list);
      for (std::string item; std::getline(in, item, ',');) out.push_back(item);
      return out;
    };
    // The bench's --mallocs words, mapped once to the environment each child starts with.
    const std::map<std::string, std::vector<std::string>> malloc_env{{"default", {}},
                                                                     {"hugetlb", {"GLIBC_TUNABLES=glibc.malloc.hugetlb=1"}}};
    struct Run {
      std::string variant, malloc, label;
      nlohmann::json r;
      double wall() const { return r["forward_s"].get<double>() + r["backward_s"].get<double>(); }
      double memory() const { return r["loss_bytes"].get<double>(); }
    };
    std::vector<Run> res;
    for (const std::string& name : split(o.variants)) {
      for (const std::string& m : split(o.mallocs)) {
        if (!malloc_env.contains(m)) throw std::invalid_argument("--mallocs: unknown setting \"" + m + "\" (default, hugetlb)");
        std::vector<std::string> args = base;
        args.push_back("--variant");
        args.push_back(name);
        res.push_back(Run{name, m, name + " [" + m + "]", run_variant(args, malloc_env.at(m)).back()});
        const nlohmann::json& r = res.back().r;
        std::printf("%-22s loss memory %7.3f GB  peak RSS %7.3f GB  forward %7.2f s  backward %7.2f s  CPU %7.2f s  "
                    "loss %.7f\n",
                    res.back().label.c_str(), r["loss_bytes"].get<double>() / 1e9, r["peak_rss"].get<double>() / 1e9,
                    r["forward_s"].get<double>(), r["backward_s"].get<double>(), r["cpu_s"].get<double>(),
                    r["loss"].get<double>());
        std::fflush(stdout);
      }
    }
    if (res.empty()) throw std::invalid_argument("--variants and --mallocs: nothing to run");
    for (size_t i = 1; i < res.size(); ++i) {
      const nlohmann::json& a = res[0].r;
      const nlohmann::json& b = res[i].r;
      std::printf("ratio %s/%s: loss memory %.3fx, peak RSS %.3fx, wall time %.2fx, CPU time %.2fx; losses agree to "
                  "%.1e relative\n",
                  res[0].label.c_str(), res[i].label.c_str(), a["loss_bytes"].get<double>() / b["loss_bytes"].get<double>(),
                  a["peak_rss"].get<double>() / b["peak_rss"].get<double>(), res[0].wall() / res[i].wall(),
                  a["cpu_s"].get<double>() / b["cpu_s"].get<double>(),
                  std::abs(a["loss"].get<double>() - b["loss"].get<double>()) / std::abs(b["loss"].get<double>()));
    }
    // Against each other variant at its best: its fastest setting for time, its smallest for memory.
    for (const std::string& name : split(o.variants)) {
      if (name == res[0].variant) continue;
      const Run* fastest = nullptr;
      const Run* smallest = nullptr;
      for (const Run& r : res) {
        if (r.variant != name) continue;
        if (!fastest || r.wall() < fastest->wall()) fastest = &r;
        if (!smallest || r.memory() < smallest->memory()) smallest = &r;
      }
      if (fastest)
        std::printf("against %s at its best: wall time %.2fx its fastest (%s), loss memory %.3fx its smallest (%s)\n",
                    name.c_str(), res[0].wall() / fastest->wall(), fastest->malloc.c_str(), res[0].memory() / smallest->memory(),
                    smallest->malloc.c_str());
    }
    return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "loss_memory_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loss_memory_bench: %s\n", e.what());
    return 1;
  }
}
