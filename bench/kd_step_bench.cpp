// One whole distillation step at Qwen3's vocabulary, deepen against the same step written plainly in
// PyTorch + transformers (bench/kd_step_bench.py) at its best, and against the step's GEMM bound, in one run.
//
//   build-x/bench/kd_step_bench [--threads 2] [--batch 4] [--seq 256] [--steps 6] [--warmup 2]
//                               [--alpha 0.7] [--tau 1] [--row-chunk 0] [--targets logits|hidden]
//                               [--baselines eager,eager+hugetlb,compile+hugetlb,compile+tcmalloc | all]
//                               [--no-bound] [--teacher DIR] [--profile PATH]
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
//
// Baselines, each its own Python child (--baselines; by default eager and eager+hugetlb,
// compile+hugetlb and compile+tcmalloc, the four that fit in 24 GB beside deepen): a variant is
// "eager" or "compile" (torch.compile of the teacher forward, the student forward + loss and the clip
// + AdamW step, compiled in the warm-up), then "+hugetlb" (GLIBC_TUNABLES=glibc.malloc.hugetlb=1:
// glibc asks for transparent huge pages on its mmap'd chunks, so each [N, V] fp32 tensor, 622 MB, is
// faulted in 2 MB pages instead of 4 KB ones), "+tcmalloc" or "+jemalloc" (LD_PRELOAD of the
// library, skipped with a note where it is not installed), or nothing (glibc's defaults). Why several:
// a plain PyTorch user can set any of these without writing code, so the ratio that counts is against
// the fastest; each one's is printed too.
// Method as student_step_bench: after warm-up, deepen's step and each baseline's alternate one by one
// (deepen, A, B, ..., deepen, A, ...), so all see the same load on a shared machine; each side's
// median step gives its tokens/s (with --steps 3, the median of three alternated steps); every step's
// time is printed, and each side's time by part (teacher, forward+loss, backward, clip+AdamW).
// First-step loss, KL and CE of every baseline must equal deepen's within 1e-5 relative (printed).
// Bound (bench/step_bound.h): the step's GEMMs timed with at::mm at their shapes and AdamW's bytes over
// a measured bandwidth, after the alternated steps, in this process at --threads; deepen's median step
// is printed as a share of it ("x% of the bound", as MFU is on a GPU) and part by part.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
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
#include "bench/baseline_variants.h"
#include "bench/machine_load.h"
#include "bench/step_bound.h"
#include "model/student.h"
#include "model/student_io.h"
#include "model/teacher_stage.h"
#include "tests/test_paths.h"
#include "train/adamw.h"
#include "train/compute_threads.h"
#include "train/distill_loss.h"
#include "train/large_buffer_allocator.h"

using deepen::median;
using deepen::bench::BaselineVariant;

