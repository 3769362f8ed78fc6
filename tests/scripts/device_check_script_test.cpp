// scripts/device_check.sh without a GPU: its syntax, shellcheck, and a --dry-run that shows the
// steps a lent H200 will run and checks every run's config against this build's deepen.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/control/control_test_util.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;
using test::TestProcess;

std::string script() { return std::string(test::kSourceDir) + "/scripts/device_check.sh"; }

struct Ran {
  int code = -1;
  std::string out, err;
};

Ran run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, const std::string& tag,
        const std::string& cwd = "") {
  std::vector<std::string> full = argv;
  if (!cwd.empty()) full = {"bash", "-c", "cd \"$0\" && exec \"$@\"", cwd};
  if (!cwd.empty()) full.insert(full.end(), argv.begin(), argv.end());
  TestProcess p(full, env, tag);
  Ran r;
  r.code = p.wait_exit(120).value_or(-1);
  r.out = p.out();
  r.err = p.err();
  return r;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(DeviceCheckScript, PassesBashSyntaxCheckAndShellcheck) {
  const Ran n = run({"bash", "-n", script()}, {}, "device_check_bash_n");
  EXPECT_EQ(n.code, 0) << n.err;
  if (std::system("command -v shellcheck > /dev/null 2>&1") != 0) GTEST_SKIP() << "shellcheck not installed";
  const Ran sc = run({"shellcheck", script()}, {}, "device_check_shellcheck");
  EXPECT_EQ(sc.code, 0) << sc.out << sc.err;
}

// What a lent H200 would run, in order, with the shapes the issue asks for, and every deepen
// command's config accepted by this build (config check lines), so a renamed key fails here.
TEST(DeviceCheckScript, DryRunShowsEveryStepAtPaperShapesAndItsConfigsPassThisBuild) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  const Ran r = run({"bash", script(), "--dry-run"},
                    {{"DEEPEN_BIN", test::kDeepenBin}, {"OUT", ""}, {"BUILD", ""}, {"JOBS", ""}, {"BUDGET_S", ""},
                     {"REHEARSE", ""}, {"STEPS", ""}, {"TEACHER_LAYERS", ""}, {"KIT", ""}, {"BUILD_S", ""}},
                    "device_check_dry", test::kSourceDir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // Preflight names each dependency, found or not (this machine has no nvidia-smi: MISSING, and
  // a dry run goes on).
  for (const char* dep : {"preflight: nvidia-smi", "preflight: nvcc", "preflight: nccl.h", "preflight: libnccl.so.2",
                          "preflight: python3 torch wheel with CUDA", "preflight: cmake", "preflight: ninja",
                          "preflight: mpirun", "preflight: mpicxx", "preflight: pkg-config", "preflight: Boost headers",
                          "preflight: TOML++", "preflight: CLI11", "preflight: nlohmann-json", "preflight: utf8proc",
                          "preflight: GoogleTest"})
    EXPECT_TRUE(has(r.out, dep)) << dep << "\n" << r.out;
  // Build: only deepen and the GPU test binary, 16 jobs, under a timeout.
  EXPECT_TRUE(has(r.out, "would run [build, timeout 330 s]: cmake --build build-gpu --target deepen deepen_torch_tests -j16\n"))
      << r.out;
  EXPECT_TRUE(has(r.out, "would run [gpu_tests, timeout 120 s]: build-gpu/tests/deepen_torch_tests --gtest_filter=Gpu")) << r.out;
  // Real shapes: a paper-width block and a Qwen3-8B-width teacher, V = 151,936, 8,192 tokens.
  EXPECT_TRUE(has(r.out, "hidden 4096, 32/8 heads x 128, intermediate 12288, V = 151936, one 8192-token sequence")) << r.out;
  EXPECT_TRUE(has(r.out, "scripts/random_qwen3.py")) << r.out;
  EXPECT_TRUE(has(r.out, "--layers 4 --hidden 4096 --heads 32 --kv-heads 8 --head-dim 128 --intermediate 12288 --vocab 151936"))
      << r.out;
  EXPECT_TRUE(has(r.out, "would run [pretrain_block, timeout 120 s]")) << r.out;
  EXPECT_TRUE(has(r.out, "would run [train_full, timeout 150 s]")) << r.out;
  EXPECT_TRUE(has(r.out, "distill.logits=full")) << r.out;
  // Each deepen command's config is one this build accepts.
  EXPECT_TRUE(has(r.out, "  config check (prep --dry-run): ok\n")) << r.out;
  EXPECT_TRUE(has(r.out, "  config check (pretrain --dry-run): ok\n")) << r.out;
  EXPECT_TRUE(has(r.out, "  config check (train --dry-run): ok\n")) << r.out;
  EXPECT_FALSE(has(r.out, "FAILED")) << r.out;
  // The hidden-state channel runs where the config knows it, else is skipped with the reason.
  EXPECT_TRUE(has(r.out, "would run [train_hidden, timeout 150 s]") ||
              has(r.out, "train_hidden: skipped: this build's config does not take distill.logits = \"hidden\""))
      << r.out;
  EXPECT_TRUE(has(r.out, "would print: tokens/s, MFU and peak GPU memory")) << r.out;
  EXPECT_FALSE(fs::exists(fs::path(test::kSourceDir) / "device-check-out")) << "a dry run must not write results";
}

// A fake kit: an env.sh that puts a bin/ folder first on the PATH, and a MANIFEST.txt.
fs::path make_fake_kit(const std::string& name) {
  const fs::path kit = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(kit);
  fs::create_directories(kit / "bin");
  std::ofstream(kit / "env.sh") << "DEEPEN_KIT=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\nexport DEEPEN_KIT\n"
                                   "export PATH=$DEEPEN_KIT/bin:$PATH\n";
  std::ofstream(kit / "MANIFEST.txt") << "# a fake kit\n# total: 2 files\n";
  return kit;
}

// --kit DIR: the kit's env.sh is sourced before the preflight, so the preflight and the build see it.
TEST(DeviceCheckScript, TheKitIsPutOnTheSearchPathsBeforeThePreflight) {
  const fs::path kit = make_fake_kit("device_check_kit");
  const Ran r = run({"bash", script(), "--dry-run", "--kit", kit.string()},
                    {{"OUT", ""}, {"BUILD", ""}, {"JOBS", ""}, {"KIT", ""}, {"BUILD_S", ""}, {"REHEARSE", ""}},
                    "device_check_kit", test::kSourceDir);
  fs::remove_all(kit);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const size_t kit_line = r.out.find("kit: " + kit.string() + " (total: 2 files)\n");
  ASSERT_NE(kit_line, std::string::npos) << r.out;
  EXPECT_LT(kit_line, r.out.find("preflight: ")) << r.out;
  EXPECT_TRUE(has(r.out, "would run [build, timeout 330 s]")) << r.out;
}

// --build-only: kit, preflight and build, then stop; a missing driver or GPU is named but not needed.
TEST(DeviceCheckScript, BuildOnlyStopsAfterTheBuildAndNeedsNoGpu) {
  const Ran r = run({"bash", script(), "--dry-run", "--build-only"},
                    {{"OUT", ""}, {"BUILD", ""}, {"JOBS", "2"}, {"KIT", ""}, {"BUILD_S", "3600"}, {"REHEARSE", ""}},
                    "device_check_build_only", test::kSourceDir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, ", build only\n")) << r.out;
  EXPECT_TRUE(has(r.out, "would run [build, timeout 3600 s]: cmake --build build-gpu --target deepen deepen_torch_tests -j2\n"))
      << r.out;
  EXPECT_TRUE(has(r.out, "build only: would stop here")) << r.out;
  EXPECT_FALSE(has(r.out, "[gpu_tests")) << r.out;
  EXPECT_FALSE(has(r.out, "[pretrain_block")) << r.out;
  if (std::system("command -v nvidia-smi > /dev/null 2>&1") != 0)
    EXPECT_TRUE(has(r.out, "preflight: not needed to build (--build-only): nvidia-smi")) << r.out;
}

// A folder that is not a kit stops the check before anything runs (exit 1), naming what to do.
TEST(DeviceCheckScript, AFolderWithoutEnvShIsNotAKit) {
  const fs::path out = fs::temp_directory_path() / ("device_check_nokit_" + std::to_string(::getpid()));
  const Ran r = run({"bash", script(), "--kit", "/nonexistent-kit"},
                    {{"OUT", out.string()}, {"WORK", (out / "work").string()}, {"KIT", ""}},
                    "device_check_no_kit", test::kSourceDir);
  fs::remove_all(out);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "kit: /nonexistent-kit has no env.sh (make one with scripts/offline_kit.sh)")) << r.out;
  EXPECT_TRUE(has(r.out, "FAILED: kit")) << r.out;
  EXPECT_FALSE(has(r.out, "preflight:")) << r.out;
  const Ran missing = run({"bash", script(), "--kit"}, {}, "device_check_kit_missing");
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(has(missing.err, "--kit needs a folder")) << missing.err;
}

TEST(DeviceCheckScript, AnUnknownArgumentIsRefused) {
  const Ran r = run({"bash", script(), "--fast"}, {}, "device_check_bad_arg");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "unknown argument --fast")) << r.err;
}

}  // namespace
}  // namespace deepen
