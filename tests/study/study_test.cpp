// Study files: parsing, expansion into run folders, dependency order, launch lines, resumability, Slurm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "config/input_error.h"
#include "curriculum/growth_schedule.h"
#include "run_folder/active_layer_tokens.h"
#include "run_folder/guard_events.h"
#include "run_folder/progress.h"
#include "study/local_runner.h"
#include "study/slurm_study.h"
#include "tests/study/study_base_toml.h"
#include "tests/test_paths.h"
#include "tests/test_support.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;

std::string scratch(const std::string& name) { return test::scratch_dir("study", name).string(); }

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

const std::string kBase = "[run]\nthreads = 1\n" + std::string(test::kStudyBaseToml);

// The paper's core runs plus the matched control listed FIRST, so ordering must move it.
const char* kStudy = R"(
[study]
name = "mini"
base = "base.toml"
out_dir = "OUT"
seeds = [1, 2]
set = ["eval.every=2"]

[[run]]
name = "post-joint-matched"
set = ["student.norm=post", "curriculum.mode=joint", "curriculum.stages=[3]", "curriculum.stage_steps=[]",
       "curriculum.budget=active_layer_tokens:post-grow"]

[[run]]
name = "pre-joint"
set = ["student.norm=pre", "curriculum.mode=joint", "curriculum.stages=[3]", "curriculum.stage_steps=[12]"]

[[run]]
name = "pre-grow"
set = ["student.norm=pre"]

[[run]]
name = "post-grow"
set = ["student.norm=post"]

[[run]]
name = "post-single"
set = ["student.norm=post", "student.layers=1", "curriculum.mode=joint", "curriculum.stages=[1]",
       "curriculum.stage_steps=[4]"]
seeds = [1]
)";

StudySpec mini_study(const std::string& dir) {
  write(fs::path(dir) / "base.toml", kBase);
  std::string text = kStudy;
  text.replace(text.find("OUT"), 3, dir + "/runs");
  write(fs::path(dir) / "study.toml", text);
  return load_study(dir + "/study.toml");
}

std::vector<std::string> ids(const StudyPlan& plan) {
  std::vector<std::string> out;
  for (const auto& j : plan.jobs) out.push_back(j.id());
  return out;
}

using test::error_of;

TEST(Study, ExpandsRunsTimesSeedsIntoFoldersWithNameOutDirAndSeedSet) {
  const std::string dir = scratch("expand");
  const StudySpec spec = mini_study(dir);
  EXPECT_EQ(spec.base, (fs::path(dir) / "base.toml").lexically_normal().string());
  const StudyPlan plan = expand_study(spec);
  ASSERT_EQ(plan.jobs.size(), 9u);  // 4 runs x 2 seeds + the single-block run's one seed
  for (const auto& j : plan.jobs) {
    EXPECT_EQ(j.config.run.name, j.run);
    EXPECT_EQ(j.config.run.seed, j.seed);
    EXPECT_EQ(j.config.run.out_dir, dir + "/runs/" + j.run + "/seed" + std::to_string(j.seed));
    EXPECT_EQ(j.out_dir, j.config.run.out_dir);
    EXPECT_EQ(j.config.eval.every, 2);  // the study-wide override reached every run
    EXPECT_EQ(j.world_size, 4);         // 1 pipeline x 2 stages + 2 students
  }
  const StudyJob& single = plan.jobs[4];
  EXPECT_EQ(single.id(), "post-single/seed1");
  EXPECT_EQ(single.config.student.layers, 1);
}

