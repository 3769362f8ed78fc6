// Single-process trainer: growth, eval and diagnostic records, freeze control, exact resume, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>

#include <torch/torch.h>

#include "config/config.h"
#include "config/input_error.h"
#include "curriculum/growth_schedule.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "launch/local_job.h"
#include "model/student.h"
#include "model/safetensors.h"
#include "model/tensor_bridge.h"
#include "model/student_io.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/run_records.h"
#include "tests/control/control_test_util.h"
#include "tests/launch/tiny_world.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

using test::TinyWorld;
using test::quiet;

std::vector<nlohmann::json> records(const fs::path& run, const char* file) {
  return read_jsonl((run / file).string());
}

// With blocks of L layers (the paper: 3) the diagnostics measure whole blocks: a boundary every L
// layers, and block removal bypasses L layers at once (so it differs from removing one layer).
TEST(Trainer, DiagnosticsMeasureTheCurriculumsBlocksOfSeveralLayers) {
  TinyWorld world;
  const Config cfg = world.config("blocks-of-two", {"student.layers=4", "curriculum.block_layers=2",
                                                    "curriculum.stages=[1, 2]", "curriculum.stage_steps=[3, 3]"});
  ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
  const auto diags = records(world.dir("blocks-of-two"), "diagnostics.jsonl");
  ASSERT_FALSE(diags.empty());
  bool saw_two_blocks = false;
  for (const auto& d : diags) {
    if (d["event"] == "grown") continue;  // the CE change at a growth, no measurements of the blocks
    const int64_t depth = d["depth"].get<int64_t>();
    ASSERT_EQ(depth % 2, 0) << d.dump();
    EXPECT_EQ(d["block_layers"].get<int64_t>(), 2);
    EXPECT_EQ(d["block_rms"].size(), static_cast<size_t>(depth / 2 + 1)) << d.dump();
    if (d.contains("block_removal")) {
      EXPECT_EQ(d["block_removal"]["block_layers"].get<int64_t>(), 2);
      ASSERT_EQ(d["block_removal"]["blocks"].size(), static_cast<size_t>(depth / 2)) << d.dump();
      saw_two_blocks |= depth == 4;
    }
  }
  EXPECT_TRUE(saw_two_blocks);  // the final diagnostics, at 2 blocks of 2 layers
}

// Recomputation changes memory, not numbers: through growth, a phase reset and the freeze control,
// runs with student.recompute = layer / mlp write the loss curve and final weights of recompute = none.
TEST(Trainer, RecomputationLeavesTheLossCurveAndTheWeightsUnchanged) {
  TinyWorld world;
  for (const std::string variant : {"grow", "freeze"}) {
    std::vector<std::string> sets = {"curriculum.phase_policy=reset"};
    if (variant == "freeze") sets.push_back("curriculum.freeze_prefix=true");
    std::vector<std::vector<double>> losses;
    std::vector<uint64_t> checksums;
    for (const std::string mode : {"none", "layer", "mlp"}) {
      const std::string name = "recompute-" + variant + "-" + mode;
      auto with_mode = sets;
      with_mode.push_back("student.recompute=" + mode);
      ASSERT_EQ(run_train_job(world.config(name, with_mode), quiet()), kExitOk) << name;
      std::vector<double> curve;
      for (const auto& m : records(world.dir(name), "metrics.jsonl")) curve.push_back(m["loss"].get<double>());
      losses.push_back(curve);
      checksums.push_back(load_student((world.dir(name) / "final" / "student.safetensors").string())->parameter_checksum());
    }
    ASSERT_EQ(losses[0].size(), 9u) << variant;
    for (size_t k = 1; k < losses.size(); ++k) {
      EXPECT_EQ(losses[k], losses[0]) << variant << " mode " << k;
      EXPECT_EQ(checksums[k], checksums[0]) << variant << " mode " << k;
    }
  }
}

