// Slurm scripts: bash -n on each, dry runs under a fake Slurm environment (rank -> node -> role map,
// coordinator, command), bad allocations, node list expansion, and the
// preemption path with fake srun/scontrol: SIGUSR1 -> forwarded -> exit 3 -> scontrol requeue.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <gtest/gtest.h>

#include "config/config.h"
#include "dist/rank_layout.h"
#include "tests/control/control_test_util.h"
#include "tests/test_paths.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;
using test::TestProcess;

std::string slurm_dir() { return std::string(test::kSourceDir) + "/slurm"; }

// A scratch folder with a config (1 pipeline x 4 stages + 12 students = 16 ranks) and fake
// srun/scontrol on PATH that log their arguments.
struct SlurmSandbox {
  fs::path dir;
  SlurmSandbox() {
    dir = fs::temp_directory_path() / ("deepen_slurm_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir / "bin");
    std::ofstream(dir / "run.toml") << "[run]\nname = \"x\"\nout_dir = \"" << (dir / "runs/x").string()
                                    << "\"  # where checkpoints go\n[parallel]\nteacher_pipelines = 1\n"
                                       "teacher_stages = 4 # stages\nstudents = 12\n";
  }
  ~SlurmSandbox() { fs::remove_all(dir); }
  // A fake executable `name` with the given bash body.
  void fake(const std::string& name, const std::string& body) {
    const fs::path p = dir / "bin" / name;
    std::ofstream(p) << "#!/usr/bin/env bash\n" << body << "\n";
    fs::permissions(p, fs::perms::owner_all);
  }
  // Like the real one for `show hostnames`; logs every other call (requeue).
  void fake_scontrol() {
    fake("scontrol", "if [[ $1 == show ]]; then source " + slurm_dir() +
                         "/lib.sh; DEEPEN_DRY_RUN=1 deepen_expand_nodelist \"$3\"; exit; fi\n"
                         "echo \"$@\" >> " + (dir / "scontrol.log").string());
  }
  std::map<std::string, std::string> env(bool dry) const {
    return {{"DEEPEN_DRY_RUN", dry ? "1" : ""},
            {"SLURM_JOB_NODELIST", "node[01-04]"},
            {"SLURM_NTASKS", "16"},
            {"SLURM_TASKS_PER_NODE", "4(x4)"},
            {"SLURM_JOB_ID", "123"},
            {"SLURM_JOB_NAME", "deepen"},
            {"SLURM_SUBMIT_DIR", dir.string()},
            {"SLURM_RESTART_COUNT", ""},
            {"SLURM_ARRAY_TASK_ID", ""},
            {"DEEPEN_RUN_DIR", ""},
            {"DEEPEN_HOME", ""},  // hermetic: nothing from the caller's shell
            {"DEEPEN_CMD", ""},
            {"DEEPEN_LAUNCHER", ""},
            {"DEEPEN_COORDINATOR_PORT", ""},
            {"DEEPEN_MAX_RESTARTS", ""},
            {"DEEPEN_TASKS_PER_NODE", ""},
            {"SLURM_NTASKS_PER_NODE", ""},
            {"SLURM_CPUS_PER_TASK", ""},
            {"SLURM_JOB_GPUS", ""},  // no GPUs unless a test gives some
            {"SLURM_GPUS_ON_NODE", ""},
            {"SLURM_GPUS_PER_NODE", ""},
            {"SLURM_GPUS", ""},
            {"DEEPEN_GPU", ""},
            {"NCCL_DEBUG", ""},
            {"DEEPEN_BIN", "/bin/true"},
            {"PATH", (dir / "bin").string() + ":" + std::getenv("PATH")}};
  }
  std::string log(const std::string& name) const { return TestProcess::slurp((dir / (name + ".log")).string()); }
};

struct Ran {
  int code = -1;
  std::string out, err;
};

Ran run_script(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
               const std::string& tag) {
  TestProcess p(argv, env, tag);
  Ran r;
  r.code = p.wait_exit(30).value_or(-1);
  r.out = p.out();
  r.err = p.err();
  return r;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(SlurmScripts, EveryScriptPassesBashSyntaxCheck) {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(slurm_dir())) {
    const std::string path = entry.path().string();
    if (!entry.path().has_extension() ||
        (entry.path().extension() != ".sbatch" && entry.path().extension() != ".sh")) {
      continue;
    }
    const Ran r = run_script({"bash", "-n", path}, {}, "bash_n_" + entry.path().filename().string());
    EXPECT_EQ(r.code, 0) << path << ": " << r.err;
    std::ifstream in(path);
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    EXPECT_EQ(first, "#!/usr/bin/env bash") << path;
    EXPECT_EQ(second.rfind("# ", 0), 0u) << path << " must say what it is for in its first comment line";
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(SlurmScripts, DryRunPrintsTheRankToNodeMapCoordinatorAndSrunCommand) {
  SlurmSandbox box;
  const Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string(), "--set",
                            "optim.lr=1e-4"},
                           box.env(true), "dry_run");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  // Block distribution: 4 tasks per node; teachers (4 stages) fill node01, students the rest.
  EXPECT_TRUE(has(r.out, "rank 0 -> node01 (teacher p0 s0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 3 -> node01 (teacher p0 s3)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 4 -> node02 (student 0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 15 -> node04 (student 11)\n")) << r.out;
  EXPECT_FALSE(has(r.out, "rank 16 "));
  EXPECT_FALSE(has(r.err, "warning")) << r.err;
  const std::string run_dir = (box.dir / "runs/x").string();
  EXPECT_TRUE(has(r.out, "env: DEEPEN_COORDINATOR=node01 DEEPEN_JOB_SECRET_FILE=" + run_dir +
                             "/control/job_secret DEEPEN_RUN_DIR=" + run_dir + "\n")) << r.out;
  EXPECT_TRUE(has(r.out, "command: srun --mpi=pmix --kill-on-bad-exit=0 --distribution=block:block "
                         "--cpu-bind=cores --export=ALL /bin/true train " + (box.dir / "run.toml").string() +
                         " --set run.out_dir=" + run_dir + " --set optim.lr=1e-4\n")) << r.out;
  EXPECT_FALSE(fs::exists(run_dir)) << "a dry run must not write anything";
}

TEST(SlurmScripts, DryRunWithMpirunAndFixedPortAndOverriddenLayout) {
  SlurmSandbox box;
  auto env = box.env(true);
  env["DEEPEN_LAUNCHER"] = "mpirun";
  env["DEEPEN_COORDINATOR_PORT"] = "29500";
  env["SLURM_TASKS_PER_NODE"] = "";
  env["SLURM_NTASKS_PER_NODE"] = "4";
  env["SLURM_CPUS_PER_TASK"] = "8";  // each rank bound to its 8 cores, not to one
  // 2 pipelines x 2 stages: still 4 teacher ranks on node01; students 12.
  const Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string(), "--set",
                            "parallel.teacher_pipelines=2", "--set=parallel.teacher_stages=2"},
                           env, "dry_mpirun");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(has(r.out, "rank 2 -> node01 (teacher p1 s0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 4 -> node02 (student 0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "DEEPEN_COORDINATOR=node01:29500 ")) << r.out;
  EXPECT_TRUE(has(r.out, "command: mpirun -np 16 --map-by ppr:4:node:PE=8 --bind-to core:overload-allowed ")) << r.out;
}

// A job with GPUs asks for them explicitly: run.device = cuda and parallel.backend = nccl where the
// config says "auto", so a rank whose GPU or NCCL is missing fails at start (deepen's InputError)
// instead of training on the CPU; NCCL reports its warnings (NCCL_DEBUG=WARN) unless told otherwise.
TEST(SlurmScripts, GpuJobAsksForCudaAndNcclAndNcclWarnings) {
  SlurmSandbox box;
  auto env = box.env(true);
  env["SLURM_GPUS_ON_NODE"] = "4";
  env["NCCL_SOCKET_IFNAME"] = "ib0";
  box.fake("nvidia-smi", "exit 0");  // a GPU node: NVIDIA's driver tools are installed
  const Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, env, "dry_gpu");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(has(r.out, " --set run.device=cuda --set parallel.backend=nccl\n")) << r.out;
  EXPECT_TRUE(has(r.out, "nccl env: NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=ib0\n")) << r.out;
  EXPECT_TRUE(has(r.err, "GPU job")) << r.err;

  // mpirun passes NCCL_DEBUG to the ranks too.
  env["DEEPEN_LAUNCHER"] = "mpirun";
  const Ran m = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, env, "dry_gpu_mpirun");
  ASSERT_EQ(m.code, 0) << m.err << m.out;
  EXPECT_TRUE(has(m.out, " -x NCCL_DEBUG ")) << m.out;
}

