// Student training-step throughput: forward + cross-entropy + backward of a 9-layer, hidden-256
// GrowableStudent, against the very same weights and ids in transformers' Qwen3ForCausalLM from
// Python eager (bench/student_step_bench.py), measured in one run.
//
//   build-x/bench/student_step_bench [--threads 2] [--batch 8] [--seq 256] [--steps 10] [--vocab 256]
//                                    [--kernels auto|fused|aten] [--python-env GLIBC_TUNABLES=...]
//                                    [--baselines eager,eager+hugetlb,eager+tcmalloc,eager+jemalloc]
//                                    [--no-malloc-tuning] [--profile PATH]
//
// Model (fixed, stated): 9 blocks, hidden 256, 4 heads, 2 KV heads, head_dim 64, intermediate 768,
// vocab 256 (the byte tokenizer's ids; --vocab 151936 for Qwen3's), tied embeddings, pre-norm,
// fp32. Loss: CE over the full vocabulary on next-token targets (T-1 per sequence).
// Kernels: --kernels as student.cpu_kernels (default auto: each fusable step runs fused or as
// LibTorch's op sequence, whichever measured faster here; the choices and timings are printed).
// Baselines (--baselines; bench/baseline_variants.h): transformers eager under glibc malloc's defaults
// and under its hugetlb tunable, tcmalloc and jemalloc where installed; "compile" variants on request
// (torch.compile of the forward + loss; minutes of compiling in the warm-up). At --vocab 151936 the
// logits and their gradient are [N, V] fp32 tensors (1.2 GB at 8 x 256 tokens) that glibc's defaults
// fault in afresh every step: the ratio that counts is against the fastest variant, printed with each.
// Method: after warm-up, deepen's step and each baseline's alternate one by one (each baseline is a
// child process answering "step" requests), so all see the same load on a shared machine; each side
// reports its median step; the ratios are of the medians (wall time; the CPU time each side spent per
// step is printed beside it, which a loaded machine distorts less). Python runs with the environment
// this process has, plus its variant's, plus --python-env. Each side's step times are printed in order,
// so the spread shows.
// --profile PATH: one step of each side profiled instead (deepen's trace at PATH, each variant's
// torch.profiler trace at PATH.<variant>.transformers.json), for an op-by-op comparison.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <nlohmann/json.hpp>

#include "bench/median.h"
#include "bench/baseline_variants.h"
#include "model/student.h"
#include "model/student_io.h"
#include "tests/test_paths.h"
#include "train/compute_threads.h"
#include "train/large_buffer_allocator.h"

using deepen::median;

namespace {

struct Options {
  int64_t threads = 2, batch = 8, seq = 256, steps = 10, warmup = 2, vocab = 256;
  bool baseline = true;
  bool malloc_tuning = true;
  std::string kernels = "auto";
  std::string norm = "pre";
  std::vector<std::string> python_env;
  std::string profile;
  std::string baselines = "eager,eager+hugetlb,eager+tcmalloc,eager+jemalloc";
};

// Same formula as the Python side: ids[b, t] = (b * 131 + t * 17 + (b * t) % 7) % vocab.
at::Tensor bench_ids(int64_t batch, int64_t seq, int64_t vocab) {
  const at::Tensor b = at::arange(batch, at::kLong).unsqueeze(1);
  const at::Tensor t = at::arange(seq, at::kLong).unsqueeze(0);
  return (b * 131 + t * 17 + (b * t).remainder(7)).remainder(vocab);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"student forward+backward tokens/s: deepen vs transformers (Python eager)"};
  app.add_option("--threads", o.threads);
  app.add_option("--batch", o.batch);
  app.add_option("--seq", o.seq);
  app.add_option("--steps", o.steps);
  app.add_option("--warmup", o.warmup);
  app.add_option("--vocab", o.vocab);
  app.add_option("--norm", o.norm, "pre | post (post has no transformers baseline)");
  app.add_option("--python-env", o.python_env, "NAME=VALUE added to every Python baseline's environment");
  app.add_option("--baselines", o.baselines,
                 "transformers variants, comma-separated: eager or compile, then +hugetlb, +tcmalloc, +jemalloc or "
                 "nothing (default: eager,eager+hugetlb,eager+tcmalloc,eager+jemalloc; a malloc not installed is skipped)");
  app.add_flag("!--no-baseline", o.baseline, "skip the Python run");
  app.add_option("--kernels", o.kernels, "auto | fused | aten (the HF op sequence), as student.cpu_kernels");
  bool unfused = false;
  app.add_flag("--unfused", unfused, "same as --kernels aten");
  app.add_option("--profile", o.profile, "write a chrome trace of one deepen step here (and of one step of each transformers variant to PATH.<variant>.transformers.json) and stop");
  app.add_flag("!--no-malloc-tuning", o.malloc_tuning,
               "deepen's side on glibc malloc's defaults (else deepen's large-buffer allocator, as the deepen binary)");
  CLI11_PARSE(app, argc, argv);
  if (unfused) o.kernels = "aten";
  // A Python child that has already exited (--profile) must not kill us when told "quit".
  std::signal(SIGPIPE, SIG_IGN);
  // As the deepen binary: large buffers kept mapped and reused (train/large_buffer_allocator.h).
  if (o.malloc_tuning) deepen::install_large_buffer_allocator();
  deepen::set_compute_threads(o.threads);