namespace {

using Clock = std::chrono::steady_clock;

// The variants run by default: the fastest of each kind on the developers' machine, and four
// children beside deepen fit in 24 GB (with six, one was killed for memory).
constexpr const char* kDefaultBaselines = "eager,eager+hugetlb,compile+hugetlb,compile+tcmalloc";
// Every variant this bench knows (--baselines all).
constexpr const char* kAllBaselines =
    "eager,eager+hugetlb,eager+tcmalloc,eager+jemalloc,compile,compile+hugetlb,compile+tcmalloc,compile+jemalloc";
// First-step loss, KL and CE: a baseline agrees with deepen when each is within this relative distance.
constexpr double kLossTolerance = 1e-5;

struct Options {
  int64_t threads = 2, batch = 4, seq = 256, steps = 6, warmup = 2, vocab = 151936;
  int64_t teacher_layers = 4, student_layers = 3, row_chunk = 0;
  double alpha = 0.7, tau = 1.0, lr = 3e-4, grad_clip = 1.0;
  std::string targets = "logits", kernels = "auto", teacher, profile, baselines = kDefaultBaselines;
  bool baseline = true, bound = true;
  bool malloc_only = false;  // LibTorch's default allocator for deepen's side, not the large-buffer one
  int bound_reps = 3;
  std::vector<std::string> python_env;
};

at::Tensor bench_ids(int64_t batch, int64_t seq, int64_t vocab) {
  const at::Tensor b = at::arange(batch, at::kLong).unsqueeze(1);
  const at::Tensor t = at::arange(seq, at::kLong).unsqueeze(0);
  return (b * 131 + t * 17 + (b * t).remainder(7)).remainder(vocab);
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024;
}

// Median of each step part (teacher, forward+loss, backward, clip+AdamW) over the timed steps.
struct Parts {
  double ms[4] = {0, 0, 0, 0};
  double cpu[4] = {0, 0, 0, 0};  // the same parts' process CPU time: below threads x wall, a part runs on fewer threads
};
Parts median_parts(const std::vector<Parts>& steps) {
  Parts m;
  for (int k = 0; k < 4; ++k) {
    std::vector<double> w, c;
    for (const Parts& p : steps) {
      w.push_back(p.ms[k]);
      c.push_back(p.cpu[k]);
    }
    m.ms[k] = median(w);
    m.cpu[k] = median(c);
  }
  return m;
}
void print_parts(const char* who, const Parts& p, const std::string& extra = "") {
  std::printf("%-16s median parts ms: teacher %.0f, forward+loss %.0f, backward %.0f, clip+AdamW %.0f%s\n", who, p.ms[0],
              p.ms[1], p.ms[2], p.ms[3], extra.c_str());
  std::printf("%-16s median parts CPU ms: teacher %.0f, forward+loss %.0f, backward %.0f, clip+AdamW %.0f\n", who, p.cpu[0],
              p.cpu[1], p.cpu[2], p.cpu[3]);
}

struct First {
  double loss = 0, kl = 0, ce = 0;
};

// A baseline's child and what it answered.
struct BaselineRun {
  BaselineVariant spec;
  std::unique_ptr<deepen::bench::PythonChild> child;
  std::filesystem::path log;
  nlohmann::json ready;
  std::vector<double> ms, cpu;
  std::vector<Parts> parts;
  std::string failed;  // why it stopped, if it did
  double peak_rss = 0;
  int64_t graphs_timed = 0;  // torch.compile graphs after the last timed step
};

int run(const Options& o) {
  namespace fs = std::filesystem;
  if (!o.malloc_only) deepen::install_large_buffer_allocator();
  deepen::set_compute_threads(o.threads);
  const std::vector<BaselineVariant> baselines =
      o.baseline ? deepen::bench::parse_baseline_variants(o.baselines == "all" ? kAllBaselines : o.baselines)
                 : std::vector<BaselineVariant>{};
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
  int64_t parameters = 0;
  for (const auto& [name, p] : student.named_trainable_parameters()) {
    opt.add(name, p);
    parameters += p.numel();
  }

  const at::Tensor ids = bench_ids(o.batch, o.seq, o.vocab);
  const at::Tensor labels = at::roll(ids, {-1}, {1}).reshape({-1});
  deepen::DistillLossOptions lo;
  lo.alpha = o.alpha;
  lo.temperature = o.tau;
  lo.row_chunk = o.row_chunk;
  lo.kernels = spec.decoder.cpu_kernels;
  deepen::DistillLossWorkspace workspace;

  // Before any step: the Python side starts from these weights.
  if (!baselines.empty()) deepen::export_student_hf(student, (dir / "student").string());

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
      const auto t4 = Clock::now();
      const double c4 = cpu_ms();
      const Clock::time_point t[5] = {t0, t1, t2, t3, t4};
      const double c[5] = {c0, c1, c2, c3, c4};
      for (int k = 0; k < 4; ++k) {
        parts->ms[k] = std::chrono::duration<double, std::milli>(t[k + 1] - t[k]).count();
        parts->cpu[k] = c[k + 1] - c[k];
      }
    }
    return First{l.loss.item<double>(), l.kl.item<double>(), l.ce.item<double>()};
  };

  const int64_t tokens = o.batch * o.seq;
  std::printf("kd step: teacher %ld layers x 256, student %ld layers x 256 untied, V = %ld, %ld x %ld = %ld tokens, "
              "alpha %g, tau %g, %s targets, fp32, %ld threads; deepen loss: row_chunk %ld (0 = auto), CPU kernels %s; "
              "%ld timed steps each after %ld warm-up\n",
              long(o.teacher_layers), long(o.student_layers), long(o.vocab), long(o.batch), long(o.seq), long(tokens),
              o.alpha, o.tau, hidden_targets ? "hidden-state" : "full-logit", long(o.threads), long(o.row_chunk), o.kernels.c_str(), long(o.steps), long(o.warmup));
  std::printf("load average at the start: %s\n", deepen::bench::load_average().c_str());
  const First first = step(nullptr);
  for (int64_t i = 1; i < o.warmup; ++i) step(nullptr);

  // One child per baseline, started one after another (each warms up, a compiled one compiles, before
  // the next starts: their warm-ups do not overlap one another's).
  std::vector<BaselineRun> runs;
  for (const BaselineVariant& b : baselines) {
    BaselineRun r{b, nullptr, dir / (b.name + ".stderr"), {}, {}, {}, {}, "", 0, 0};
    std::vector<std::string> argv{deepen::test::kPython, std::string(deepen::test::kSourceDir) + "/bench/kd_step_bench.py",
                                  "--teacher", teacher_dir, "--student", (dir / "student").string(),
                                  "--batch", std::to_string(o.batch), "--seq", std::to_string(o.seq),
                                  "--alpha", std::to_string(o.alpha), "--tau", std::to_string(o.tau),
                                  "--lr", std::to_string(o.lr), "--grad-clip", std::to_string(o.grad_clip),
                                  "--warmup", std::to_string(o.warmup), "--threads", std::to_string(o.threads)};
    if (!o.profile.empty()) argv.insert(argv.end(), {"--profile", o.profile + "." + b.name + ".pytorch.json"});
    else argv.push_back("--serve");
    const auto t0 = Clock::now();
    r.child = deepen::bench::start_baseline(b, argv, o.python_env, r.log, &r.ready);
    if (!r.child) continue;
    std::printf("baseline %s (%s): ready after %.0f s", b.name.c_str(), b.setting.c_str(), ms_since(t0) / 1e3);
    if (b.compile) {
      const nlohmann::json& c = r.ready.at("compile");
      std::printf("; torch.compile: %d graphs, %d graph breaks, compiled in the warm-up (%.0f s), fallbacks to eager: %s",
                  c.at("graphs").get<int>(), c.at("graph_breaks").get<int>(), c.at("warmup_s").get<double>(),
                  c.at("fallbacks").empty() ? "none" : c.at("fallbacks").dump().c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
    runs.push_back(std::move(r));
  }
  if (!o.profile.empty()) {
    {
      torch::autograd::profiler::RecordProfile guard(o.profile);
      step(nullptr);
    }
    std::printf("traces: %s (deepen)", o.profile.c_str());
    for (const BaselineRun& r : runs) std::printf(", %s.%s.pytorch.json", o.profile.c_str(), r.spec.name.c_str());
    std::printf("\n");
    runs.clear();
    fs::remove_all(dir);
    return 0;
  }

  std::vector<double> d_ms, d_cpu;
  std::vector<Parts> d_parts;
  // deepen's page faults and large-buffer mappings over its timed steps: what the allocator saves.
  int64_t faults = 0;
  const deepen::LargeBufferStats buffers_before = deepen::large_buffer_stats();
  for (int64_t i = 0; i < o.steps; ++i) {
    Parts parts;
    const auto t0 = Clock::now();
    const double c0 = cpu_ms();
    const int64_t f0 = minor_faults();
    step(&parts);
    faults += minor_faults() - f0;
    d_ms.push_back(ms_since(t0));
    d_cpu.push_back(cpu_ms() - c0);
    d_parts.push_back(parts);
    for (BaselineRun& r : runs) {
      if (!r.child) continue;
      deepen::bench::baseline_step(r.spec, r.child, i + 1, r.log, [&](const nlohmann::json& answer) {
        Parts p;
        const nlohmann::json& j = answer.at("parts_ms");
        const char* keys[4] = {"teacher", "forward_loss", "backward", "optimizer"};
        for (int k = 0; k < 4; ++k) {
          p.ms[k] = j.at(keys[k]).get<double>();
          p.cpu[k] = j.at("cpu").at(k).get<double>();
        }
        const double ms = answer.at("ms").get<double>(), cpu = answer.at("cpu_ms").get<double>();
        r.peak_rss = answer.at("peak_rss").get<double>();
        r.graphs_timed = answer.at("graphs").get<int64_t>();
        r.ms.push_back(ms);
        r.cpu.push_back(cpu);
        r.parts.push_back(p);
      }, &r.failed);
    }
  }
  const double deepen_peak_rss = peak_rss_bytes();
  std::printf("load average after the timed steps: %s\n", deepen::bench::load_average().c_str());
  for (BaselineRun& r : runs) r.child.reset();
  std::erase_if(runs, [](const BaselineRun& r) { return !r.failed.empty(); });

  auto print_steps = [](const std::string& who, const std::vector<double>& ms) {
    std::printf("%-16s steps ms:", who.c_str());
    for (double m : ms) std::printf(" %.0f", m);
    std::printf("\n");
  };
  print_steps("deepen", d_ms);
  for (const BaselineRun& r : runs) print_steps(r.spec.name, r.ms);
  char workspace_text[256];
  const deepen::LargeBufferStats buffers_after = deepen::large_buffer_stats();
  std::snprintf(workspace_text, sizeof workspace_text,
                "; loss workspace %.0f MiB; per step %.0f page faults, %.1f large buffers mapped, %.1f reused (%s)",
                static_cast<double>(workspace.bytes()) / (1 << 20), static_cast<double>(faults) / static_cast<double>(o.steps),
                static_cast<double>(buffers_after.maps - buffers_before.maps) / static_cast<double>(o.steps),
                static_cast<double>(buffers_after.reuses - buffers_before.reuses) / static_cast<double>(o.steps),
                o.malloc_only ? "glibc malloc" : "deepen's large-buffer allocator");
  const Parts d_median = median_parts(d_parts);
  print_parts("deepen", d_median, workspace_text);
  for (const BaselineRun& r : runs) print_parts(r.spec.name.c_str(), median_parts(r.parts));

  const double d_step = median(d_ms);
  std::printf("deepen (C++ LibTorch):              %7.0f tokens/s  (median step %7.0f ms, CPU %7.0f ms; first step loss %.6f "
              "kl %.6f ce %.6f; peak RSS %.2f GB)\n",
              static_cast<double>(tokens) / (d_step / 1e3), d_step, median(d_cpu), first.loss, first.kl, first.ce,
              deepen_peak_rss / 1e9);
  const BaselineRun* fastest = nullptr;
  for (const BaselineRun& r : runs) {
    const nlohmann::json& f = r.ready.at("first");
    const double py[3] = {f.at("loss").get<double>(), f.at("kl").get<double>(), f.at("ce").get<double>()};
    const double ours[3] = {first.loss, first.kl, first.ce};
    double worst = 0;
    for (int k = 0; k < 3; ++k) worst = std::max(worst, std::abs(py[k] - ours[k]) / std::max(std::abs(ours[k]), 1e-12));
    std::printf("plain PyTorch %-20s %7.0f tokens/s  (median step %7.0f ms, CPU %7.0f ms; first step loss %.6f kl %.6f "
                "ce %.6f: %s deepen's (%.1e relative); peak RSS %.2f GB)%s\n",
                (r.spec.name + ":").c_str(), static_cast<double>(tokens) / (median(r.ms) / 1e3), median(r.ms), median(r.cpu),
                py[0], py[1], py[2], worst <= kLossTolerance ? "equal to" : "DIFFERENT from", worst, r.peak_rss / 1e9,
                r.spec.compile && r.graphs_timed != r.ready.at("compile").at("graphs").get<int64_t>()
                    ? " [recompiled during the timed steps]"
                    : "");
    if (!fastest || median(r.ms) < median(fastest->ms)) fastest = &r;
  }
  for (const BaselineRun& r : runs)
    std::printf("ratio deepen / %s: %.2fx (CPU time per step, PyTorch / deepen: %.2fx)\n", r.spec.name.c_str(),
                median(r.ms) / d_step, median(r.cpu) / median(d_cpu));
  if (fastest)
    std::printf("ratio deepen / fastest plain PyTorch (%s): %.2fx\n", fastest->spec.name.c_str(), median(fastest->ms) / d_step);
  else if (!baselines.empty())
    std::printf("no baseline ran: no ratio\n");
  fs::remove_all(dir);

  if (!o.bound) return 0;
  deepen::bench::StepShape shape;
  const deepen::Qwen3Config& tc = teacher->config();
  shape.teacher = deepen::ModelShape{"teacher", o.teacher_layers, tc.hidden_size, tc.num_attention_heads,
                                     tc.num_key_value_heads, tc.head_dim, tc.intermediate_size, tc.vocab_size, true};
  shape.student = deepen::ModelShape{"student", o.student_layers, spec.decoder.hidden, spec.decoder.heads,
                                     spec.decoder.kv_heads, spec.decoder.head_dim, spec.decoder.intermediate, o.vocab, false};
  shape.batch = o.batch;
  shape.seq = o.seq;
  if (parameters != deepen::bench::student_parameters(shape))
    std::printf("note: the student has %ld parameters, its shapes give %ld; AdamW's bytes use the student's\n",
                long(parameters), long(deepen::bench::student_parameters(shape)));
  deepen::bench::BoundOptions bo;
  bo.reps = o.bound_reps;
  const deepen::bench::StepBound bound = deepen::bench::measure_step_bound(shape, parameters, bo);
  // Small GEMMs at 2 threads take milliseconds: on a loaded machine a thread waiting for a core
  // stretches each call, so the load they were timed under is printed with them.
  std::printf("load average after the bound: %s\n", deepen::bench::load_average().c_str());
  deepen::bench::print_step_bound(stdout, bound);
  deepen::bench::print_step_against_bound(stdout, "deepen", d_step / 1e3, bound);
  if (fastest) deepen::bench::print_step_against_bound(stdout, ("plain PyTorch " + fastest->spec.name).c_str(),
                                                       median(fastest->ms) / 1e3, bound);
  // deepen's parts against theirs in the bound. The loss makes the head's gradients in its forward,
  // so the student's forward+loss and backward are compared together.
  double teacher_bound = 0, student_bound = 0, adamw_bound = 0;
  for (const auto& [part, sec] : bound.parts()) {
    if (part.rfind("teacher", 0) == 0) teacher_bound += sec;
    else if (part.rfind("student", 0) == 0) student_bound += sec;
    else adamw_bound += sec;
  }
  std::printf("deepen by part, median / bound: teacher %.0f / %.0f ms (%.2fx); student forward+loss+backward %.0f / %.0f ms "
              "(%.2fx); clip+AdamW %.0f / %.0f ms (%.2fx)\n",
              d_median.ms[0], teacher_bound * 1e3, d_median.ms[0] / (teacher_bound * 1e3), d_median.ms[1] + d_median.ms[2],
              student_bound * 1e3, (d_median.ms[1] + d_median.ms[2]) / (student_bound * 1e3), d_median.ms[3],
              adamw_bound * 1e3, d_median.ms[3] / (adamw_bound * 1e3));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"one distillation step at V = 151,936: deepen vs plain PyTorch + transformers at its best, and vs the "
               "step's GEMM bound"};
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
  app.add_option("--baselines", o.baselines,
                 std::string("plain-PyTorch variants, comma-separated, or all (default: ") + kDefaultBaselines +
                     "; those whose malloc is not installed are skipped with a note)");
  app.add_option("--python-env", o.python_env, "NAME=VALUE added to every Python baseline's environment");
  app.add_flag("!--no-baseline", o.baseline, "skip the Python side");
  app.add_flag("--malloc", o.malloc_only, "deepen's side on LibTorch's default allocator (glibc malloc), not the large-buffer allocator the deepen binary installs");
  app.add_flag("!--no-bound", o.bound, "skip measuring the step's GEMM bound");
  app.add_option("--bound-reps", o.bound_reps, "timed calls (at least) per distinct GEMM of the bound");
  app.add_option("--profile", o.profile, "chrome traces of one step: deepen's at PATH, each baseline's at PATH.<variant>.pytorch.json");
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return run(o);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "kd_step_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kd_step_bench: %s\n", e.what());
    return 1;
  }
}
