// The shipped studies (configs/demo, configs/paper): every run expands to a valid config, the paper
// studies hold every run of DESIGN.md §1, and `deepen train --dry-run` accepts each run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "config/config.h"
#include "report/report.h"
#include "study/local_runner.h"
#include "study/teacher_groups.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::string source(const std::string& rel) { return (fs::path(test::kSourceDir) / rel).string(); }

std::vector<std::string> study_files() {
  return {source("configs/demo/study.toml"), source("configs/demo/study_small.toml"),
          source("configs/paper/study-qwen3-8b.toml"), source("configs/paper/study-qwen3-1.7b.toml"),
          source("configs/paper/study-qwen3-0.6b.toml")};
}

TEST(StudyConfigs, EveryRunOfEveryShippedStudyExpandsToAValidConfig) {
  for (const auto& file : study_files()) {
    SCOPED_TRACE(file);
    const StudyPlan plan = expand_study(load_study(file));  // throws on any invalid run config
    EXPECT_FALSE(plan.jobs.empty());
  }
}

const char* const kPaperStudies[] = {"configs/paper/study-qwen3-8b.toml", "configs/paper/study-qwen3-1.7b.toml",
                                     "configs/paper/study-qwen3-0.6b.toml"};

// Every run of the paper's study and controls (docs/protocol.md, "Curriculum" and "Controls"), three
// seeds, with the budgets the paper gives in steps, and the role the report gives each (from its
// config, never its name).
TEST(StudyConfigs, PaperStudiesHoldEveryRunOfThePaperWithItsBudgets) {
  struct Want {
    std::string kind;
    int64_t layers;
    std::vector<int64_t> depths;  // active layers per phase
    std::vector<int64_t> steps;   // steps per phase
    bool freeze;
  };
  const std::vector<int64_t> k50 = {50000}, k50x2 = {50000, 50000}, k50x3 = {50000, 50000, 50000};
  const std::map<std::string, Want> want = {
      {"pre-joint", {"joint", 9, {9}, k50, false}},          {"post-joint", {"joint", 9, {9}, k50, false}},
      {"pre-grow", {"grow", 9, {3, 6, 9}, k50x3, false}},    {"post-grow", {"grow", 9, {3, 6, 9}, k50x3, false}},
      {"post-joint-long", {"joint-long", 9, {9, 9}, k50x2, false}},
      {"post-joint-longer", {"joint-longer", 9, {9, 9, 9}, k50x3, false}},
      {"pre-single-block", {"single-block", 3, {3}, k50, false}},
      {"post-single-block", {"single-block", 3, {3}, k50, false}},
      {"pre-freeze", {"freeze", 9, {3, 6, 9}, k50x3, true}},  {"post-freeze", {"freeze", 9, {3, 6, 9}, k50x3, true}}};
  for (const char* f : kPaperStudies) {
    SCOPED_TRACE(f);
    const StudyPlan plan = expand_study(load_study(source(f)));
    std::map<std::string, std::set<int64_t>> seeds;
    for (const auto& j : plan.jobs) {
      SCOPED_TRACE(j.id());
      const auto it = want.find(j.run);
      ASSERT_NE(it, want.end()) << "a run the paper does not have";
      const Config& c = j.config;
      EXPECT_EQ(option_name(c.student.norm), j.run.substr(0, j.run.find('-')));
      EXPECT_EQ(option_name(run_kind(c, "teacher", 9)), it->second.kind);
      EXPECT_EQ(c.student.layers, it->second.layers);
      EXPECT_EQ(stage_depths(c.curriculum), it->second.depths);
      EXPECT_EQ(c.curriculum.stage_steps, it->second.steps);
      EXPECT_TRUE(c.curriculum.stage_tokens.empty());
      EXPECT_TRUE(c.curriculum.budget.empty());
      EXPECT_EQ(c.curriculum.freeze_prefix, it->second.freeze);
      EXPECT_EQ(c.curriculum.phase_policy, PhasePolicy::kReset);  // every phase: fresh AdamW, warmup + cosine
      EXPECT_EQ(c.run.seed, j.seed);
      seeds[j.run].insert(j.seed);
    }
    EXPECT_EQ(seeds.size(), want.size());
    for (const auto& [name, s] : seeds) EXPECT_EQ(s, (std::set<int64_t>{42, 43, 44})) << name;
  }
  // The 8B study is the paper's: Qwen3-8B teacher.
  const StudyPlan p = expand_study(load_study(source("configs/paper/study-qwen3-8b.toml")));
  EXPECT_EQ(p.jobs[0].config.teacher.checkpoint, "/models/Qwen3-8B");
}