TEST(Trainer, GrowRunRecordsGrowthEventsEvalAndDiagnostics) {
  TinyWorld world;
  for (const std::string norm : {"pre", "post"}) {
    const Config cfg = world.config(norm + "-grow", {"student.norm=" + norm});
    ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
    const fs::path run = world.dir(norm + "-grow");

    const auto metrics = records(run, "metrics.jsonl");
    ASSERT_EQ(metrics.size(), 9u);
    const int64_t want_depth[] = {1, 1, 1, 2, 2, 2, 3, 3, 3};
    for (size_t i = 0; i < 9; ++i) {
      EXPECT_EQ(metrics[i]["step"].get<int64_t>(), static_cast<int64_t>(i));
      EXPECT_EQ(metrics[i]["depth"].get<int64_t>(), want_depth[i]) << norm << " step " << i;
      EXPECT_TRUE(std::isfinite(metrics[i]["loss"].get<double>()));
      EXPECT_GT(metrics[i]["kl"].get<double>(), 0.0);
    }
    // 4 sequences × 32 tokens per step; Σ tokens × depth = 128·(3·1 + 3·2 + 3·3).
    EXPECT_EQ(metrics.back()["active_layer_tokens"].get<int64_t>(), 128 * 18);
    const auto alt = read_active_layer_tokens(run.string());
    EXPECT_TRUE(alt.complete);
    EXPECT_EQ(alt.active_layer_tokens, 128 * 18);

    // Evals every 4 steps (after steps 3, 7) and at each stage end (steps 2, 5, 8).
    const auto evals = records(run, "eval.jsonl");
    std::vector<int64_t> eval_steps;
    for (const auto& e : evals) {
      eval_steps.push_back(e["step"].get<int64_t>());
      EXPECT_GT(e["val_ce"].get<double>(), 0.0);
      EXPECT_GT(e["val_kl"].get<double>(), 0.0);
    }
    EXPECT_EQ(eval_steps, (std::vector<int64_t>{2, 3, 5, 7, 8}));
    EXPECT_TRUE(evals[0]["stage_end"].get<bool>());
    EXPECT_FALSE(evals[1]["stage_end"].get<bool>());

    // Diagnostics at both phase ends (the model a block is appended to), the CE on the diagnostic
    // batch just before and after each growth, every 4 steps, and after the last step.
    const auto diags = records(run, "diagnostics.jsonl");
    std::vector<std::pair<std::string, int64_t>> events;
    for (const auto& d : diags) events.emplace_back(d["event"].get<std::string>(), d["depth"].get<int64_t>());
    EXPECT_EQ(events, (std::vector<std::pair<std::string, int64_t>>{{"stage_end", 1},
                                                                    {"grown", 2},
                                                                    {"periodic", 2},
                                                                    {"stage_end", 2},
                                                                    {"grown", 3},
                                                                    {"periodic", 3},
                                                                    {"final", 3}}));
    for (const auto& d : diags) {
      if (d["event"] == "grown") {
        EXPECT_EQ(d["depth_before"].get<int64_t>(), d["depth"].get<int64_t>() - 1) << d.dump();
        EXPECT_TRUE(std::isfinite(d["ce_before"].get<double>()) && std::isfinite(d["ce_after"].get<double>()))
            << d.dump();
        continue;
      }
      const int64_t depth = d["depth"].get<int64_t>();
      // One layer per block (curriculum.block_layers = 1): a boundary before every layer and after the last.
      ASSERT_EQ(d["block_rms"].size(), static_cast<size_t>(depth + 1)) << d.dump();
      // 2 diagnostic rows of 32: each starts a document; padding never counts.
      const auto& last = d["block_rms"].back();
      EXPECT_EQ(last["document_boundary"]["count"].get<int64_t>() + last["regular"]["count"].get<int64_t>(),
                last["all"]["count"].get<int64_t>());
      EXPECT_GE(last["document_boundary"]["count"].get<int64_t>(), 2);
      EXPECT_GT(last["regular"]["std"].get<double>(), 0.0);
      EXPECT_GT(last["all"]["kurtosis"].get<double>(), 1.0);  // Pearson kurtosis is >= 1 always
      const bool removal = d["event"] != "periodic";
      ASSERT_EQ(d.contains("block_removal"), removal) << d.dump();
      if (removal) {
        ASSERT_EQ(d["block_removal"]["blocks"].size(), static_cast<size_t>(depth));
        for (const auto& b : d["block_removal"]["blocks"]) {
          EXPECT_GT(b["angle"].get<double>(), 0.0);
          EXPECT_LT(b["angle"].get<double>(), 1.0);
          EXPECT_NEAR(b["delta_ce"].get<double>(),
                      b["ce_without"].get<double>() - d["block_removal"]["full_ce"].get<double>(), 1e-12);
        }
      }
    }
    {
      std::ifstream in(run / "final_token_rms.json");
      const nlohmann::json final_rms = nlohmann::json::parse(in);
      EXPECT_EQ(final_rms["step"].get<int64_t>(), 8);
      ASSERT_EQ(final_rms["boundaries"].size(), 4u);
      EXPECT_EQ(static_cast<int64_t>(final_rms["boundaries"][3]["regular"].size()),
                diags.back()["block_rms"][3]["regular"]["count"].get<int64_t>());
    }
    for (const auto& e : evals) EXPECT_NEAR(e["val_ppl"].get<double>(), std::exp(e["val_ce"].get<double>()), 1e-9);
    for (const auto& d : diags) {
      if (d["event"] == "grown") continue;
      const int64_t depth = d["depth"].get<int64_t>();
      const auto& residual = d["residual"];
      ASSERT_EQ(residual["entering"].size(), static_cast<size_t>(depth)) << d.dump();
      // 2 diagnostic sequences: two `first` tokens; the rest split over structural and content.
      EXPECT_EQ(residual["boundary"]["tokens"]["first"].get<int64_t>(), 2);
      EXPECT_GT(residual["boundary"]["tokens"]["content"].get<int64_t>(), 0);
      for (const char* cls : {"first", "content"}) {
        EXPECT_GT(residual["boundary"]["mean"][cls].get<double>(), 0.0) << cls;
        EXPECT_GT(residual["entering"][0]["mean"][cls].get<double>(), 0.0) << cls;
        const double change = d["identity_last_block"]["relative_change"]["mean"][cls].get<double>();
        const double cosine = d["identity_last_block"]["cosine"]["mean"][cls].get<double>();
        EXPECT_GT(change, 0.0) << cls;
        EXPECT_GE(cosine, -1.0);
        EXPECT_LE(cosine, 1.0);
      }
    }
    // Post-norm blocks end in RMSNorm: the boundary representation has RMS ~1 (unit gains at init
    // and after a few steps), while pre-norm's residual stream is not normalized.
    const double boundary_rms = diags.back()["residual"]["boundary"]["mean"]["content"].get<double>();
    if (norm == option_name(NormPlacement::kPost)) EXPECT_NEAR(boundary_rms, 1.0, 0.1);
    EXPECT_TRUE(fs::exists(run / "final" / "hf" / "config.json"));
    EXPECT_TRUE(fs::exists(run / "config.toml"));
  }
}

