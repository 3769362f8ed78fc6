// The whole chain: slurm/run.sbatch with a fake srun starting ranks of this binary; SIGUSR1 to the
// batch shell ends in one coordinated stop and a requeue.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "config/input_error.h"
#include "tests/control/control_test_util.h"
#include "tests/control/loopback_job.h"
#include "tests/test_paths.h"

namespace deepen::control {
namespace {

using namespace test_support;

// slurm/run.sbatch (not a dry run) with a fake srun that starts 3 ranks of this binary on this
// machine: Slurm's SIGUSR1 to the batch shell -> forwarded to srun -> to every rank -> coordinated
// stop at one step -> every rank exits 3 -> srun exits 3 -> the script runs `scontrol requeue`.
TEST(ControlEndToEnd, Sigusr1ToTheBatchScriptStopsEveryRankAtOneStepAndRequeues) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("deepen_e2e_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "bin");
  auto write_exe = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir / "bin" / name) << "#!/usr/bin/env bash\n" << body << "\n";
    fs::permissions(dir / "bin" / name, fs::perms::owner_all);
  };
  write_exe("srun",  // starts SLURM_NTASKS ranks here, forwards signals, exits with the highest code
            "while [[ $1 == --* ]]; do shift; done  # srun's own options\n"
            // The traps first (they read pids when a signal comes): a signal never beats them.
            "pids=()\ntrap 'kill -USR1 \"${pids[@]}\" 2>/dev/null' USR1\ntrap 'kill -TERM \"${pids[@]}\" 2>/dev/null' TERM\n"
            "for ((r = 0; r < SLURM_NTASKS; r++)); do SLURM_PROCID=$r \"$@\" & pids+=($!); done\n"
            "rc=0\nfor p in \"${pids[@]}\"; do\n  while :; do wait \"$p\"; kill -0 \"$p\" 2>/dev/null || break; done\n"
            "  wait \"$p\" 2>/dev/null; c=$?; ((c > rc)) && rc=$c\ndone\nexit $rc");
  write_exe("scontrol", "if [[ $1 == show ]]; then echo \"$3\"; exit; fi\necho \"$@\" >> " +
                           (dir / "scontrol.log").string());  // `show hostnames localhost` -> localhost
  write_exe("deepen", "exec " + self_exe() + " --gtest_filter=ControlChild.DISABLED_Main --gtest_also_run_disabled_tests");
  std::ofstream(dir / "run.toml") << "[run]\nout_dir = \"" << (dir / "run").string()
                                  << "\"\n[parallel]\nteacher_pipelines = 1\nteacher_stages = 1\nstudents = 2\n";
  test::TestProcess job({"bash", std::string(test::kSourceDir) + "/slurm/run.sbatch", (dir / "run.toml").string()},
                        {{"SLURM_JOB_NODELIST", "localhost"}, {"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "3"},
                         {"SLURM_JOB_ID", "77"}, {"SLURM_RESTART_COUNT", ""}, {"DEEPEN_DRY_RUN", ""},
                         {"DEEPEN_HOME", ""}, {"DEEPEN_RUN_DIR", ""}, {"DEEPEN_COORDINATOR", ""},
                         {"DEEPEN_JOB_SECRET", ""}, {"DEEPEN_JOB_SECRET_FILE", ""}, {"DEEPEN_LAUNCHER", ""},
                         {"DEEPEN_BIN", (dir / "bin" / "deepen").string()}, {"DEEPEN_CONTROL_CHILD", "rank"},
                         {"PATH", (dir / "bin").string() + ":" + std::getenv("PATH")}},
                        "e2e");
  auto count = [](const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  ASSERT_TRUE(eventually([&] { return count(job.out(), "CHILD READY") == 3 || job.wait_exit(0); }, 30) &&
              !job.wait_exit(0))
      << job.out() << job.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the ranks take some steps
  job.signal(SIGUSR1);
  const auto code = job.wait_exit(30);
  ASSERT_TRUE(code.has_value()) << job.err();
  EXPECT_EQ(*code, kExitRequeue) << job.err();
  const std::string out = job.out();
  std::set<std::string> stops;
  for (size_t at = out.find("CHILD STOP "); at != std::string::npos; at = out.find("CHILD STOP ", at + 1)) {
    stops.insert(out.substr(at + 11, out.find('\n', at) - at - 11));
  }
  EXPECT_EQ(count(out, "CHILD STOP "), 3u) << out;
  ASSERT_EQ(stops.size(), 1u) << "ranks stopped at different steps:\n" << out;
  EXPECT_GT(std::stoll(*stops.begin()), 0);
  EXPECT_EQ(test::TestProcess::slurp((dir / "scontrol.log").string()), "requeue 77\n") << job.err();
  EXPECT_EQ(job.err().find("ABORT"), std::string::npos) << job.err();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deepen::control