// The paper study's teacher groups are the ones `deepen plan --study` chose (its [[group]] tables):
// per seed the five 150k-step runs, the four 50k-step runs, and post-joint-long alone; a group's runs
// are as long as each other (a group holds its GPUs for its longest run).
TEST(StudyConfigs, ThePaperStudyGroupsItsRunsAsThePlannerChose) {
  const StudyPlan p = expand_study(load_study(source("configs/paper/study-qwen3-8b.toml")));
  std::multiset<size_t> sizes;
  for (const StudyGroup& g : p.groups) {
    sizes.insert(g.members.size());
    for (size_t k : g.members) {
      EXPECT_EQ(p.jobs[k].seed, p.jobs[g.members.front()].seed) << p.jobs[k].id();
      EXPECT_EQ(curriculum_tokens(p.jobs[k].config), curriculum_tokens(p.jobs[g.members.front()].config)) << p.jobs[k].id();
    }
  }
  EXPECT_EQ(sizes, (std::multiset<size_t>{1, 1, 1, 4, 4, 4, 5, 5, 5}));
}

// The paper's runs are GPU runs and say so: every run of every paper study asks for run.device =
// "cuda" and parallel.backend = "nccl", so a node without a working GPU or a build without NCCL
// fails at start (resolve_run_device, world_backend) instead of training on the CPU or staging
// through MPI.
TEST(StudyConfigs, PaperRunsAskForCudaAndNcclExplicitly) {
  for (const char* f : kPaperStudies) {
    SCOPED_TRACE(f);
    const StudyPlan plan = expand_study(load_study(source(f)));
    ASSERT_FALSE(plan.jobs.empty());
    for (const auto& j : plan.jobs) {
      EXPECT_EQ(j.config.run.device, RunDevice::kCuda) << j.id();
      EXPECT_EQ(j.config.parallel.backend, Backend::kNccl) << j.id();
    }
  }
}

// Every value the paper does not give (docs/protocol.md, "What the paper leaves open") is marked in
// the paper configs: each key line of the base configs is one the paper fixes, is operational, or
// carries "# ASSUMPTION".
TEST(StudyConfigs, PaperBaseConfigsMarkTheirAssumptions) {
  const std::set<std::string> given_or_operational = {
      // run, data (FineWeb-Edu sample-10BT, documents up to 8,192, the fixed shard and validation set)
      "name", "out_dir", "seed", "threads", "device", "tokenizer", "train", "valid", "shard_tokens", "sources",
      "parquet_text_column", "id_field", "packing", "max_len", "replay_shard_tokens", "valid_documents",
      // teacher and student
      "checkpoint", "dtype", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab_size",
      "norm", "init", "tie_embeddings", "rope_theta", "rms_eps", "cpu_kernels", "recompute",
      // curriculum, objective, optimiser
      "mode", "stages", "block_layers", "stage_steps", "phase_policy", "grow_init", "freeze_prefix", "alpha",
      "temperature", "logits", "vocab_chunk", "lr", "min_lr_ratio", "weight_decay", "betas", "eps", "warmup_steps",
      "schedule", "grad_clip",
      // layout, eval, checkpoints, control
      "teacher_pipelines", "teacher_stages", "students", "grad_accum", "global_batch", "backend", "activation_dtype", "every", "diagnostic_batch", "keep",
      "heartbeat_s", "watchdog_s"};
  for (const char* f : {"configs/paper/qwen3-8b.toml", "configs/paper/qwen3-1.7b.toml", "configs/paper/qwen3-0.6b.toml"}) {
    std::ifstream in(source(f));
    ASSERT_TRUE(in) << f;
    std::string line;
    int marked = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#' || line[0] == '[') continue;
      const std::string key = line.substr(0, line.find(' '));
      if (line.find("# ASSUMPTION") != std::string::npos) {
        ++marked;
        continue;
      }
      EXPECT_TRUE(given_or_operational.count(key)) << f << ": " << line;
    }
    // The paper's gaps: the split, the micro-batch, the student dtype, the freeze detail, the wire
    // dtype, the diagnostics interval (and the unused keys of documents mode).
    EXPECT_GE(marked, 6) << f;
  }
}