// SIGUSR1 (Slurm's warning before the time limit) that arrives while `deepen train` is still
// starting, before its control plane exists, is kept and becomes a coordinated stop (exit 3), not
// the signal's default action (death). The test waits until the process catches the signal (SigCgt
// in /proc: from the first moments of the command), then sends it at once; whether it lands before
// or after the control plane starts depends on timing, so the case "before" is pinned down
// in-process by ControlPlaneFacade.StopSignalBeforeTheControlPlaneStartsBecomesACoordinatedStop.
TEST(Trainer, StopSignalDuringStartupIsKeptAndStopsTheRun) {
  if (!fs::exists(test::kDeepenBin)) GTEST_SKIP() << "deepen not built";
  TinyWorld world;
  const Config cfg = world.config("held-signal", {"curriculum.stage_steps=[3000, 3000, 3000]"});
  const fs::path toml = world.dir("held-signal").string() + ".toml";
  std::ofstream(toml) << to_toml(cfg);
  test::TestProcess job({test::kDeepenBin, "train", toml.string(), "--fresh", "--quiet"}, {}, "held_signal");
  // SigCgt: the caught-signal mask, hex; SIGUSR1 is bit 10 - 1.
  auto catches_usr1 = [&job] {
    std::ifstream in("/proc/" + std::to_string(job.pid()) + "/status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("SigCgt:", 0) == 0) return ((std::stoull(line.substr(7), nullptr, 16) >> (SIGUSR1 - 1)) & 1) != 0;
    return false;
  };
  ASSERT_TRUE(test::eventually(catches_usr1, 60)) << "deepen train never caught SIGUSR1 while starting\n" << job.err();
  job.signal(SIGUSR1);
  const auto code = job.wait_exit(60);
  ASSERT_TRUE(code.has_value()) << job.err();
  EXPECT_EQ(*code, kExitRequeue) << "128 + 10 = killed by SIGUSR1\n" << job.err();
  EXPECT_NE(job.err().find("coordinated stop"), std::string::npos) << job.err();
  EXPECT_LT(records(world.dir("held-signal"), "metrics.jsonl").size(), 9000u);  // stopped, not finished
}

// Resuming with another config is refused before anything is written, naming the keys that differ
// from the run's config.toml; settings that change only speed or rounding (threads, CPU kernels,
// recomputation) resume.
TEST(Trainer, ResumeWithAnotherConfigNamesTheKeyAndLeavesTheRunFolderAsItWas) {
  TinyWorld world;
  JobOptions stop = quiet();
  stop.stop_after_steps = 2;
  ASSERT_EQ(run_train_job(world.config("changed"), stop), kExitRequeue);
  const fs::path run = world.dir("changed");
  const std::string config_before = test::TestProcess::slurp((run / "config.toml").string());
  const std::string run_json_before = test::TestProcess::slurp((run / "run.json").string());
  try {
    run_train_job(world.config("changed", {"curriculum.stage_steps=[3, 3, 4]"}), quiet());
    FAIL() << "resumed with another curriculum";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("written by a different config"), std::string::npos) << what;
    EXPECT_NE(what.find("curriculum.stage_steps = [3, 3, 3] there, [3, 3, 4] here"), std::string::npos) << what;
    EXPECT_NE(what.find((run / "config.toml").string()), std::string::npos) << what;
  }
  EXPECT_EQ(test::TestProcess::slurp((run / "config.toml").string()), config_before);
  EXPECT_EQ(test::TestProcess::slurp((run / "run.json").string()), run_json_before);
  EXPECT_EQ(records(run, "metrics.jsonl").size(), 2u);
  // Speed and rounding only: the run continues.
  EXPECT_EQ(run_train_job(world.config("changed", {"run.threads=2", "student.cpu_kernels=\"aten\"",
                                                   "student.recompute=\"layer\""}),
                          quiet()),
            kExitOk);
  EXPECT_EQ(records(run, "metrics.jsonl").size(), 9u);
}

TEST(Trainer, ResumedRunContinuesTheExactLossCurveAcrossAGrowthEvent) {
  TinyWorld world;
  ASSERT_EQ(run_train_job(world.config("whole"), quiet()), kExitOk);

  JobOptions stop = quiet();
  stop.stop_after_steps = 2;  // checkpoint after step 1; the resumed part grows at step 3
  ASSERT_EQ(run_train_job(world.config("split"), stop), kExitRequeue);
  EXPECT_EQ(records(world.dir("split"), "metrics.jsonl").size(), 2u);
  ASSERT_EQ(run_train_job(world.config("split"), quiet()), kExitOk);

  // Derived bound: 0. The resumed run repeats the same operations on the same values in the same
  // order (one thread, CPU, weights and optimizer state restored bit for bit), so the curves are
  // equal bit for bit; 1e-6 relative is slack, not a fit, and cannot be reached by rounding.
  const auto a = records(world.dir("whole"), "metrics.jsonl");
  const auto b = records(world.dir("split"), "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"loss", "kl", "ce", "grad_norm"}) {
      const double x = a[i][key].get<double>(), y = b[i][key].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-6 * std::abs(x)) << key << " at step " << i;
    }
  }
  const auto ea = records(world.dir("whole"), "eval.jsonl");
  const auto eb = records(world.dir("split"), "eval.jsonl");
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i)
    EXPECT_LE(std::abs(ea[i]["val_ce"].get<double>() - eb[i]["val_ce"].get<double>()),
              1e-6 * ea[i]["val_ce"].get<double>());
}