TEST(SlurmScripts, ExplicitDeviceAndBackendChoicesAndCpuJobsAreLeftAlone) {
  SlurmSandbox box;
  auto env = box.env(true);
  env["SLURM_JOB_GPUS"] = "0,1,2,3";
  box.fake("nvidia-smi", "exit 9");  // installed, even if broken: still a GPU node
  // The config's (or the command line's) explicit choice is kept: MPI staging may be wanted.
  const Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string(), "--set",
                            "parallel.backend=mpi"},
                           env, "dry_gpu_mpi");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(has(r.out, " --set run.device=cuda --set parallel.backend=mpi\n")) << r.out;
  EXPECT_FALSE(has(r.out, "parallel.backend=nccl")) << r.out;
  // DEEPEN_GPU=0: nothing added, NCCL_DEBUG still WARN.
  env["DEEPEN_GPU"] = "0";
  const Ran off = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, env, "dry_gpu_off");
  ASSERT_EQ(off.code, 0) << off.err << off.out;
  EXPECT_FALSE(has(off.out, "run.device")) << off.out;
  EXPECT_TRUE(has(off.out, "nccl env: NCCL_DEBUG=WARN\n")) << off.out;
}

// The Slurm test cluster grants fake GPUs (gres on empty files) to CPU jobs: without NVIDIA's
// driver tools on the node the job is not taken for a GPU job and its CPU config runs as it says.
TEST(SlurmScripts, GpusGrantedWithoutNvidiaToolsLeaveTheConfigAlone) {
  SlurmSandbox box;
  auto env = box.env(true);
  env["SLURM_GPUS_ON_NODE"] = "4";
  env["PATH"] = (box.dir / "bin").string() + ":/usr/bin:/bin";  // no nvidia-smi
  if (std::system("PATH=/usr/bin:/bin command -v nvidia-smi > /dev/null 2>&1") == 0)
    GTEST_SKIP() << "nvidia-smi is installed in /usr/bin here";
  const Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, env, "dry_fake_gpus");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_FALSE(has(r.out, "run.device")) << r.out;
  EXPECT_FALSE(has(r.err, "GPU job")) << r.err;
}

