// One whole distillation step at Qwen3's vocabulary, deepen against the same step written plainly in
// PyTorch + transformers (bench/kd_step_bench.py), measured side by side in one run.
//
//   build-x/bench/kd_step_bench [--threads 2] [--batch 4] [--seq 256] [--steps 6] [--warmup 2]
//                               [--alpha 0.7] [--tau 1] [--row-chunk 0] [--targets logits|hidden]
//                               [--teacher DIR] [--profile PATH]
//
// Step (both sides): teacher forward (no grad), student forward, α·τ²·KL + (1 − α)·CE over the full
// vocabulary, backward, global-norm clip (1.0), AdamW (lr 3e-4, betas 0.9/0.95, decay 0.1 on
// matrices). deepen: TeacherStage + GrowableStudent + distill_loss with a DistillLossWorkspace, as
// Trainer::train_step runs them (one micro-batch); Python: Qwen3ForCausalLM teacher under no_grad,
// Qwen3ForCausalLM student, log_softmax KL (kl_div, batchmean) + cross_entropy on [N, V] logits,
// clip_grad_norm_, torch.optim.AdamW.
// Models (fixed, stated): a random Qwen3 teacher (scripts/random_qwen3.py: 4 layers x hidden 256, 4/2
// heads x 64, intermediate 768, V = 151,936, bf16 on disk, run in fp32 on both sides), and a
// 3-layer x 256 untied student of the same widths, random (deepen's init, exported to HF for the
// Python side: both start from the same weights). Tokens: the bench ids of student_step_bench; labels
// the next token, each sequence's last position taking its first (every position counts).
// --targets hidden: deepen's teacher runs without its head and the loss makes the teacher's logits
// chunk by chunk (distill.logits = "hidden" in one process); the baseline stays the same.
// Method as student_step_bench: after warm-up, deepen and Python steps alternate one by one, so both
// see the same load on a shared machine; each side's median step gives its tokens/s; every step's
// time is printed, and deepen's time by part (teacher, forward+loss, backward, clip+AdamW).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>

#include "bench/median.h"
#include "bench/python_child.h"
#include "model/student.h"
#include "model/student_io.h"
#include "model/teacher_stage.h"
#include "tests/test_paths.h"
#include "train/adamw.h"
#include "train/compute_threads.h"
#include "train/distill_loss.h"
#include "train/large_buffer_allocator.h"

using deepen::median;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t threads = 2, batch = 4, seq = 256, steps = 6, warmup = 2, vocab = 151936;
  int64_t teacher_layers = 4, student_layers = 3, row_chunk = 0;
  double alpha = 0.7, tau = 1.0, lr = 3e-4, grad_clip = 1.0;
  std::string targets = "logits", kernels = "auto", teacher, profile;
  bool baseline = true;
  bool malloc_only = false;  // LibTorch's default allocator for deepen's side, not the large-buffer one
  std::vector<std::string> python_env;
};