// --fresh in the folder of a finished run: the earlier run's checkpoints, final student and
// active-layer-token record go, so stopping the new run and resuming continues the new run. (Kept,
// the earlier run's last checkpoint was the newest: the resume ended at once, 2 steps recorded.)
TEST(Trainer, FreshRunInTheFolderOfAFinishedRunResumesFromItsOwnCheckpoint) {
  TinyWorld world;
  ASSERT_EQ(run_train_job(world.config("again"), quiet()), kExitOk);
  const size_t steps = records(world.dir("again"), "metrics.jsonl").size();
  JobOptions fresh = quiet();
  fresh.resume = false;
  fresh.stop_after_steps = 2;
  ASSERT_EQ(run_train_job(world.config("again"), fresh), kExitRequeue);
  EXPECT_FALSE(fs::exists(fs::path(world.dir("again")) / "final"));
  EXPECT_EQ(read_active_layer_tokens(fs::path(world.dir("again")).string()).steps, 2);
  ASSERT_EQ(run_train_job(world.config("again"), quiet()), kExitOk);
  EXPECT_EQ(records(world.dir("again"), "metrics.jsonl").size(), steps);
  EXPECT_TRUE(fs::exists(fs::path(world.dir("again")) / "final" / "student.safetensors"));
}

// A run killed while writing metrics.jsonl leaves its last record cut short (no newline). Resuming
// must drop that torn line (with a warning naming the file and line), not refuse with "not JSON",
// and continue the very curve of the uninterrupted run.
TEST(Trainer, ResumeAfterAKillMidRecordDropsTheTornLineAndContinuesTheSameCurve) {
  TinyWorld world;
  ASSERT_EQ(run_train_job(world.config("whole"), quiet()), kExitOk);
  const fs::path whole = world.dir("whole"), killed = world.dir("killed");

  // The killed run: checkpoints after steps 1 and 3 (checkpoint.every = 2), then it trained on and
  // wrote step 4's record whole and step 5's half when the kill came (step 5's checkpoint follows
  // its record, so the newest checkpoint is still the one after step 3).
  JobOptions stop = quiet();
  stop.stop_after_steps = 4;
  ASSERT_EQ(run_train_job(world.config("killed"), stop), kExitRequeue);
  std::vector<std::string> lines;
  {
    std::ifstream in(whole / "metrics.jsonl");
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_GE(lines.size(), 6u);
  {
    std::ofstream out(killed / "metrics.jsonl", std::ios::app | std::ios::binary);
    out << lines[4] << "\n" << lines[5].substr(0, lines[5].size() / 2);  // torn mid-record, no newline
  }
  ASSERT_THROW(nlohmann::json::parse(lines[5].substr(0, lines[5].size() / 2)), nlohmann::json::exception);

  testing::internal::CaptureStderr();
  const int rc = run_train_job(world.config("killed"), quiet());
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, kExitOk) << err;
  EXPECT_NE(err.find("metrics.jsonl:6: dropped a torn last line"), std::string::npos) << err;

  // Same operations on the same values in the same order (one thread, CPU): the resumed curve is
  // the uninterrupted one bit for bit, records included.
  const auto a = records(whole, "metrics.jsonl");
  const auto b = records(killed, "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["step"].get<int64_t>(), static_cast<int64_t>(i));
    for (const char* key : {"loss", "kl", "ce", "grad_norm", "lr"})
      EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>()) << key << " at step " << i;
  }
  const auto ea = records(whole, "eval.jsonl");
  const auto eb = records(killed, "eval.jsonl");
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) EXPECT_EQ(ea[i]["val_ce"].get<double>(), eb[i]["val_ce"].get<double>());
}

TEST(Trainer, FreezeControlKeepsTheTrainedPrefixFixed) {
  TinyWorld world;
  ASSERT_EQ(run_train_job(world.config("freeze", {"curriculum.freeze_prefix=true"}), quiet()), kExitOk);
  // The checkpoint after step 3 (first step at depth 2) vs the final student: block 0 and the
  // embedding were frozen from step 3 on; block 1 trained during stage 1, then froze in stage 2.
  const fs::path ckpt = world.dir("freeze") / "checkpoints" / "step_00000003" / "student.safetensors";
  ASSERT_TRUE(fs::exists(ckpt));
  auto early = load_student(ckpt.string());
  auto last = load_student((world.dir("freeze") / "final" / "student.safetensors").string());
  auto early_params = early->named_parameters();
  auto last_params = last->named_parameters();
  int compared = 0;
  for (const auto& item : early_params) {
    const std::string& name = item.key();
    if (name.rfind("layers.0.", 0) == 0 || name == "embed_tokens.weight") {
      EXPECT_TRUE(torch::equal(item.value(), last_params[name])) << name << " changed while frozen";
      ++compared;
    }
  }
  EXPECT_GT(compared, 5);
  EXPECT_FALSE(torch::equal(early_params["layers.1.mlp.up_proj.weight"], last_params["layers.1.mlp.up_proj.weight"]));
}