// sbatch runs a copy of the script from its spool folder: it must find slurm/lib.sh and the
// checkout through SLURM_SUBMIT_DIR (or DEEPEN_HOME), not next to itself.
TEST(SlurmScripts, ScriptRunFromTheSpoolFindsTheCheckoutThroughTheSubmitDir) {
  SlurmSandbox box;
  fs::create_directories(box.dir / "spool");
  fs::copy_file(slurm_dir() + "/run.sbatch", box.dir / "spool" / "slurm_script");
  auto env = box.env(true);
  env["SLURM_SUBMIT_DIR"] = test::kSourceDir;
  env["DEEPEN_BIN"] = "";
  Ran r = run_script({"bash", (box.dir / "spool" / "slurm_script").string(), (box.dir / "run.toml").string()}, env,
                     "spool");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, std::string(" ") + test::kSourceDir + "/build/deepen train ")) << r.out;
  env["SLURM_SUBMIT_DIR"] = box.dir.string();  // submitted from elsewhere, and no DEEPEN_HOME
  env["DEEPEN_HOME"] = "";
  r = run_script({"bash", (box.dir / "spool" / "slurm_script").string(), (box.dir / "run.toml").string()}, env,
                 "spool_lost");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "cannot find slurm/lib.sh (set DEEPEN_HOME)")) << r.err;
}

TEST(SlurmScripts, MixedNodesWarnAndWrongRankCountsFailWithCode2) {
  SlurmSandbox box;
  const std::string config = (box.dir / "run.toml").string();
  Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", config, "--set", "parallel.teacher_stages=2", "--set",
                      "parallel.students=14"},
                     box.env(true), "mixed");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "rank 2 -> node01 (student 0)\n")) << r.out;
  EXPECT_TRUE(has(r.err, "warning: node node01 holds both teacher and student ranks")) << r.err;

  r = run_script({"bash", slurm_dir() + "/run.sbatch", config, "--set", "parallel.students=10"}, box.env(true),
                 "wrong_count");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, config + ": parallel.teacher_pipelines * teacher_stages + students = 1 * 4 + 10 = 14 "
                              "ranks, but the allocation has 16 tasks")) << r.err;

  auto env = box.env(true);
  env["SLURM_JOB_NODELIST"] = "";
  r = run_script({"bash", slurm_dir() + "/run.sbatch", config}, env, "no_slurm");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "SLURM_JOB_NODELIST and SLURM_NTASKS are not set")) << r.err;

  r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "missing.toml").string()}, box.env(true),
                 "missing");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "missing.toml: no such config file")) << r.err;
}

