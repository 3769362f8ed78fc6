// Training on a GPU against the same thing on the CPU: teacher stage logits, one student step, a tiny
// `deepen train` (growth, eval, diagnostics, checkpoints, resume) on run.device = "cuda". GPU cases
// skip without CUDA; asking for CUDA without one is an error naming run.device (runs here).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "config/config.h"
#include "config/input_error.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "launch/local_job.h"
#include "model/student.h"
#include "model/student_io.h"
#include "model/teacher_stage.h"
#include "run_folder/run_records.h"
#include "tests/launch/tiny_world.h"
#include "tests/test_paths.h"
#include "train/adamw.h"
#include "train/distill_loss.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;
using test::quiet;

bool have_cuda() { return torch::cuda::is_available(); }
const at::Device kGpu(at::kCUDA, 0);

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }
double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return max_abs(a.to(at::kCPU, at::kDouble) - b.to(at::kCPU, at::kDouble));
}

using GpuWorld = test::TinyWorld;
using test::kTinyStudentShape;

std::vector<nlohmann::json> metrics_of(const fs::path& run) {
  return read_jsonl((run / "metrics.jsonl").string());
}

TEST(RunDeviceJob, CudaWithoutAGpuFailsBeforeAnythingIsWrittenNamingRunDevice) {
  if (have_cuda()) GTEST_SKIP() << "a CUDA device is visible: run.device = \"cuda\" is valid here";
  GpuWorld world;
  try {
    run_train_job(world.config("cuda", {}, "cuda"), quiet());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda.toml: run.device"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(world.dir("cuda")));

  // The command line: exit code 2 (bad input), the message on stderr.
  const fs::path cfg = world.dir("cfg.toml");
  std::ofstream(cfg) << world.toml("cli", "cpu");
  const std::string cmd = std::string(test::kDeepenBin) + " pretrain " + cfg.string() + " --set run.device=\"cuda\" --quiet 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_NE(output.find("run.device"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(world.dir("cli")));
}

TEST(GpuTeacherStage, LogitsMatchTheCpuWithinFp32AndBf16Tolerance) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  GpuWorld world;
  const at::Tensor ids = at::randint(0, 256, {2, 16}, at::kLong);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor cpu = TeacherStage(world.teacher_dir(), 0, 2, true, true, dtype).forward(ids);
    TeacherStage gpu_whole(world.teacher_dir(), 0, 2, true, true, dtype, kGpu);
    const at::Tensor gpu = gpu_whole.forward(ids);
    ASSERT_TRUE(gpu.is_cuda());
    const double scale = 1 + max_abs(cpu.to(at::kDouble));
    // fp32: reduction order only (~1e-6 relative); bf16: 8-bit mantissa through two layers.
    const double tol = dtype == at::kFloat ? 1e-4 : 5e-2;
    EXPECT_LE(max_abs_diff(gpu, cpu), tol * scale) << c10::toString(dtype);
    // Two stages on the GPU (activations handed over on the device) equal one stage there.
    TeacherStage first(world.teacher_dir(), 0, 1, true, false, dtype, kGpu);
    TeacherStage last(world.teacher_dir(), 1, 2, false, true, dtype, kGpu);
    EXPECT_LE(max_abs_diff(last.forward(first.forward(ids)), gpu), (dtype == at::kFloat ? 1e-5 : 1e-2) * scale)
        << c10::toString(dtype);
  }
}

TEST(GpuStudent, OneTrainingStepMatchesTheCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Config cfg = parse_config(std::string(kTinyStudentShape) + "[curriculum]\nmode = \"joint\"\nstages = [3]\n", "s");
  const StudentSpec spec = student_spec_from_config(cfg.student, 256);
  const at::Tensor ids = at::randint(0, 256, {2, 16}, at::kLong);
  const at::Tensor labels = at::randint(0, 256, {2, 16}, at::kLong);
  const at::Tensor teacher = at::randn({32, 256}) * 2;
  DistillLossOptions lo;
  lo.alpha = 0.5;
  lo.row_chunk = 20;  // several chunks of rows, one of them partial
  struct After {
    double loss;
    std::map<std::string, at::Tensor> grads, params;  // on the CPU
  };
  auto step = [&](at::Device device) {
    GrowableStudent student(spec, 3, 7, device);  // drawn on the CPU, then moved: same start
    AdamW opt(AdamWOptions{});
    for (const auto& item : student.named_parameters()) opt.add(item.key(), item.value());
    const DistillLoss l = distill_loss(student.forward_hidden(ids.to(device)), student.head_weight(),
                                       TeacherTargets::full(teacher.to(device)), labels.to(device), lo);
    l.loss.backward();
    After a{l.loss.item<double>(), {}, {}};
    for (const auto& item : student.named_parameters()) a.grads[item.key()] = item.value().grad().cpu();
    opt.step(1e-2);
    for (const auto& item : student.named_parameters()) a.params[item.key()] = item.value().detach().cpu();
    return a;
  };
  const After cpu = step(at::kCPU), gpu = step(kGpu);
  EXPECT_LE(std::abs(gpu.loss - cpu.loss), 1e-5 * std::abs(cpu.loss));
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
  for (const auto& [name, g] : cpu.grads) {
    const double scale = max_abs(g);
    EXPECT_LE(max_abs_diff(gpu.grads.at(name), g), 1e-4 * scale + 1e-12) << name;
    // AdamW's first step moves a weight by ~lr·sign(grad): compare where the sign is beyond
    // rounding (a gradient within rounding of 0 may legitimately flip it).
    const at::Tensor clear = g.abs() > 1e-3 * scale;
    const at::Tensor moved = (gpu.params.at(name) - cpu.params.at(name)).abs().masked_select(clear);
    if (moved.numel() > 0) EXPECT_LE(moved.max().item<double>(), 1e-4) << name;
  }
}