TEST(Trainer, TopkChannelRunCompletesAndMatchesItsOwnRecordFormat) {
  TinyWorld world;
  const Config cfg = world.config("topk", {"distill.logits=\"topk\"", "distill.topk=8", "distill.tail=\"bucket\""});
  ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
  std::ifstream in(world.dir("topk") / "run.json");
  const auto meta = nlohmann::json::parse(in);
  EXPECT_EQ(meta["teacher"].get<std::string>(), "topk:8:bucket");
}

// The hidden-state channel in one process: a headless teacher, its head on the student's side.
// Its numbers against the full-logit path are DistillLoss.HiddenStateTargets*'s; against the
// distributed run, tests/e2e/distributed_train.py's hidden-* cases.
TEST(Trainer, HiddenChannelRunCompletesAndRecordsItsFormat) {
  TinyWorld world;
  const Config cfg = world.config("hidden", {"distill.logits=\"hidden\""});
  ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
  std::ifstream in(world.dir("hidden") / "run.json");
  const auto meta = nlohmann::json::parse(in);
  EXPECT_EQ(meta["teacher"].get<std::string>(), "hidden");
  const auto evals = records(world.dir("hidden"), "eval.jsonl");
  ASSERT_FALSE(evals.empty());
  EXPECT_GT(evals.back()["val_kl"].get<double>(), 0);
}

TEST(Trainer, BudgetSmallerThanOneStepFailsBeforeWritingAnything) {
  TinyWorld world;
  const Config cfg = world.config("tiny-budget", {"curriculum.stage_steps=[]",
                                                  "curriculum.stage_tokens=[\"100\", \"1K\", \"1K\"]"});
  try {
    run_train_job(cfg, quiet());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("curriculum.stage_tokens[0]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(world.dir("tiny-budget")));
}

TEST(Trainer, TeacherWithAnotherVocabularyIsRejected) {
  TinyWorld world;
  const Config cfg = world.config("vocab", {"student.vocab_size=400"});
  try {
    run_train_job(cfg, quiet());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: vocab_size"), std::string::npos) << e.what();
  }
}

// A teacher for student.init = "teacher" runs: TinyWorld's (tied, unit final norm) with its final
// norm gains moved off 1, so "the boundary norm starts at the teacher's" cannot pass by chance.
std::string teacher_with_scaled_norm(const TinyWorld& world) {
  auto teacher = load_student_hf(world.teacher_dir());
  {
    at::NoGradGuard no_grad;
    teacher->named_parameters()["norm.weight"].copy_(at::linspace(0.5, 1.5, teacher->spec().decoder.hidden));
  }
  const std::string dir = world.dir("teacher_scaled").string();
  export_student_hf(*teacher, dir);
  return dir;
}

std::vector<std::string> paper_student_sets(const std::string& teacher, const std::string& norm) {
  return {"student.init=teacher", "student.tie_embeddings=false", "student.norm=" + norm,
          "teacher.checkpoint=\"" + teacher + "\""};
}

TEST(Trainer, TeacherInitKeepsTheTeachersEmbeddingAndTrainsHeadAndBoundaryNorm) {
  TinyWorld world;
  const std::string teacher_dir = teacher_with_scaled_norm(world);
  const auto teacher = load_student_hf(teacher_dir);
  auto tp = teacher->named_parameters();
  for (const std::string norm : {"pre", "post"}) {
    const std::string name = "paper-" + norm;
    ASSERT_EQ(run_train_job(world.config(name, paper_student_sets(teacher_dir, norm)), quiet()), kExitOk);
    auto last = load_student((world.dir(name) / "final" / "student.safetensors").string());
    auto lp = last->named_parameters();
    const std::string boundary = norm == option_name(NormPlacement::kPre) ? "norm.weight" : "entry_norm.weight";
    // Frozen: the embedding is the teacher's bit for bit after 9 steps of training.
    EXPECT_TRUE(torch::equal(lp["embed_tokens.weight"], tp["embed_tokens.weight"])) << norm;
    // Trained: the head (copied from the tied teacher's embedding) and the boundary norm moved.
    EXPECT_FALSE(torch::equal(lp["lm_head.weight"], tp["embed_tokens.weight"])) << norm;
    EXPECT_FALSE(torch::equal(lp[boundary], tp["norm.weight"])) << norm;
    // ... but started there: after 9 steps at lr <= 3e-3 each gain moved by at most 9 · 3e-3 ·
    // (1 + weight-decay term) (an Adam step is at most ~lr per coordinate), far below the 0.5..1.5 spread.
    EXPECT_LT((lp[boundary] - tp["norm.weight"]).abs().max().item<double>(), 9 * 3e-3 * 1.5) << norm;
    // The frozen embedding holds no optimizer state in any checkpoint.
    for (const auto& entry : fs::directory_iterator(world.dir(name) / "checkpoints")) {
      const auto opt = SafetensorsFile::open((entry.path() / "optimizer.safetensors").string());
      EXPECT_EQ(opt.find("embed_tokens.weight.exp_avg"), nullptr) << entry.path();
      EXPECT_NE(opt.find("lm_head.weight.exp_avg"), nullptr) << entry.path();
    }
  }
}

TEST(Trainer, TeacherInitWithAnotherWidthFailsNamingBothWidths) {
  TinyWorld world;
  std::vector<std::string> sets = paper_student_sets(world.teacher_dir(), "pre");
  sets.push_back("student.hidden=48");
  try {
    run_train_job(world.config("wide", sets), quiet());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("student.hidden = 48"), std::string::npos) << what;
    EXPECT_NE(what.find("hidden_size = 32"), std::string::npos) << what;
  }
}

// The optimizer state a checkpoint holds, by name.
std::map<std::string, at::Tensor> optimizer_state(const fs::path& run, int64_t last_step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(last_step));
  return read_tensors((run / "checkpoints" / name / "optimizer.safetensors").string());
}