// parallel.rank_order = "pipelines": each pipeline's stages, then its students; with 4 tasks per
// node and 2 stages + 2 students per pipeline, each node holds one pipeline and its students, and
// that mix is the point, not a warning.
TEST(SlurmScripts, PipelinesOrderPutsEachPipelineOnItsStudentsNode) {
  SlurmSandbox box;
  const Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string(), "--set",
                            "parallel.teacher_pipelines=4", "--set", "parallel.teacher_stages=2", "--set",
                            "parallel.students=8", "--set", "parallel.rank_order=\"pipelines\""},
                           box.env(true), "pipelines");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(has(r.out, "rank 0 -> node01 (teacher p0 s0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 -> node01 (teacher p0 s1)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 2 -> node01 (student 0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 3 -> node01 (student 1)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 4 -> node02 (teacher p1 s0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 14 -> node04 (student 6)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 15 -> node04 (student 7)\n")) << r.out;
  EXPECT_FALSE(has(r.err, "warning")) << r.err;
  // In the roles order, 6 teacher ranks on nodes of 4 leave node02 mixed: the warning names the
  // other order and the tasks per node it needs (6 stages + 10 students = 16).
  const Ran roles = run_script({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string(), "--set",
                                "parallel.teacher_stages=6", "--set", "parallel.students=10"},
                               box.env(true), "roles_mixed");
  ASSERT_EQ(roles.code, 0) << roles.err;
  EXPECT_TRUE(has(roles.err, "warning: node node02 holds both teacher and student ranks")) << roles.err;
  EXPECT_TRUE(has(roles.err, "or set parallel.rank_order = \"pipelines\" with tasks per node a multiple of 16")) << roles.err;
}

// Pipelines order whose groups do not fit the nodes: 2 stages + 6 students per pipeline on nodes of
// 4 tasks puts students 2..5 (ranks 4..7) on node02, away from pipeline 0's last stage on node01.
TEST(SlurmScripts, PipelinesOrderWarnsAboutStudentsAwayFromTheirLastStageAndRejectsAnUnknownOrder) {
  SlurmSandbox box;
  const std::string config = (box.dir / "run.toml").string();
  Ran r = run_script({"bash", slurm_dir() + "/run.sbatch", config, "--set", "parallel.teacher_pipelines=2", "--set",
                      "parallel.teacher_stages=2", "--set", "parallel.rank_order=pipelines"},
                     box.env(true), "pipelines_away");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(has(r.out, "rank 8 -> node03 (teacher p1 s0)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 10 -> node03 (student 6)\n")) << r.out;
  EXPECT_TRUE(has(r.err, "warning: pipeline 0's students (ranks 4 5 6 7) are not on node01 with its last stage "
                         "(rank 1): their logits cross the network; make the tasks per node a multiple of 8")) << r.err;
  EXPECT_TRUE(has(r.err, "warning: pipeline 1's students (ranks 12 13 14 15) are not on node03 with its last stage "
                         "(rank 9)")) << r.err;
  EXPECT_FALSE(has(r.err, "holds both teacher and student ranks")) << r.err;

  r = run_script({"bash", slurm_dir() + "/run.sbatch", config, "--set", "parallel.rank_order=diagonal"}, box.env(true),
                 "bad_order");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, config + ": parallel.rank_order: must be \"roles\" | \"pipelines\", got \"diagonal\""))
      << r.err;
}