TEST(Study, MatchedRunComesAfterTheRunItTakesItsBudgetFromAndPointsAtItsFolderForTheSameSeed) {
  const std::string dir = scratch("order");
  const StudyPlan plan = expand_study(mini_study(dir));
  const std::vector<std::string> want = {"pre-joint/seed1", "pre-grow/seed1", "post-grow/seed1",
                                         "post-joint-matched/seed1", "post-single/seed1", "pre-joint/seed2",
                                         "pre-grow/seed2", "post-grow/seed2", "post-joint-matched/seed2"};
  EXPECT_EQ(ids(plan), want);
  const StudyJob& m1 = plan.jobs[3];
  EXPECT_EQ(m1.config.curriculum.budget, "active_layer_tokens:" + dir + "/runs/post-grow/seed1");
  ASSERT_EQ(m1.depends_on.size(), 1u);
  EXPECT_EQ(plan.jobs[m1.depends_on[0]].id(), "post-grow/seed1");
  const StudyJob& m2 = plan.jobs[8];
  EXPECT_EQ(m2.config.curriculum.budget, "active_layer_tokens:" + dir + "/runs/post-grow/seed2");
  EXPECT_EQ(plan.jobs[m2.depends_on[0]].id(), "post-grow/seed2");
}

TEST(Study, CommandLineSetsComeAfterTheRunsOwnAndOnlySelectsRuns) {
  const std::string dir = scratch("only");
  const StudyPlan plan = expand_study(mini_study(dir), {"optim.lr=0.01", "student.norm=pre"}, {"post-grow"});
  ASSERT_EQ(ids(plan), (std::vector<std::string>{"post-grow/seed1", "post-grow/seed2"}));
  EXPECT_DOUBLE_EQ(plan.jobs[0].config.optim.lr, 0.01);
  EXPECT_EQ(plan.jobs[0].config.student.norm, NormPlacement::kPre);  // --set wins over the run's own
  EXPECT_NE(error_of([&] { expand_study(mini_study(dir), {}, {"nope"}); }).find("--only nope"), std::string::npos);
}

TEST(Study, BadOverrideFailsBeforeAnythingRunsNamingTheRun) {
  const std::string dir = scratch("bad");
  StudySpec spec = mini_study(dir);
  spec.runs[1].sets.push_back("student.norm=sideways");
  const std::string e = error_of([&] { expand_study(spec); });
  EXPECT_NE(e.find("student.norm"), std::string::npos) << e;
  EXPECT_NE(e.find("pre-joint/seed1"), std::string::npos) << e;
}

TEST(Study, BudgetNamingARunWithoutThatSeedIsAnError) {
  const std::string dir = scratch("seedless");
  StudySpec spec = mini_study(dir);
  spec.runs[3].seeds = {1};  // post-grow only seed 1, but the matched run has seeds 1 and 2
  const std::string e = error_of([&] { expand_study(spec); });
  EXPECT_NE(e.find("post-joint-matched/seed2"), std::string::npos) << e;
  EXPECT_NE(e.find("no seed 2"), std::string::npos) << e;
}

TEST(Study, ParseErrorsNameFileAndKey) {
  EXPECT_NE(error_of([] { parse_study("[study]\nbase='b.toml'\nseedz=[1]\n[[run]]\nname='a'\n", "s.toml"); })
                .find("s.toml: study.seedz: unknown key"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_study("[study]\nbase='b.toml'\n", "s.toml"); }).find("at least one run"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_study("[study]\nbase='b.toml'\n[[run]]\nname='a/b'\n", "s.toml"); })
                .find("run[0].name"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_study("[study]\nbase='b.toml'\n[[run]]\nname='a'\n[[run]]\nname='a'\n", "s.toml"); })
                .find("duplicate"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_study("[study]\nlauncher='srun'\nbase='b'\n[[run]]\nname='a'\n", "s.toml"); })
                .find("study.launcher"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_study("[study]\nseeds=[]\nbase='b'\n[[run]]\nname='a'\n", "s.toml"); })
                .find("study.seeds"),
            std::string::npos);
}