  deepen::StudentSpec spec;
  spec.decoder = deepen::DecoderSpec{.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 64,
                                     .intermediate = 768, .rope_theta = 1e6, .rms_eps = 1e-6};
  spec.decoder.cpu_kernels = deepen::parse_option<deepen::CpuKernels>(o.kernels, "--kernels");
  spec.vocab_size = o.vocab;
  spec.max_depth = 9;
  spec.norm = deepen::parse_option<deepen::NormPlacement>(o.norm, "--norm");
  spec.tie_embeddings = true;
  deepen::GrowableStudent student(spec, 9, 1);
  const at::Tensor ids = bench_ids(o.batch, o.seq, o.vocab);
  const at::Tensor targets = ids.slice(1, 1).reshape({-1});

  auto step = [&] {
    const at::Tensor logits = student.forward(ids);
    const at::Tensor loss =
        at::cross_entropy_loss(logits.slice(1, 0, o.seq - 1).reshape({-1, o.vocab}), targets);
    loss.backward();
    for (auto& p : student.parameters()) p.mutable_grad() = at::Tensor();
    return loss.item<double>();
  };
  // Wall and CPU time (all of this process's threads) of one step.
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
  };
  auto timed_step = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_ms();
    step();
    return std::pair{std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                     cpu_ms() - c0};
  };

  std::printf("student: 9 layers, hidden 256, heads 4/2 kv, head_dim 64, intermediate 768, vocab %ld, "
              "tied, %s-norm, fp32; batch %ld x seq %ld = %ld tokens/step; %ld threads; %ld timed steps "
              "each after %ld warm-up; deepen large-buffer allocator %s, CPU kernels %s\n",
              long(o.vocab), o.norm.c_str(), long(o.batch), long(o.seq), long(o.batch * o.seq),
              long(o.threads), long(o.steps), long(o.warmup), o.malloc_tuning ? "on" : "off",
              o.kernels.c_str());
  const double first_loss = step();
  for (const deepen::StepCalibration& c : deepen::process_cpu_kernel_calibration().measurements())
    std::printf("  auto: %-13s rows %5ld (timed on %5ld), %ld threads: fused %7.2f ms, ops %7.2f ms -> %s\n",
                deepen::fused_step_name(c.shape.step), long(c.shape.rows), long(c.calibration_rows),
                long(c.shape.threads), c.fused_ms, c.ops_ms, c.fused ? "fused" : "ops");
  for (int64_t i = 1; i < o.warmup; ++i) step();
  if (!o.profile.empty()) {
    torch::autograd::profiler::RecordProfile guard(o.profile);
    step();
  }
  const bool baseline = o.baseline && spec.norm == deepen::NormPlacement::kPre;

  // One child per variant, started one after another (each warms up before the next starts).
  struct Run {
    deepen::bench::BaselineVariant spec;
    std::unique_ptr<deepen::bench::PythonChild> child;
    double first_loss = 0, peak_rss = 0;
    std::vector<double> ms, cpu_ms;
  };
  std::vector<Run> runs;
  const auto dir = std::filesystem::temp_directory_path() / ("deepen_bench_" + std::to_string(::getpid()));
  try {
    if (baseline) {
      deepen::export_student_hf(student, (dir / "hf").string());
      for (const deepen::bench::BaselineVariant& v : deepen::bench::parse_baseline_variants(o.baselines)) {
        std::vector<std::string> argv{deepen::test::kPython,
                                      std::string(deepen::test::kSourceDir) + "/bench/student_step_bench.py",
                                      "--model", (dir / "hf").string(), "--batch", std::to_string(o.batch),
                                      "--seq", std::to_string(o.seq), "--warmup", std::to_string(o.warmup),
                                      "--threads", std::to_string(o.threads)};
        // --profile: the same step profiled on the Python side too, so the traces compare op by op.
        if (!o.profile.empty()) argv.insert(argv.end(), {"--profile", o.profile + "." + v.name + ".transformers.json"});
        else argv.push_back("--serve");
        nlohmann::json ready;
        auto child = deepen::bench::start_baseline(v, argv, o.python_env, dir / (v.name + ".stderr"), &ready);
        if (!child) continue;
        std::printf("baseline %s: %s\n", v.name.c_str(), v.setting.c_str());
        std::fflush(stdout);
        runs.push_back(Run{v, std::move(child), ready.at("first_loss").get<double>(), 0, {}, {}});
      }
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "student_step_bench: %s\n", e.what());
    return 2;
  }
  if (!o.profile.empty()) {
    std::printf("traces: %s (deepen)", o.profile.c_str());
    for (const Run& r : runs) std::printf(", %s.%s.transformers.json", o.profile.c_str(), r.spec.name.c_str());
    std::printf("\n");
    runs.clear();
    std::filesystem::remove_all(dir);
    return 0;
  }
  std::vector<double> deepen_ms, deepen_cpu_ms;
  for (int64_t i = 0; i < o.steps; ++i) {
    const auto [wall, cpu] = timed_step();
    deepen_ms.push_back(wall);
    deepen_cpu_ms.push_back(cpu);
    for (Run& r : runs) {
      if (!r.child) continue;
      const bool stepped = deepen::bench::baseline_step(r.spec, r.child, i + 1, dir / (r.spec.name + ".stderr"),
                                                        [&](const nlohmann::json& answer) {
        const double ms = answer.at("ms").get<double>(), cpu = answer.at("cpu_ms").get<double>();
        r.peak_rss = answer.at("peak_rss").get<double>();
        r.ms.push_back(ms);
        r.cpu_ms.push_back(cpu);
      });
      if (!stepped) r.ms.clear();
    }
  }
  for (Run& r : runs) r.child.reset();
  std::erase_if(runs, [](const Run& r) { return r.ms.empty(); });
  std::filesystem::remove_all(dir);

  // Every step, in the order run: on a loaded machine single steps swing by several times, and a
  // ratio of medians is only worth what the spread around it shows.
  auto print_steps = [](const std::string& who, const std::vector<double>& ms) {
    std::printf("%-24s steps ms:", who.c_str());
    for (double m : ms) std::printf(" %.1f", m);
    std::printf("\n");
  };
  print_steps("deepen", deepen_ms);
  for (const Run& r : runs) print_steps("transformers " + r.spec.name, r.ms);
  print_steps("deepen cpu", deepen_cpu_ms);
  for (const Run& r : runs) print_steps("transformers " + r.spec.name + " cpu", r.cpu_ms);
  const double tokens = static_cast<double>(o.batch * o.seq);
  const double deepen_tps = tokens / (median(deepen_ms) / 1e3);
  std::printf("deepen (C++ LibTorch):       %8.0f tokens/s  (median step %7.1f ms, CPU %7.1f ms, first loss %.6f)\n",
              deepen_tps, median(deepen_ms), median(deepen_cpu_ms), first_loss);
  if (!baseline) return 0;
  const Run* fastest = nullptr;
  for (const Run& r : runs) {
    std::printf("transformers %-15s %8.0f tokens/s  (median step %7.1f ms, CPU %7.1f ms, first loss %.6f, peak RSS %.2f GB)\n",
                (r.spec.name + ":").c_str(), tokens / (median(r.ms) / 1e3), median(r.ms), median(r.cpu_ms), r.first_loss,
                r.peak_rss / 1e9);
    if (!fastest || median(r.ms) < median(fastest->ms)) fastest = &r;
  }
  // CPU time is what each side computed, less what it waited for a core: on a loaded machine it
  // moves far less than wall time (with 1 thread; more threads add OpenMP's spin-waits to it).
  for (const Run& r : runs)
    std::printf("ratio deepen / transformers %s: %.2fx (ratio of CPU time per step, transformers / deepen: %.2fx)\n",
                r.spec.name.c_str(), median(r.ms) / median(deepen_ms), median(r.cpu_ms) / median(deepen_cpu_ms));
  if (fastest)
    std::printf("ratio deepen / fastest transformers (%s): %.2fx\n", fastest->spec.name.c_str(),
                median(fastest->ms) / median(deepen_ms));
  else
    std::printf("no baseline ran: no ratio\n");
  return 0;
}