// The script's role map is the trainer's: for several layouts in both orders, deepen_role_of gives
// every rank the role dist/rank_layout.h gives it.
TEST(SlurmScripts, RoleOfEveryRankMatchesTheRankLayoutInBothOrders) {
  std::string script = "source " + slurm_dir() + "/lib.sh\n";
  std::string want;
  for (const RankOrder order : {RankOrder::kRoles, RankOrder::kPipelines}) {
    for (auto [T, P, S] : {std::tuple{1, 3, 2}, {2, 2, 4}, {3, 1, 6}, {4, 2, 8}}) {
      ParallelConfig p;
      p.teacher_pipelines = T;
      p.teacher_stages = P;
      p.students = S;
      p.rank_order = order;
      const RankLayout l = make_rank_layout(p, T * P + S, 12);
      for (int r = 0; r < l.world_size; ++r) {
        script += "deepen_role_of " + std::to_string(r) + " " + std::to_string(T) + " " + std::to_string(P) + " " +
                  std::to_string(S) + " " + option_name(order) + "\n";
        const RankInfo& i = l.ranks[r];
        want += i.is_teacher() ? "teacher p" + std::to_string(i.pipeline) + " s" + std::to_string(i.stage) + "\n"
                               : "student " + std::to_string(i.student) + "\n";
      }
    }
  }
  const Ran r = run_script({"bash", "-c", script}, {}, "role_of");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, want);
}

TEST(SlurmScripts, EveryScriptPassesShellcheck) {
  if (std::system("command -v shellcheck > /dev/null 2>&1") != 0) GTEST_SKIP() << "shellcheck not installed";
  // From the checkout's root, so that the sbatch scripts' `# shellcheck source=slurm/lib.sh` is followed.
  const Ran r = run_script({"bash", "-c", "cd \"$0\" && exec shellcheck slurm/lib.sh slurm/run.sbatch slurm/study_array.sbatch",
                            test::kSourceDir},
                           {{"PATH", std::getenv("PATH")}}, "shellcheck");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// Slurm's compressed host lists, expanded as Slurm does (ranges, lists, zero padding, several groups).
TEST(SlurmScripts, NodeListExpansionFollowsSlurmsRules) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"node[01-04]", "node01 node02 node03 node04"},
      {"gpu[01-03,07],cpu5", "gpu01 gpu02 gpu03 gpu07 cpu5"},
      {"n[8-10]", "n8 n9 n10"},
      {"r[1-2]-n[1-2]", "r1-n1 r1-n2 r2-n1 r2-n2"},
      {"gpu-a[001-002,010],gpu-b7", "gpu-a001 gpu-a002 gpu-a010 gpu-b7"},
      {"b[098-101]", "b098 b099 b100 b101"},
      {"solo", "solo"}};
  for (const auto& [list, expected] : cases) {
    const Ran r = run_script({"bash", "-c", "source " + slurm_dir() + "/lib.sh && deepen_expand_nodelist \"$0\" | paste -sd' '", list},
                             {{"DEEPEN_DRY_RUN", "1"}}, "expand");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, expected + "\n") << list;
  }
}

TEST(SlurmScripts, StudyArrayRunsOneSeedOrOneListLinePerTask) {
  SlurmSandbox box;
  const std::string config = (box.dir / "run.toml").string();
  auto env = box.env(true);
  env["SLURM_ARRAY_TASK_ID"] = "3";
  Ran r = run_script({"bash", slurm_dir() + "/study_array.sbatch", config}, env, "array_seed");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string seed_dir = (box.dir / "runs/x/seed3").string();
  EXPECT_TRUE(has(r.out, "DEEPEN_RUN_DIR=" + seed_dir + "\n")) << r.out;
  EXPECT_TRUE(has(r.out, "--set run.out_dir=" + seed_dir + " --set run.seed=3\n")) << r.out;

  std::ofstream(box.dir / "study.list") << "# study\n" << config << " --set run.seed=1\n\n"
                                        << config << " --set parallel.teacher_pipelines=2 --set parallel.teacher_stages=2\n";
  env["SLURM_ARRAY_TASK_ID"] = "1";
  r = run_script({"bash", slurm_dir() + "/study_array.sbatch", (box.dir / "study.list").string()}, env, "array_list");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "rank 3 -> node01 (teacher p1 s1)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "--set parallel.teacher_pipelines=2 --set parallel.teacher_stages=2\n")) << r.out;
  env["SLURM_ARRAY_TASK_ID"] = "2";
  r = run_script({"bash", slurm_dir() + "/study_array.sbatch", (box.dir / "study.list").string()}, env, "array_past");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "array task 2, but the list has 2 runs")) << r.err;
}