TEST(Study, CycleOfBudgetReferencesIsAnError) {
  const std::string dir = scratch("cycle");
  write(fs::path(dir) / "base.toml", kBase);
  const std::string joint = "\"curriculum.mode=joint\", \"curriculum.stages=[3]\", \"curriculum.stage_steps=[]\", ";
  write(fs::path(dir) / "study.toml",
        "[study]\nbase='base.toml'\nout_dir='" + dir + "/runs'\n"
        "[[run]]\nname='a'\nset=[" + joint + "\"curriculum.budget=active_layer_tokens:b\"]\n"
        "[[run]]\nname='b'\nset=[" + joint + "\"curriculum.budget=active_layer_tokens:a\"]\n");
  EXPECT_NE(error_of([&] { expand_study(load_study(dir + "/study.toml")); }).find("cycle"), std::string::npos);
}

TEST(Study, LauncherDecision) {
  EXPECT_TRUE(use_mpirun(Launcher::kAuto, 4, true));
  EXPECT_FALSE(use_mpirun(Launcher::kAuto, 2, true));
  EXPECT_FALSE(use_mpirun(Launcher::kAuto, 4, false));
  EXPECT_FALSE(use_mpirun(Launcher::kDirect, 8, true));
  EXPECT_TRUE(use_mpirun(Launcher::kMpirun, 2, true));
  EXPECT_THROW(use_mpirun(Launcher::kMpirun, 4, false), InputError);
}

TEST(Study, ChildCommandLineRunsThisBinaryUnderMpirunWithRootEnvironment) {
  const std::string dir = scratch("launch");
  const StudyPlan plan = expand_study(mini_study(dir));
  LaunchContext ctx{"/x/deepen", "/usr/bin/mpirun", true, true};
  const ProcessSpec p = job_process(plan, plan.jobs[0], ctx);
  ASSERT_GE(p.argv.size(), 10u);
  // --bind-to none: mpirun would otherwise pin each rank of a small job to one core.
  EXPECT_EQ(std::vector<std::string>(p.argv.begin(), p.argv.begin() + 9),
            (std::vector<std::string>{"/usr/bin/mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4", "/x/deepen",
                                      "train", plan.spec.base}));
  EXPECT_EQ(p.argv.back(), "--quiet");
  EXPECT_NE(std::find(p.env.begin(), p.env.end(), std::make_pair(std::string("OMPI_ALLOW_RUN_AS_ROOT"), std::string("1"))),
            p.env.end());
  ctx.is_root = false;
  ctx.mpirun.clear();  // no mpirun: "auto" falls back to one process
  const ProcessSpec direct = job_process(plan, plan.jobs[0], ctx);
  EXPECT_EQ(direct.argv[0], "/x/deepen");
  EXPECT_TRUE(direct.env.empty());
}

TEST(Study, JobStateFollowsTheActiveLayerTokenRecordAndCheckpoints) {
  const std::string dir = scratch("state");
  EXPECT_EQ(job_state(dir + "/none"), JobState::kNew);
  fs::create_directories(dir + "/ck/checkpoints/step-4");
  EXPECT_EQ(job_state(dir + "/ck"), JobState::kPartial);
  write_active_layer_tokens(dir + "/inc", {100, 50, 2, false});
  EXPECT_EQ(job_state(dir + "/inc"), JobState::kPartial);
  write_active_layer_tokens(dir + "/done", {100, 50, 2, true});
  EXPECT_EQ(job_state(dir + "/done"), JobState::kPartial) << "complete, but no final/: its export did not end";
  write(dir + "/done/final/student.safetensors", "");
  EXPECT_EQ(job_state(dir + "/done"), JobState::kFinished);
  // The guard stopped a run after its newest checkpoint: diverged, until it trains past that step.
  fs::create_directories(dir + "/div/checkpoints/step_00000009");
  write_active_layer_tokens(dir + "/div", {100, 50, 10, false});
  write(dir + "/div/guard.jsonl", "{\"step\": 12, \"event\": \"stopped\", \"reason\": \"the loss is nan\", \"lr_scale\": 1}\n");
  EXPECT_EQ(job_state(dir + "/div"), JobState::kDiverged);
  EXPECT_TRUE(unretried_divergence(dir + "/div", "div", 1.0).has_value());
  EXPECT_FALSE(unretried_divergence(dir + "/div", "div", 0.5).has_value()) << "a lower LR is a retry";
  fs::create_directories(dir + "/div/checkpoints/step_00000014");
  EXPECT_EQ(job_state(dir + "/div"), JobState::kPartial) << "resumed at a lower LR and trained past the step";
}

