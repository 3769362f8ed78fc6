// Checks `deepen plan`'s per-rank memory model against the peak resident set of real `deepen
// pretrain` processes on small CPU configs (width, sequence length, recomputation, precision).
//
// Each variant is a fresh `deepen pretrain` process (2 steps, CE only, so the student is all there
// is); its peak RSS comes from wait4's ru_maxrss. The process's own baseline (LibTorch, MPI, the
// shards, the allocator) is measured the same way on a model so small that its memory is a few KB
// (1 layer, hidden 8, 8-token sequences, 1 per micro-batch): measured = peak - baseline. Predicted
// = student_memory() (plan/memory_model.h) for the variant: weights, gradients, AdamW state,
// activations and the loss of one micro-batch. Goal: measured within 20% of predicted.
//
//   build/bench/memory_check                        # DEEPEN=build/deepen, work in /tmp/deepen-memory-check
//   build/bench/memory_check --deepen build/deepen --work /tmp/mc --steps 2
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/tokenizer.h"
#include "model/cpu_kernel_choice.h"
#include "plan/cost_model.h"
#include "plan/memory_model.h"

namespace {
namespace fs = std::filesystem;

struct Variant {
  std::string name;
  std::vector<std::string> sets;  // on top of the base config
};

// Runs `args` (argv[0] = the binary), stdout/stderr to `log`; returns the child's peak RSS in bytes.
int64_t run_peak_rss(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);  // the child must not write our buffered lines again when it reopens stdout
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (!freopen(log.c_str(), "w", stdout) || !freopen(log.c_str(), "a", stderr)) _exit(127);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) throw std::runtime_error("wait4 failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(args[0] + " " + args[1] + " failed (see " + log + ")");
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
}

std::string base_toml(const fs::path& work, int64_t steps) {
  return "[run]\nthreads = 2\ndevice = \"cpu\"\n"
         "[data]\ntokenizer = \"bytes\"\nsources = [\"" + (work / "text.jsonl").string() + "\"]\n"
         "train = \"" + (work / "train").string() + "\"\nvalid = \"" + (work / "valid").string() + "\"\n"
         "valid_fraction = 0.05\n"
         "[student]\ncpu_kernels = \"aten\"\nlayers = 4\nhidden = 128\nheads = 4\nkv_heads = 2\nhead_dim = 32\n"
         "intermediate = 384\ntie_embeddings = false\n"
         "[curriculum]\nmode = \"joint\"\nstages = [4]\nstage_steps = [" + std::to_string(steps) + "]\n"
         "[parallel]\nmicro_batch = 8\n"
         "[eval]\nevery = 100000\nbatches = 1\ndiagnostics_every = 0\ndiagnostic_batch = 1\n"
         "[checkpoint]\nevery = 0\nkeep = 1\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deepen plan's memory model against measured peak RSS of deepen pretrain"};
  std::string deepen = "build/deepen", work = "/tmp/deepen-memory-check";
  int64_t steps = 2;
  app.add_option("--deepen", deepen, "the deepen binary")->capture_default_str();
  app.add_option("--work", work, "scratch folder")->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps per run")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  deepen = fs::absolute(deepen).string();
  const fs::path dir(work);
  fs::create_directories(dir);

  // A corpus of words from a seeded generator, tokenized once (bytes tokenizer).
  const fs::path config = dir / "base.toml";
  std::ofstream(config) << base_toml(dir, steps);
  if (!fs::exists(dir / "train")) {
    // JSONL, one document per line, so the held-out split has documents to take.
    std::ofstream text(dir / "text.jsonl");
    const char* words[] = {"the", "growth", "of", "a", "student", "follows", "teacher", "norm", "block", "layer"};
    std::mt19937 gen(7);
    for (int doc = 0; doc < 2000; ++doc) {
      text << "{\"text\": \"";
      for (int i = 0; i < 300; ++i) text << words[gen() % 10] << ((gen() % 9 == 0) ? ". " : " ");
      text << "\"}\n";
    }
    text.close();
    run_peak_rss({deepen, "prep", config.string(), "--no-progress"}, (dir / "prep.log").string());
  }

  auto run = [&](const std::string& name, const std::vector<std::string>& sets) {
    std::vector<std::string> args = {deepen, "pretrain", config.string(), "--fresh", "--quiet"};
    args.push_back("--set");
    args.push_back("run.out_dir=\"" + (dir / name).string() + "\"");
    for (const auto& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    return run_peak_rss(args, (dir / (name + ".log")).string());
  };

  const std::vector<std::string> tiny = {"student.layers=1", "student.hidden=8", "student.heads=1", "student.kv_heads=1",
                                         "student.head_dim=8", "student.intermediate=8", "curriculum.stages=[1]",
                                         "data.seq_len=8", "parallel.micro_batch=1"};
  const std::vector<Variant> variants = {
      {"h128-seq1024", {"data.seq_len=1024"}},
      {"h128-seq1024-layer", {"data.seq_len=1024", "student.recompute=layer"}},
      {"h128-seq1024-mlp", {"data.seq_len=1024", "student.recompute=mlp"}},
      {"h128-seq2048", {"data.seq_len=2048", "parallel.micro_batch=4"}},
      {"h256-seq512", {"data.seq_len=512", "student.hidden=256", "student.heads=8", "student.kv_heads=4",
                       "student.intermediate=768"}},
      {"h128-seq1024-bf16mixed", {"data.seq_len=1024", "student.precision=bf16-mixed"}},
  };
  const int64_t baseline = run("baseline", tiny);
  std::printf("baseline (1 layer, hidden 8, 8 tokens): peak RSS %.1f MiB\n\n", baseline / 1048576.0);
  std::printf("%-24s %10s %10s %10s %7s\n", "variant", "peak MiB", "measured", "predicted", "ratio");
  const int64_t vocab = deepen::make_tokenizer("bytes")->padded_vocab_size();
  double worst = 0;
  for (const Variant& v : variants) {
    const int64_t peak = run(v.name, v.sets);
    const deepen::Config cfg = deepen::load_config(config.string(), v.sets);
    deepen::StudentMemoryInput in;
    in.student = deepen::shape_from_student(cfg.student, vocab);
    in.tokens = cfg.parallel.micro_batch * cfg.data.seq_len;
    in.precision = cfg.student.precision;
    in.recompute = cfg.student.recompute;
    in.row_chunk = cfg.distill.row_chunk;
    in.gpu = false;
    in.loss_fused = cfg.student.cpu_kernels != deepen::CpuKernels::kAten;
    in.closed_form_norms = true;  // CPU, cpu_kernels = "aten" (base_toml)
    const double predicted = deepen::student_memory(in).total();
    const double measured = static_cast<double>(peak - baseline);
    const double ratio = measured / predicted;
    worst = std::max(worst, std::abs(ratio - 1));
    std::printf("%-24s %10.1f %10.1f %10.1f %7.3f\n", v.name.c_str(), peak / 1048576.0, measured / 1048576.0,
                predicted / 1048576.0, ratio);
  }
  std::printf("\nworst |measured/predicted - 1| = %.3f (goal <= 0.20)\n", worst);
  return 0;
}