// The real (not dry) path with fake srun and scontrol: SIGUSR1 to the batch shell reaches the
// launcher, whose ranks "stop" with code 3; the script requeues the job, writes the secret with
// mode 0600 and exports the control-plane variables to the ranks.
TEST(SlurmScripts, Sigusr1IsForwardedAndExitCode3RequeuesTheJob) {
  SlurmSandbox box;
  // The trap comes before srun.log, the marker the test waits for before it signals.
  box.fake("srun", "env | grep ^DEEPEN_ > " + (box.dir / "srun_env.log").string() +
                       "\ntrap 'echo USR1 >> " + (box.dir / "signals.log").string() + "; exit 3' USR1" +
                       "\necho \"$@\" > " + (box.dir / "srun.log").string() +
                       "\nfor i in $(seq 300); do sleep 0.1; done\nexit 0");
  box.fake_scontrol();
  TestProcess job({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, box.env(false), "usr1");
  ASSERT_TRUE(test::eventually([&] { return fs::exists(box.dir / "srun.log"); }, 20)) << job.err();
  job.signal(SIGUSR1);
  const auto code = job.wait_exit(20);
  ASSERT_TRUE(code.has_value()) << job.err();
  EXPECT_EQ(*code, 3) << job.err();
  EXPECT_EQ(box.log("signals"), "USR1\n");
  EXPECT_EQ(box.log("scontrol"), "requeue 123\n") << job.err();
  const std::string env = box.log("srun_env");
  const std::string run_dir = (box.dir / "runs/x").string();
  EXPECT_TRUE(has(env, "DEEPEN_COORDINATOR=node01\n")) << env;
  EXPECT_TRUE(has(env, "DEEPEN_JOB_SECRET_FILE=" + run_dir + "/control/job_secret\n")) << env;
  struct stat st{};
  ASSERT_EQ(::stat((run_dir + "/control/job_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(TestProcess::slurp(run_dir + "/control/job_secret").size(), 65u) << "64 hex digits and a newline";
}

TEST(SlurmScripts, CleanExitFailureAndSigtermDoNotRequeue) {
  for (const auto& [name, body, sig, want] :
       std::vector<std::tuple<std::string, std::string, int, int>>{
           {"clean", "exit 0", 0, 0},
           {"failure", "echo 'rank 2 died' >&2; exit 1", 0, 1},
           {"sigterm", "trap 'exit 3' TERM\nfor i in $(seq 300); do sleep 0.1; done", SIGTERM, 3}}) {
    SlurmSandbox box;
    // The marker the test waits for comes after the body's trap (if any): a signal sent once it
    // exists finds the trap set (written before it, the TERM could beat the trap: exit 143).
    const std::string marker = "echo started > " + (box.dir / "srun.log").string() + "\n";
    const bool traps = body.rfind("trap ", 0) == 0;
    const size_t first_line = body.find('\n') + 1;
    box.fake("srun", traps ? body.substr(0, first_line) + marker + body.substr(first_line) : marker + body);
    box.fake_scontrol();
    TestProcess job({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, box.env(false),
                    "norequeue_" + name);
    if (sig) {
      ASSERT_TRUE(test::eventually([&] { return fs::exists(box.dir / "srun.log"); }, 20)) << name;
      job.signal(sig);
    }
    const auto code = job.wait_exit(20);
    ASSERT_TRUE(code.has_value()) << name;
    EXPECT_EQ(*code, want) << name << ": " << job.err();
    EXPECT_EQ(box.log("scontrol"), "") << name << " must not requeue";
  }
}

TEST(SlurmScripts, RequeueStopsAfterMaxRestarts) {
  SlurmSandbox box;
  box.fake("srun", "exit 3");
  box.fake_scontrol();
  auto env = box.env(false);
  env["SLURM_RESTART_COUNT"] = "5";
  env["DEEPEN_MAX_RESTARTS"] = "5";
  TestProcess job({"bash", slurm_dir() + "/run.sbatch", (box.dir / "run.toml").string()}, env, "max_restarts");
  EXPECT_EQ(job.wait_exit(20), 3);
  EXPECT_EQ(box.log("scontrol"), "");
  EXPECT_TRUE(has(job.err(), "5 restarts already")) << job.err();
}

}  // namespace
}  // namespace deepen