// A fake `deepen` (a shell script) stands in for the trainer: it records its arguments and writes
// the finished record into run.out_dir, so the runner's order, skipping and exit codes are checked.
TEST(Study, RunnerSkipsFinishedRunsRunsTheRestInOrderAndStopsOnRequeue) {
  const std::string dir = scratch("runner");
  const StudyPlan plan = expand_study(mini_study(dir), {}, {"pre-grow", "post-grow", "post-joint-matched"});
  const std::string fake = dir + "/fake-deepen";
  write(fake,
        "#!/bin/bash\n"
        "out=''; for a in \"$@\"; do case $a in run.out_dir=*) out=${a#run.out_dir=}; out=${out//\\\"/};; esac; done\n"
        "echo \"$out\" >> " + dir + "/calls.txt\n"
        "if [ -e " + dir + "/stop-at ] && grep -q \"$(cat " + dir + "/stop-at)\" <<< \"$out\"; then exit 3; fi\n"
        "mkdir -p \"$out/final\" && touch \"$out/final/student.safetensors\" && "
        "echo '{\"active_layer_tokens\": 1, \"tokens\": 1, \"steps\": 1, \"complete\": true}' "
        "> \"$out/active_layer_tokens.json\"\n");
  fs::permissions(fake, fs::perms::owner_all);
  LaunchContext ctx{fake, "", false, true};
  // post-grow/seed1 already finished: not rerun.
  write_active_layer_tokens(dir + "/runs/post-grow/seed1", {1, 1, 1, true});
  write(dir + "/runs/post-grow/seed1/final/student.safetensors", "");
  write(dir + "/stop-at", "post-grow/seed2");
  EXPECT_EQ(run_study(plan, ctx), kExitRequeue);
  auto calls = [&] {
    std::ifstream in(dir + "/calls.txt");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l.substr(dir.size() + 6));
    return lines;
  };
  EXPECT_EQ(calls(), (std::vector<std::string>{"pre-grow/seed1", "post-joint-matched/seed1", "pre-grow/seed2",
                                               "post-grow/seed2"}));
  // Run again after the "preemption": finished runs are skipped, the stopped one and the rest run.
  fs::remove(dir + "/stop-at");
  EXPECT_EQ(run_study(plan, ctx), kExitOk);
  EXPECT_EQ(calls(), (std::vector<std::string>{"pre-grow/seed1", "post-joint-matched/seed1", "pre-grow/seed2",
                                               "post-grow/seed2", "post-grow/seed2", "post-joint-matched/seed2"}));
  for (const auto& j : plan.jobs) EXPECT_EQ(job_state(j.out_dir), JobState::kFinished) << j.id();
}