// Phases of 4 steps (1, 2, 3 blocks), warmup 2, lr 3e-3 -> 3e-4 in every phase under "reset".
std::vector<std::string> reset_sets(std::vector<std::string> more = {}) {
  std::vector<std::string> sets = {"curriculum.phase_policy=reset", "curriculum.stage_steps=[4, 4, 4]",
                                   "optim.min_lr_ratio=0.1"};
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

TEST(Trainer, ResetPolicyStartsEveryPhaseWithFreshAdamStateAndAFreshWarmup) {
  TinyWorld world;
  const fs::path run = world.dir("reset");
  JobOptions stop = quiet();
  stop.stop_after_steps = 5;  // the checkpoint after step 4, the first step of phase 1
  ASSERT_EQ(run_train_job(world.config("reset", reset_sets()), stop), kExitRequeue);
  // One AdamW update from zero moments leaves exp_avg = (1 − β1)·g and exp_avg_sq = (1 − β2)·g²,
  // so exp_avg_sq = (1 − β2)/(1 − β1)² · exp_avg² = 5 · exp_avg² element for element, and step = 1,
  // for every parameter: the old blocks' moments were zero when phase 1 began, not carried. fp32
  // rounding of the two products and a square is a few ulp (< 1e-6 relative); 1e-5 is that bound
  // with margin. Carried moments (step 5) would break it by O(1).
  const auto state = optimizer_state(run, 4);
  int checked = 0;
  for (const auto& [key, t] : state) {
    if (key.size() < 5 || key.substr(key.size() - 5) != ".step") continue;
    const std::string param = key.substr(0, key.size() - 5);
    EXPECT_EQ(t.item<int64_t>(), 1) << param;
    const at::Tensor m = state.at(param + ".exp_avg"), v = state.at(param + ".exp_avg_sq");
    const at::Tensor want = 5 * m * m;
    EXPECT_LE(((v - want).abs() - 1e-5 * want).max().item<double>(), 1e-30) << param;
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 2 * 11);  // embedding, final norm and two blocks of 11 tensors each
  // Under "keep" the same point carries phase 0's moments: step counts 5 for block 0.
  ASSERT_EQ(run_train_job(world.config("keep", {"curriculum.stage_steps=[4, 4, 4]", "optim.min_lr_ratio=0.1"}), stop),
            kExitRequeue);
  EXPECT_EQ(optimizer_state(world.dir("keep"), 4).at("layers.0.mlp.up_proj.weight.step").item<int64_t>(), 5);

  // The LR the trainer applied (metrics.jsonl "lr" is the value passed to the update) restarts
  // its warmup and cosine in every phase: W = 2, 4 steps -> 1.5e-3, 3e-3, 3e-3, 3e-4.
  ASSERT_EQ(run_train_job(world.config("reset", reset_sets()), quiet()), kExitOk);
  const auto m = records(run, "metrics.jsonl");
  ASSERT_EQ(m.size(), 12u);
  const double want[4] = {1.5e-3, 3e-3, 3e-3, 3e-4};
  for (size_t i = 0; i < m.size(); ++i) EXPECT_DOUBLE_EQ(m[i]["lr"].get<double>(), want[i % 4]) << "step " << i;
}

TEST(Trainer, ResumeAcrossAPhaseResetContinuesTheUninterruptedCurve) {
  TinyWorld world;
  ASSERT_EQ(run_train_job(world.config("whole", reset_sets()), quiet()), kExitOk);
  JobOptions stop = quiet();
  stop.stop_after_steps = 4;  // checkpoint at the end of phase 0: the resumed process does the reset
  ASSERT_EQ(run_train_job(world.config("split", reset_sets()), stop), kExitRequeue);
  stop.stop_after_steps = 6;  // and once inside phase 1, after the reset
  ASSERT_EQ(run_train_job(world.config("split", reset_sets()), stop), kExitRequeue);
  ASSERT_EQ(run_train_job(world.config("split", reset_sets()), quiet()), kExitOk);
  // Same operations on the same values in the same order (one thread, CPU): equal bit for bit.
  const auto a = records(world.dir("whole"), "metrics.jsonl");
  const auto b = records(world.dir("split"), "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"loss", "kl", "ce", "grad_norm", "lr"})
      EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>()) << key << " at step " << i;
}

TEST(Trainer, JointPhasesAtFixedDepthRestartTheLrWithoutGrowing) {
  TinyWorld world;
  const Config cfg = world.config("joint-long", {"curriculum.mode=joint", "curriculum.stages=[3, 3]",
                                                 "curriculum.stage_steps=[4, 4]", "curriculum.phase_policy=reset",
                                                 "optim.min_lr_ratio=0.1"});
  ASSERT_EQ(run_train_job(cfg, quiet()), kExitOk);
  const auto m = records(world.dir("joint-long"), "metrics.jsonl");
  ASSERT_EQ(m.size(), 8u);
  const double want[4] = {1.5e-3, 3e-3, 3e-3, 3e-4};
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i]["depth"].get<int64_t>(), 3);
    EXPECT_EQ(m[i]["stage"].get<int64_t>(), static_cast<int64_t>(i / 4));
    EXPECT_DOUBLE_EQ(m[i]["lr"].get<double>(), want[i % 4]) << "step " << i;
  }
}

