// Student training-step throughput: forward + cross-entropy + backward of a 9-layer, hidden-256
// GrowableStudent, against the very same model and ids in transformers' Qwen3ForCausalLM from
// Python eager (bench/student_step_bench.py), launched from here so both run in one go.
//
//   build-x/bench/student_step_bench [--threads 2] [--batch 8] [--seq 256] [--steps 10]
//
// Model (stated, fixed): 9 blocks, hidden 256, 4 heads, 2 KV heads, head_dim 64, intermediate 768,
// vocab 256 (the byte tokenizer's ids; --vocab 151936 for Qwen3's), tied embeddings, pre-norm,
// fp32. Loss: CE over the full vocabulary on next-token targets (T-1 per sequence). Time: median
// step after warm-up; tokens/s = batch * seq / median.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "launch/compute_threads.h"
#include "model/student.h"
#include "model/student_io.h"
#include "tests/test_paths.h"

namespace {

struct Options {
  int64_t threads = 2, batch = 8, seq = 256, steps = 10, warmup = 2, vocab = 256;
  bool baseline = true;
  std::string norm = "pre";
};

// Same formula as the Python side: ids[b, t] = (b * 131 + t * 17 + (b * t) % 7) % vocab.
at::Tensor bench_ids(int64_t batch, int64_t seq, int64_t vocab) {
  const at::Tensor b = at::arange(batch, at::kLong).unsqueeze(1);
  const at::Tensor t = at::arange(seq, at::kLong).unsqueeze(0);
  return (b * 131 + t * 17 + (b * t).remainder(7)).remainder(vocab);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  app.add_flag("!--no-baseline", o.baseline, "skip the Python run");
  CLI11_PARSE(app, argc, argv);
  deepen::set_compute_threads(o.threads);

  deepen::StudentSpec spec;
  spec.decoder = deepen::DecoderSpec{.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 64,
                                     .intermediate = 768, .rope_theta = 1e6, .rms_eps = 1e-6};
  spec.vocab_size = o.vocab;
  spec.max_depth = 9;
  spec.norm = deepen::parse_norm_placement(o.norm, "--norm");
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
  auto measure = [&] {
    std::vector<double> ms;
    for (int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return ms;
  };
  const double first_loss = step();
  for (int64_t i = 1; i < o.warmup; ++i) step();
  const std::vector<double> deepen_ms = measure();
  const double deepen_tps = o.batch * o.seq / (median(deepen_ms) / 1e3);

  std::printf("student: 9 layers, hidden 256, heads 4/2 kv, head_dim 64, intermediate 768, vocab %ld, "
              "tied, %s-norm, fp32; batch %ld x seq %ld, %ld threads, %ld steps after %ld warm-up\n",
              long(o.vocab), o.norm.c_str(), long(o.batch), long(o.seq), long(o.threads), long(o.steps),
              long(o.warmup));
  std::printf("deepen (C++ LibTorch):      %9.0f tokens/s  (median step %.1f ms, first loss %.6f)\n",
              deepen_tps, median(deepen_ms), first_loss);
  if (!o.baseline || spec.norm != deepen::NormPlacement::kPre) return 0;

  const auto dir = std::filesystem::temp_directory_path() / ("deepen_bench_" + std::to_string(::getpid()));
  deepen::export_student_hf(student, (dir / "hf").string());
  const std::string cmd = std::string(deepen::test::kPython) + " " + deepen::test::kSourceDir +
                          "/bench/student_step_bench.py --model " + (dir / "hf").string() +
                          " --batch " + std::to_string(o.batch) + " --seq " + std::to_string(o.seq) +
                          " --steps " + std::to_string(o.steps) + " --warmup " + std::to_string(o.warmup) +
                          " --threads " + std::to_string(o.threads) + " 2>/dev/null";
  std::string out;
  if (FILE* pipe = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    pclose(pipe);
  }
  std::filesystem::remove_all(dir);
  nlohmann::json py;
  try {
    py = nlohmann::json::parse(out.substr(out.rfind('{')));
  } catch (const std::exception&) {
    std::cerr << "python baseline failed: " << cmd << "\n" << out << "\n";
    return 1;
  }
  const double py_tps = py.at("tokens_per_s").get<double>();
  std::vector<double> py_ms = py.at("step_ms").get<std::vector<double>>();
  std::printf("transformers (Python eager): %9.0f tokens/s  (median step %.1f ms, first loss %.6f)\n",
              py_tps, median(py_ms), py.at("first_loss").get<double>());
  std::printf("ratio deepen / transformers: %.2fx\n", deepen_tps / py_tps);
  return 0;
}