TEST(Study, OnlyWithAnUnfinishedDependencyOutsideTheSelectionIsAnError) {
  const std::string dir = scratch("only_dep");
  const StudyPlan plan = expand_study(mini_study(dir), {}, {"post-joint-matched"});
  EXPECT_TRUE(plan.jobs[0].depends_on.empty());
  LaunchContext ctx{"/bin/false", "", false, true};
  EXPECT_NE(error_of([&] { run_study(plan, ctx); }).find("has not finished"), std::string::npos);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

SlurmOptions slurm_options(const std::string& dir) {
  SlurmOptions o;
  o.deepen_exe = "/opt/deepen/build/deepen";
  o.deepen_home = test::kSourceDir;  // this checkout's slurm/study_array.sbatch
  o.workdir = dir;
  o.gpus_per_node = 8;
  return o;
}

// The run list goes through the control engineer's slurm/study_array.sbatch in its dry-run mode: the
// command it would start for the matched run must carry the resolved budget and the run folder.
TEST(Study, SlurmRunListDrivesStudyArraySbatchWithTheResolvedArguments) {
  const std::string dir = scratch("slurm_list");
  const StudyPlan plan = expand_study(mini_study(dir));
  write_slurm_study(plan, slurm_options(dir), dir + "/slurm");
  EXPECT_EQ(std::system(("bash -n " + dir + "/slurm/submit.sh").c_str()), 0);
  const std::string cmd = "cd " + dir + " && DEEPEN_DRY_RUN=1 DEEPEN_HOME=" + std::string(test::kSourceDir) +
                          " SLURM_ARRAY_TASK_ID=3 SLURM_JOB_NODELIST=node1 SLURM_NTASKS=4 SLURM_TASKS_PER_NODE=4 "
                          "bash " + std::string(test::kSourceDir) + "/slurm/study_array.sbatch " + dir +
                          "/slurm/study.list > " + dir + "/dry.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/dry.txt");
  const std::string out = read_file(dir + "/dry.txt");
  EXPECT_NE(out.find("rank 0 -> node1 (teacher p0 s0)"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 3 -> node1 (student 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("--set run.out_dir=" + dir + "/runs/post-joint-matched/seed1"), std::string::npos) << out;
  EXPECT_NE(out.find("curriculum.budget=\"active_layer_tokens:" + dir + "/runs/post-grow/seed1\""), std::string::npos)
      << out;
  EXPECT_NE(out.find("curriculum.stages=[3]"), std::string::npos) << out;
  // Whitespace inside a quoted value cannot travel through the whitespace-split list.
  StudySpec spec = mini_study(dir);
  spec.runs[0].sets.push_back("teacher.checkpoint=\"a b\"");
  EXPECT_NE(error_of([&] { slurm_scripts(expand_study(spec), slurm_options(dir), dir + "/s2"); }).find("whitespace"),
            std::string::npos);
}

// submit.sh under a fake sbatch: finished runs are skipped, the rest go in one array, and each
// matched run waits for exactly its own post-grow element (or nothing once that one finished).
TEST(Study, SlurmSubmitSkipsFinishedRunsAndDependsOnExactlyTheMatchedRunsElement) {
  const std::string dir = scratch("slurm_submit");
  const StudyPlan plan = expand_study(mini_study(dir));
  write_slurm_study(plan, slurm_options(dir), dir + "/slurm");
  write(dir + "/bin/sbatch",
        "#!/bin/bash\necho \"$*\" >> " + dir + "/sbatch.txt\nn=$(wc -l < " + dir + "/sbatch.txt)\necho $((100 + n))\n");
  fs::permissions(dir + "/bin/sbatch", fs::perms::owner_all);
  write_active_layer_tokens(dir + "/runs/post-grow/seed1", {1, 1, 1, true});
  write(dir + "/runs/post-grow/seed1/final/student.safetensors", "");  // index 2 finished
  const std::string cmd = "PATH=" + dir + "/bin:$PATH bash " + dir + "/slurm/submit.sh > " + dir + "/submit.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/submit.txt");
  std::vector<std::string> calls;
  std::ifstream in(dir + "/sbatch.txt");
  for (std::string l; std::getline(in, l);) calls.push_back(l);
  ASSERT_EQ(calls.size(), 3u) << read_file(dir + "/submit.txt");
  EXPECT_NE(calls[0].find("--array=0,1,4,5,6,7 --nodes=1 --ntasks=4 --ntasks-per-node=4 --gpus-per-node=4"),
            std::string::npos) << calls[0];
  EXPECT_NE(calls[0].find(std::string(test::kSourceDir) + "/slurm/study_array.sbatch " + dir + "/slurm/study.list"),
            std::string::npos) << calls[0];
  EXPECT_EQ(calls[1].find("--dependency"), std::string::npos) << calls[1];  // its post-grow finished
  EXPECT_NE(calls[1].find("--array=3 "), std::string::npos) << calls[1];
  EXPECT_NE(calls[2].find("--array=8 --dependency=afterok:101_7 "), std::string::npos) << calls[2];
  EXPECT_NE(read_file(dir + "/submit.txt").find("post-grow/seed1: finished, skipped"), std::string::npos);
}

// configs/demo/sweep.toml, a layout sweep: the global batch stays 16 while grad_accum follows the
// students, and on Slurm every layout becomes a job of its own size (4 GPUs per node: 5 to 7 ranks
// take 2 nodes).
TEST(Study, LayoutSweepKeepsTheGlobalBatchAndBecomesJobsOfDifferentNodeCounts) {
  const std::string dir = scratch("sweep");
  const StudyPlan plan = expand_study(load_study(std::string(test::kSourceDir) + "/configs/demo/sweep.toml"));
  ASSERT_EQ(plan.jobs.size(), 7u);
  for (const StudyJob& j : plan.jobs) {
    const ParallelConfig& p = j.config.parallel;
    EXPECT_EQ(p.students * p.micro_batch * p.grad_accum, 16) << j.id();
  }
  SlurmOptions o = slurm_options(dir);
  o.gpus_per_node = 4;
  write_slurm_study(plan, o, dir + "/slurm");
  write(dir + "/bin/sbatch",
        "#!/bin/bash\necho \"$*\" >> " + dir + "/sbatch.txt\nn=$(wc -l < " + dir + "/sbatch.txt)\necho $((100 + n))\n");
  fs::permissions(dir + "/bin/sbatch", fs::perms::owner_all);
  const std::string cmd = "PATH=" + dir + "/bin:$PATH bash " + dir + "/slurm/submit.sh > " + dir + "/submit.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/submit.txt");
  const std::string calls = read_file(dir + "/sbatch.txt");
  // 1x1+1 runs as one process; 1x2+2 and 2x1+2 share an array of 4-task jobs.
  for (const char* want : {"--array=0 --nodes=1 --ntasks=1 ", "--array=1 --nodes=1 --ntasks=3 ",
                           "--array=2,3 --nodes=1 --ntasks=4 ", "--array=4 --nodes=2 --ntasks=5 ",
                           "--array=5 --nodes=2 --ntasks=6 ", "--array=6 --nodes=2 --ntasks=7 "})
    EXPECT_NE(calls.find(want), std::string::npos) << want << "\n" << calls;
}