TEST(Trainer, FreezeControlAsPublishedTrainsOnlyTheNewBlockAndKeepsNoStateForTheRest) {
  TinyWorld world;
  const std::string teacher_dir = teacher_with_scaled_norm(world);
  for (const bool ends : {true, false}) {
    const std::string name = ends ? "freeze-ends" : "freeze-blocks";
    std::vector<std::string> sets = paper_student_sets(teacher_dir, "post");
    sets.push_back("curriculum.freeze_prefix=true");
    sets.push_back(std::string("curriculum.freeze_head_and_norm=") + (ends ? "true" : "false"));
    ASSERT_EQ(run_train_job(world.config(name, reset_sets(sets)), quiet()), kExitOk);
    const fs::path run = world.dir(name);
    // Checkpoints after step 3 (end of phase 0) and 7 (end of phase 1) vs the final student.
    auto p0 = load_student((run / "checkpoints" / "step_00000003" / "student.safetensors").string())->named_parameters();
    auto p1 = load_student((run / "checkpoints" / "step_00000007" / "student.safetensors").string())->named_parameters();
    auto last = load_student((run / "final" / "student.safetensors").string())->named_parameters();
    const auto state = optimizer_state(run, 11);  // phase 2: only block 2 (and the ends, if they train)
    for (const auto& item : last) {
      const std::string& n = item.key();
      const bool block0 = n.rfind("layers.0.", 0) == 0, block1 = n.rfind("layers.1.", 0) == 0;
      const bool end = n == "lm_head.weight" || n == "entry_norm.weight";
      if (block0) EXPECT_TRUE(torch::equal(p0[n], item.value())) << name << ": " << n << " changed while frozen";
      if (block1) EXPECT_TRUE(torch::equal(p1[n], item.value())) << name << ": " << n << " changed while frozen";
      if (end && ends) EXPECT_TRUE(torch::equal(p0[n], item.value())) << name << ": " << n << " changed while frozen";
      if (end && !ends) EXPECT_FALSE(torch::equal(p1[n], item.value())) << name << ": " << n << " did not train";
      if (n == "embed_tokens.weight") EXPECT_TRUE(torch::equal(p0[n], item.value()));
      const bool trains = n.rfind("layers.2.", 0) == 0 || (end && !ends);
      EXPECT_EQ(state.count(n + ".exp_avg"), trains ? 1u : 0u) << name << ": " << n;
    }
    // The new block does train in each phase.
    auto p5 = load_student((run / "checkpoints" / "step_00000005" / "student.safetensors").string())->named_parameters();
    auto p9 = load_student((run / "checkpoints" / "step_00000009" / "student.safetensors").string())->named_parameters();
    EXPECT_FALSE(torch::equal(p5["layers.1.mlp.up_proj.weight"], p1["layers.1.mlp.up_proj.weight"]));
    EXPECT_FALSE(torch::equal(p9["layers.2.mlp.up_proj.weight"], last["layers.2.mlp.up_proj.weight"]));
  }
}

// Table 2 of the paper (single block) read from the grow runs: under phase_policy = "reset" a grow
// run's phase 0 is the single-block control (same one-block student, seed, batches, and a whole
// warmup + cosine within the phase), so its records equal the stand-alone run's bit for bit.
TEST(Trainer, UnderResetTheGrowRunsPhaseZeroIsTheSingleBlockControl) {
  TinyWorld world;
  const Config grow = world.config("grow", reset_sets());
  Config single = single_block_control(grow);
  single.run.out_dir = world.dir("single").string();
  ASSERT_EQ(run_train_job(grow, quiet()), kExitOk);
  ASSERT_EQ(run_train_job(single, quiet()), kExitOk);
  const auto g = records(world.dir("grow"), "metrics.jsonl");
  const auto s = records(world.dir("single"), "metrics.jsonl");
  ASSERT_EQ(s.size(), 4u);
  for (size_t i = 0; i < s.size(); ++i)
    for (const char* key : {"loss", "kl", "ce", "grad_norm", "lr"})
      EXPECT_EQ(g[i][key].get<double>(), s[i][key].get<double>()) << key << " at step " << i;
  const auto ge = records(world.dir("grow"), "eval.jsonl");
  const auto se = records(world.dir("single"), "eval.jsonl");
  ASSERT_FALSE(se.empty());
  EXPECT_EQ(ge[0]["step"], se.back()["step"]);
  EXPECT_EQ(ge[0]["val_ce"].get<double>(), se.back()["val_ce"].get<double>());
  // Under "keep" the grow run's one cosine spans all 12 steps, so its phase 0 is not the control.
  const Config keep = world.config("keep", {"curriculum.stage_steps=[4, 4, 4]", "optim.min_lr_ratio=0.1"});
  ASSERT_EQ(run_train_job(keep, quiet()), kExitOk);
  EXPECT_NE(records(world.dir("keep"), "metrics.jsonl")[3]["lr"].get<double>(), s[3]["lr"].get<double>());
}

}  // namespace
}  // namespace deepen