at::Tensor bench_ids(int64_t batch, int64_t seq, int64_t vocab) {
  const at::Tensor b = at::arange(batch, at::kLong).unsqueeze(1);
  const at::Tensor t = at::arange(seq, at::kLong).unsqueeze(0);
  return (b * 131 + t * 17 + (b * t).remainder(7)).remainder(vocab);
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

int run(const Options& o) {
  namespace fs = std::filesystem;
  if (!o.malloc_only) deepen::install_large_buffer_allocator();
  deepen::set_compute_threads(o.threads);
  const fs::path dir = fs::temp_directory_path() / ("deepen_kd_bench_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string teacher_dir = o.teacher;
  if (teacher_dir.empty()) {
    teacher_dir = (dir / "teacher").string();
    const std::string cmd = std::string(deepen::test::kPython) + " " + deepen::test::kSourceDir +
                            "/scripts/random_qwen3.py " + teacher_dir + " --layers " + std::to_string(o.teacher_layers) +
                            " --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 768 --vocab " +
                            std::to_string(o.vocab) + " > /dev/null";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  }
  const bool hidden_targets = std::map<std::string, bool>{{"logits", false}, {"hidden", true}}.at(o.targets);
  const int layers = static_cast<int>(o.teacher_layers);
  auto teacher = deepen::TeacherStage::load(teacher_dir, 0, layers, true, true, at::kFloat, at::kCPU,
                                            deepen::CpuKernels::kAuto, !hidden_targets);
  const at::Tensor teacher_head = hidden_targets ? deepen::load_teacher_head(teacher_dir, at::kFloat) : at::Tensor();

  deepen::StudentSpec spec;
  spec.decoder = deepen::DecoderSpec{.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 64, .intermediate = 768,
                                     .rope_theta = 1e6, .rms_eps = 1e-6};
  spec.decoder.cpu_kernels = deepen::parse_option<deepen::CpuKernels>(o.kernels, "--kernels");
  spec.vocab_size = o.vocab;
  spec.max_depth = o.student_layers;
  spec.norm = deepen::NormPlacement::kPre;
  spec.tie_embeddings = false;
  deepen::GrowableStudent student(spec, o.student_layers, 1);
  deepen::AdamW opt(deepen::AdamWOptions{.weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  for (const auto& [name, p] : student.named_trainable_parameters()) opt.add(name, p);

  const at::Tensor ids = bench_ids(o.batch, o.seq, o.vocab);
  const at::Tensor labels = at::roll(ids, {-1}, {1}).reshape({-1});
  deepen::DistillLossOptions lo;
  lo.alpha = o.alpha;
  lo.temperature = o.tau;
  lo.row_chunk = o.row_chunk;
  lo.kernels = spec.decoder.cpu_kernels;
  deepen::DistillLossWorkspace workspace;

  // Before any step: the Python side starts from these weights.
  if (o.baseline) deepen::export_student_hf(student, (dir / "student").string());

  struct Parts {
    double teacher = 0, forward_loss = 0, backward = 0, optimizer = 0;
    double cpu[4] = {0, 0, 0, 0};  // the same parts' process CPU time: below 2x wall, a part runs on fewer threads
  };
  struct First {
    double loss = 0, kl = 0, ce = 0;
  };
  auto step = [&](Parts* parts) {
    const auto t0 = Clock::now();
    const double c0 = cpu_ms();
    deepen::TeacherTargets targets;
    {
      at::Tensor out = teacher->forward(ids);
      out = out.reshape({-1, out.size(-1)});
      targets = hidden_targets ? deepen::TeacherTargets::from_hidden(out, teacher_head) : deepen::TeacherTargets::full(out);
    }
    const auto t1 = Clock::now();
    const double c1 = cpu_ms();
    const at::Tensor hidden = student.forward_hidden(ids);
    const deepen::DistillLoss l = deepen::distill_loss(hidden, student.head_parameter(), targets, labels, lo, &workspace);
    const auto t2 = Clock::now();
    const double c2 = cpu_ms();
    l.loss.backward();
    const auto t3 = Clock::now();
    const double c3 = cpu_ms();
    // Trainer::clip_gradients and AdamW, as one student's step without data parallelism.
    std::vector<at::Tensor> grads;
    for (const auto& [name, p] : student.named_trainable_parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
    const double norm = std::sqrt(deepen::sum_of_squares(grads));
    if (o.grad_clip > 0 && norm > o.grad_clip)
      for (const auto& g : grads) g.mul_(o.grad_clip / (norm + 1e-6));
    opt.step(o.lr);
    opt.zero_grad();
    if (parts) {
      parts->teacher = std::chrono::duration<double, std::milli>(t1 - t0).count();
      parts->forward_loss = std::chrono::duration<double, std::milli>(t2 - t1).count();
      parts->backward = std::chrono::duration<double, std::milli>(t3 - t2).count();
      parts->optimizer = ms_since(t3);
      const double c4 = cpu_ms();
      const double c[5] = {c0, c1, c2, c3, c4};
      for (int k = 0; k < 4; ++k) parts->cpu[k] = c[k + 1] - c[k];
    }
    return First{l.loss.item<double>(), l.kl.item<double>(), l.ce.item<double>()};
  };

  const int64_t tokens = o.batch * o.seq;
  std::printf("kd step: teacher %ld layers x 256, student %ld layers x 256 untied, V = %ld, %ld x %ld = %ld tokens, "
              "alpha %g, tau %g, %s targets, fp32, %ld threads; deepen loss: row_chunk %ld (0 = auto), CPU kernels %s; "
              "%ld timed steps each after %ld warm-up\n",
              long(o.teacher_layers), long(o.student_layers), long(o.vocab), long(o.batch), long(o.seq), long(tokens),
              o.alpha, o.tau, hidden_targets ? "hidden-state" : "full-logit", long(o.threads), long(o.row_chunk), o.kernels.c_str(), long(o.steps), long(o.warmup));
  const First first = step(nullptr);
  for (int64_t i = 1; i < o.warmup; ++i) step(nullptr);

  std::unique_ptr<deepen::bench::PythonChild> python;
  nlohmann::json py_first;
  if (o.baseline) {
    std::vector<std::string> argv{deepen::test::kPython, std::string(deepen::test::kSourceDir) + "/bench/kd_step_bench.py",
                                  "--teacher", teacher_dir, "--student", (dir / "student").string(),
                                  "--batch", std::to_string(o.batch), "--seq", std::to_string(o.seq),
                                  "--alpha", std::to_string(o.alpha), "--tau", std::to_string(o.tau),
                                  "--lr", std::to_string(o.lr), "--grad-clip", std::to_string(o.grad_clip),
                                  "--warmup", std::to_string(o.warmup), "--threads", std::to_string(o.threads)};
    if (!o.profile.empty()) argv.insert(argv.end(), {"--profile", o.profile + ".pytorch.json"});
    else argv.push_back("--serve");
    python = std::make_unique<deepen::bench::PythonChild>(argv, o.python_env);
    py_first = python->read().at("first");
  }
  if (!o.profile.empty()) {
    {
      torch::autograd::profiler::RecordProfile guard(o.profile);
      step(nullptr);
    }
    python.reset();
    fs::remove_all(dir);
    std::printf("traces: %s (deepen)%s\n", o.profile.c_str(), o.baseline ? (", " + o.profile + ".pytorch.json").c_str() : "");
    return 0;
  }

  std::vector<double> d_ms, d_cpu, p_ms, p_cpu;
  std::vector<Parts> d_parts;
  std::vector<nlohmann::json> p_parts;
  for (int64_t i = 0; i < o.steps; ++i) {
    Parts parts;
    const auto t0 = Clock::now();
    const double c0 = cpu_ms();
    step(&parts);
    d_ms.push_back(ms_since(t0));
    d_cpu.push_back(cpu_ms() - c0);
    d_parts.push_back(parts);
    if (python) {
      const nlohmann::json answer = python->request("step");
      p_ms.push_back(answer.at("ms").get<double>());
      p_cpu.push_back(answer.at("cpu_ms").get<double>());
      p_parts.push_back(answer.at("parts_ms"));
    }
  }
  python.reset();
  fs::remove_all(dir);

  auto print_steps = [](const char* who, const std::vector<double>& ms) {
    std::printf("%s", who);
    for (double m : ms) std::printf(" %.0f", m);
    std::printf("\n");
  };
  print_steps("deepen  steps ms:", d_ms);
  if (!p_ms.empty()) print_steps("pytorch steps ms:", p_ms);
  auto part_median = [&](auto get) {
    std::vector<double> v;
    for (const Parts& p : d_parts) v.push_back(get(p));
    return median(v);
  };
  std::printf("deepen  median parts ms: teacher %.0f, forward+loss %.0f, backward %.0f, clip+AdamW %.0f; loss workspace %.0f MiB\n",
              part_median([](const Parts& p) { return p.teacher; }), part_median([](const Parts& p) { return p.forward_loss; }),
              part_median([](const Parts& p) { return p.backward; }), part_median([](const Parts& p) { return p.optimizer; }),
              static_cast<double>(workspace.bytes()) / (1 << 20));
  std::printf("deepen  median parts CPU ms: teacher %.0f, forward+loss %.0f, backward %.0f, clip+AdamW %.0f\n",
              part_median([](const Parts& p) { return p.cpu[0]; }), part_median([](const Parts& p) { return p.cpu[1]; }),
              part_median([](const Parts& p) { return p.cpu[2]; }), part_median([](const Parts& p) { return p.cpu[3]; }));
  if (!p_parts.empty()) {
    auto py_part = [&](const char* key) {
      std::vector<double> v;
      for (const auto& j : p_parts) v.push_back(j.at(key).get<double>());
      return median(v);
    };
    std::printf("pytorch median parts ms: teacher %.0f, forward+loss %.0f, backward %.0f, clip+AdamW %.0f\n",
                py_part("teacher"), py_part("forward_loss"), py_part("backward"), py_part("optimizer"));
    auto py_cpu = [&](size_t k) {
      std::vector<double> v;
      for (const auto& j : p_parts) v.push_back(j.at("cpu").at(k).get<double>());
      return median(v);
    };
    std::printf("pytorch median parts CPU ms: teacher %.0f, forward+loss %.0f, backward %.0f, clip+AdamW %.0f\n", py_cpu(0),
                py_cpu(1), py_cpu(2), py_cpu(3));
  }
  const double d_tps = static_cast<double>(tokens) / (median(d_ms) / 1e3);
  std::printf("deepen (C++ LibTorch):  %7.0f tokens/s  (median step %7.0f ms, CPU %7.0f ms; first step loss %.6f kl %.6f ce %.6f)\n",
              d_tps, median(d_ms), median(d_cpu), first.loss, first.kl, first.ce);
  if (!python && p_ms.empty()) return 0;
  const double p_tps = static_cast<double>(tokens) / (median(p_ms) / 1e3);
  std::printf("plain PyTorch (eager):  %7.0f tokens/s  (median step %7.0f ms, CPU %7.0f ms; first step loss %.6f kl %.6f ce %.6f)\n",
              p_tps, median(p_ms), median(p_cpu), py_first.at("loss").get<double>(), py_first.at("kl").get<double>(),
              py_first.at("ce").get<double>());
  std::printf("ratio deepen / plain PyTorch: %.2fx (CPU time per step, PyTorch / deepen: %.2fx)\n", d_tps / p_tps,
              median(p_cpu) / median(d_cpu));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"one distillation step at V = 151,936: deepen vs plain PyTorch + transformers, tokens/s"};
  app.add_option("--threads", o.threads);
  app.add_option("--batch", o.batch);
  app.add_option("--seq", o.seq);
  app.add_option("--steps", o.steps);
  app.add_option("--warmup", o.warmup);
  app.add_option("--vocab", o.vocab);
  app.add_option("--teacher-layers", o.teacher_layers);
  app.add_option("--student-layers", o.student_layers);
  app.add_option("--alpha", o.alpha);
  app.add_option("--tau", o.tau);
  app.add_option("--row-chunk", o.row_chunk, "distill.row_chunk (0 = auto)");
  app.add_option("--targets", o.targets, "logits (full) | hidden (the teacher's hidden states and head)")
      ->check(CLI::IsMember({"logits", "hidden"}));
  app.add_option("--kernels", o.kernels, "auto | fused | aten, as student.cpu_kernels");
  app.add_option("--teacher", o.teacher, "a Qwen3 HF folder of these shapes (default: made with scripts/random_qwen3.py)");
  app.add_option("--python-env", o.python_env, "NAME=VALUE added to the Python baseline's environment");
  app.add_flag("!--no-baseline", o.baseline, "skip the Python side");
  app.add_flag("--malloc", o.malloc_only, "deepen's side on LibTorch's default allocator (glibc malloc), not the large-buffer allocator the deepen binary installs");
  app.add_option("--profile", o.profile, "chrome traces of one step: deepen's at PATH, PyTorch's at PATH.pytorch.json");
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kd_step_bench: %s\n", e.what());
    return 1;
  }
}