// A study running one T, P, S in both rank orders and both shardings: the plan's layout names tell
// the runs apart (config/layout_label.h), the default ones print as before.
TEST(Study, PlanNamesANonDefaultRankOrderAndShardingInTheLayout) {
  const std::string dir = scratch("layout_names");
  write(fs::path(dir) / "base.toml", kBase);
  write(fs::path(dir) / "study.toml", "[study]\nname = \"variants\"\nbase = \"base.toml\"\nout_dir = \"" + dir +
                                          "/runs\"\nseeds = [1]\n"
                                          "[[run]]\nname = \"roles\"\n"
                                          "[[run]]\nname = \"pipelines\"\nset = [\"parallel.rank_order=pipelines\"]\n"
                                          "[[run]]\nname = \"sharded\"\nset = [\"parallel.sharding=grad_op\"]\n");
  const StudyPlan plan = expand_study(load_study(dir + "/study.toml"));
  const std::string text = describe_plan(plan, LaunchContext{"/x/deepen", "", true, true});
  for (const char* want : {"roles/seed1  pre-norm grow [1,2,3], layout 1x2+2 = 4 ranks",
                           "pipelines/seed1  pre-norm grow [1,2,3], layout 1x2+2 pipelines = 4 ranks",
                           "sharded/seed1  pre-norm grow [1,2,3], layout 1x2+2 grad_op = 4 ranks"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
}

}  // namespace
}  // namespace deepen