namespace deepen {
namespace {

// bf16-mixed through everything a run does to its parameters: growth (new blocks made in fp32 and
// broadcast), the phase reset (fresh fp32 AdamW state), the freeze control, checkpoints (fp32
// masters) and the checksum. Resumed twice (before the growth at step 4 and inside phase 1), the run
// continues the uninterrupted curve bit for bit: masters and moments are restored exactly and the
// bf16 copies are recast from them, so every step repeats the same operations on the same values.
TEST(Trainer, Bf16MixedResumesAcrossGrowthAndAPhaseResetEqualToUninterrupted) {
  TinyWorld world;
  for (const std::string variant : {"grow", "freeze"}) {
    std::vector<std::string> more = {"student.precision=bf16-mixed"};
    if (variant == "freeze") more.push_back("curriculum.freeze_prefix=true");
    const std::string whole = "mixed-whole-" + variant, split = "mixed-split-" + variant;
    ASSERT_EQ(run_train_job(world.config(whole, reset_sets(more)), quiet()), kExitOk) << variant;
    JobOptions stop = quiet();
    stop.stop_after_steps = 3;
    ASSERT_EQ(run_train_job(world.config(split, reset_sets(more)), stop), kExitRequeue) << variant;
    stop.stop_after_steps = 6;
    ASSERT_EQ(run_train_job(world.config(split, reset_sets(more)), stop), kExitRequeue) << variant;
    ASSERT_EQ(run_train_job(world.config(split, reset_sets(more)), quiet()), kExitOk) << variant;
    const auto a = records(world.dir(whole), "metrics.jsonl");
    const auto b = records(world.dir(split), "metrics.jsonl");
    ASSERT_EQ(a.size(), 12u) << variant;
    ASSERT_EQ(a.size(), b.size()) << variant;
    for (size_t i = 0; i < a.size(); ++i)
      for (const char* key : {"loss", "kl", "ce", "grad_norm", "lr"})
        EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>()) << variant << " " << key << " at step " << i;
    const auto sa = load_student((world.dir(whole) / "final" / "student.safetensors").string());
    const auto sb = load_student((world.dir(split) / "final" / "student.safetensors").string());
    EXPECT_EQ(sa->parameter_checksum(), sb->parameter_checksum()) << variant;
    // The file holds the fp32 masters, and says the student computes in bf16.
    EXPECT_EQ(sa->depth(), 3) << variant;
    for (const auto& item : sa->named_parameters()) EXPECT_EQ(item.value().scalar_type(), at::kFloat) << item.key();
    EXPECT_EQ(sa->spec().compute(), at::kBFloat16) << variant;
  }
}

// bf16-mixed against fp32 on the same run (growth 1 -> 2 -> 3 blocks, 9 steps). Per-step rounding
// differences compound through the updates, which no closed form bounds honestly; so this test
// asserts what a user checks, with a stated (not derived) bound, and docs/model.md records the
// measured gap: both runs learn (the last three steps' mean loss below the first three's by more
// than 5%), and at every step bf16-mixed is within 5% of fp32's loss. Step 0 differs only by the
// forward's rounding (8-bit significands, relative 2^-8 per rounding, a few dozen roundings deep):
// far inside 5%. A mixed run whose updates were lost, or that trained another model, leaves the
// fp32 curve or stops learning.
TEST(Trainer, Bf16MixedLossCurveTracksFp32) {
  TinyWorld world;
  std::vector<std::vector<double>> curves;
  for (const std::string precision : {"fp32", "bf16-mixed"}) {
    ASSERT_EQ(run_train_job(world.config("curve-" + precision, {"student.precision=" + precision}), quiet()), kExitOk);
    std::vector<double> curve;
    for (const auto& m : records(world.dir("curve-" + precision), "metrics.jsonl")) curve.push_back(m["loss"].get<double>());
    ASSERT_EQ(curve.size(), 9u);
    curves.push_back(curve);
  }
  for (const auto& c : curves) EXPECT_LT((c[6] + c[7] + c[8]) / 3, 0.95 * (c[0] + c[1] + c[2]) / 3);
  for (size_t i = 0; i < curves[0].size(); ++i) {
    EXPECT_LE(std::abs(curves[1][i] - curves[0][i]), 0.05 * curves[0][i]) << "step " << i;
    std::printf("step %zu loss fp32 %.6f bf16-mixed %.6f rel %+.2e\n", i, curves[0][i], curves[1][i],
                (curves[1][i] - curves[0][i]) / curves[0][i]);
  }
}

}  // namespace
}  // namespace deepen