TEST(GpuTrainJob, TinyGrowRunOnCudaFinishesTracksTheCpuAndResumes) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  GpuWorld world;
  ASSERT_EQ(run_train_job(world.config("cpu", {}, "cpu"), quiet()), kExitOk);
  ASSERT_EQ(run_train_job(world.config("gpu", {}, "cuda"), quiet()), kExitOk);
  const auto cpu = metrics_of(world.dir("cpu"));
  const auto gpu = metrics_of(world.dir("gpu"));
  ASSERT_EQ(gpu.size(), 9u);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_EQ(gpu[i]["depth"], cpu[i]["depth"]) << "step " << i;
    const double a = cpu[i]["loss"].get<double>(), b = gpu[i]["loss"].get<double>();
    ASSERT_TRUE(std::isfinite(b)) << "step " << i;
    // The first step differs by rounding only; later ones drift as updates compound.
    EXPECT_LE(std::abs(a - b), (i == 0 ? 1e-5 : 1e-2) * std::abs(a)) << "step " << i;
  }
  std::ifstream meta_in(world.dir("gpu") / "run.json");
  EXPECT_EQ(nlohmann::json::parse(meta_in)["device"].get<std::string>(), "cuda:0");
  EXPECT_EQ(read_jsonl((world.dir("gpu") / "eval.jsonl").string()).size(), 5u);
  // Two phase ends, two periodic points and the end of the run.
  EXPECT_EQ(read_jsonl((world.dir("gpu") / "diagnostics.jsonl").string()).size(), 5u);
  EXPECT_TRUE(fs::exists(world.dir("gpu") / "final" / "hf" / "config.json"));
  // The final student loads back on either device.
  auto final_cpu = load_student((world.dir("gpu") / "final" / "student.safetensors").string());
  auto final_gpu = load_student((world.dir("gpu") / "final" / "student.safetensors").string(), kGpu);
  EXPECT_EQ(final_cpu->parameter_checksum(), final_gpu->parameter_checksum());

  // Stopped after 2 steps on the GPU and resumed there: the curve continues (GPU atomics may
  // reorder sums, so within rounding rather than bit for bit).
  JobOptions stop = quiet();
  stop.stop_after_steps = 2;
  ASSERT_EQ(run_train_job(world.config("split", {}, "cuda"), stop), kExitRequeue);
  ASSERT_EQ(run_train_job(world.config("split", {}, "cuda"), quiet()), kExitOk);
  const auto split = metrics_of(world.dir("split"));
  ASSERT_EQ(split.size(), gpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double a = gpu[i]["loss"].get<double>(), b = split[i]["loss"].get<double>();
    EXPECT_LE(std::abs(a - b), 1e-4 * std::abs(a)) << "step " << i;
  }
}

}  // namespace
}  // namespace deepen

namespace deepen {
namespace {

// tests/train/mixed_precision_test.cpp's two checks, on the GPU: fp32 masters keep AdamW updates
// below half a bf16 ulp (the arithmetic is elementwise and the same on any device: exact values),
// and a tiny bf16-mixed `deepen train` on CUDA (growth, eval, checkpoints) tracks the same run on
// the CPU within the CPU test's stated 5% of the loss per step (TF32 off, the default).
TEST(GpuStudent, Bf16MixedMastersKeepSmallUpdatesAndTrainTracksTheCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Config cfg = parse_config(std::string(kTinyStudentShape) + "[curriculum]\nmode = \"joint\"\nstages = [3]\n", "s",
                                  {"student.tie_embeddings=false"});
  StudentConfig mixed_cfg = cfg.student, pure_cfg = cfg.student;
  mixed_cfg.precision = StudentPrecision::kBf16Mixed;
  pure_cfg.precision = StudentPrecision::kBf16Pure;
  std::map<StudentPrecision, at::Tensor> gains;
  for (const StudentConfig* sc : {&mixed_cfg, &pure_cfg}) {
    GrowableStudent s(student_spec_from_config(*sc, 256), 1, 5, kGpu);
    AdamW opt(AdamWOptions{.weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
    at::Tensor gain;
    for (const auto& [name, p] : s.named_trainable_parameters()) {
      opt.add(name, p);
      if (name == "norm.weight") gain = p;
    }
    ASSERT_TRUE(gain.defined());
    for (int i = 0; i < 10; ++i) {
      gain.mutable_grad() = at::full_like(gain, -1.0);
      opt.step(1e-3);
      opt.zero_grad();
    }
    gains[sc->precision] = gain.detach().cpu();
  }
  EXPECT_TRUE(at::equal(gains[StudentPrecision::kBf16Pure], at::ones_like(gains[StudentPrecision::kBf16Pure])));
  EXPECT_LT((gains[StudentPrecision::kBf16Mixed] - 1.01).abs().max().item<double>(), 1e-5);

  GpuWorld world;
  std::map<std::string, std::vector<double>> curves;
  for (const std::string device : {"cpu", "cuda"}) {
    ASSERT_EQ(run_train_job(world.config("mixed-" + device, {"student.precision=bf16-mixed"}, device), quiet()), kExitOk);
    for (const auto& m : metrics_of(world.dir("mixed-" + device))) curves[device].push_back(m["loss"].get<double>());
  }
  ASSERT_EQ(curves["cuda"].size(), curves["cpu"].size());
  for (size_t i = 0; i < curves["cpu"].size(); ++i)
    EXPECT_LE(std::abs(curves["cuda"][i] - curves["cpu"][i]), 0.05 * curves["cpu"][i]) << "step " << i;
}

}  // namespace
}  // namespace deepen