// `deepen train configs/paper/qwen3-8b.toml --dry-run` resolves to the paper's values (docs/protocol.md).
TEST(StudyConfigs, PaperConfigDryRunResolvesToThePublishedProtocol) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  const std::string log = (fs::path(test::kBinaryDir) / "test_scratch" / "paper_config_dry_run.log").string();
  fs::create_directories(fs::path(log).parent_path());
  fs::remove(log);
  ProcessSpec p;
  p.argv = {test::kDeepenBin, "train", source("configs/paper/qwen3-8b.toml"), "--dry-run"};
  p.log_path = log;
  ASSERT_EQ(run_process(p), 0) << tail_lines(log, 20);
  std::ifstream in(log);
  const std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Config c = parse_config(printed, log);  // the printed resolved config, read back
  // Student: 3 blocks x 3 layers at Qwen3-8B's layer shapes, from the teacher.
  EXPECT_EQ(c.student.hidden, 4096);
  EXPECT_EQ(c.student.heads, 32);
  EXPECT_EQ(c.student.kv_heads, 8);
  EXPECT_EQ(c.student.head_dim, 128);
  EXPECT_EQ(c.student.intermediate, 12288);
  EXPECT_EQ(c.student.layers, 9);
  EXPECT_EQ(c.curriculum.block_layers, 3);
  EXPECT_EQ(stage_depths(c.curriculum), (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(c.student.init, StudentInit::kTeacher);
  EXPECT_EQ(c.student.recompute, Recompute::kLayer);  // gradient checkpointing on
  EXPECT_FALSE(c.student.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.student.rope_theta, 1e6);
  // Objective: 0.7 KL + 0.3 CE at tau 1, full vocabulary.
  EXPECT_DOUBLE_EQ(c.distill.alpha, 0.7);
  EXPECT_DOUBLE_EQ(c.distill.temperature, 1.0);
  EXPECT_EQ(c.distill.logits, TeacherOutput::kFull);
  // Optimiser: AdamW (0.9, 0.95), eps 1e-8, wd 0, LR 1e-4 -> 1e-6, 750 warmup, clip 0.5.
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-4);
  EXPECT_NEAR(c.optim.lr * c.optim.min_lr_ratio, 1e-6, 1e-18);
  EXPECT_EQ(c.optim.warmup_steps, 750);
  EXPECT_EQ(c.optim.schedule, LrShape::kCosine);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 0.5);
  EXPECT_EQ(c.optim.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-8);
  EXPECT_EQ(c.run.seed, 42);
  // Data: unpacked documents up to 8,192 tokens, 64 sequences per step, the fixed shard and validation set.
  EXPECT_EQ(c.data.packing, Packing::kDocuments);
  EXPECT_EQ(c.data.max_len, 8192);
  EXPECT_EQ(c.parallel.students * c.parallel.micro_batch * c.parallel.grad_accum, 64);
  EXPECT_EQ(c.data.replay_shard_tokens, 3'110'000'000);
  EXPECT_EQ(c.data.valid_documents, 4833);
  EXPECT_EQ(c.eval.every, 2000);
  // Curriculum: 3 phases x 50k steps, fresh AdamW state and a full warmup + cosine per phase.
  EXPECT_EQ(c.curriculum.mode, CurriculumMode::kGrow);
  EXPECT_EQ(c.curriculum.stage_steps, (std::vector<int64_t>{50000, 50000, 50000}));
  EXPECT_EQ(c.curriculum.phase_policy, PhasePolicy::kReset);
  EXPECT_EQ(c.curriculum.grow_init, GrowInit::kRandom);
  // Teacher: Qwen3-8B in bf16.
  EXPECT_EQ(c.teacher.checkpoint, "/models/Qwen3-8B");
  EXPECT_EQ(c.teacher.dtype, FloatDtype::kBf16);
}

// `deepen train BASE --set ... --dry-run` for every run of every shipped study (the trainer's own
// validation, on the exact arguments the study runner passes).
TEST(StudyConfigs, DeepenTrainDryRunAcceptsEveryRun) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  const std::string log = (fs::path(test::kBinaryDir) / "test_scratch" / "study_configs_dry_run.log").string();
  fs::create_directories(fs::path(log).parent_path());
  for (const auto& file : study_files()) {
    const StudyPlan plan = expand_study(load_study(file));
    for (const auto& job : plan.jobs) {
      ProcessSpec p;  // the runner's arguments, in one process: a dry run starts no ranks
      p.argv = {test::kDeepenBin, option_name(plan.spec.command), plan.spec.base};
      for (const auto& o : job.overrides) {
        p.argv.push_back("--set");
        p.argv.push_back(o);
      }
      p.argv.push_back("--dry-run");
      p.log_path = log;
      fs::remove(log);
      EXPECT_EQ(run_process(p), 0) << file << " " << job.id() << ": " << shell_join(p.argv) << "\n"
                                   << tail_lines(log, 20);
    }
  }
}

}  // namespace
}  // namespace deepen
