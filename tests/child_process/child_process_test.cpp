// The child-process runner: exit codes as a shell gives them, logs, environment, quoting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "child_process/child_process.h"
#include "tests/test_support.h"

namespace deepen {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ChildProcess, ExitCodeIsTheChildsAndASignalIs128PlusItsNumber) {
  EXPECT_EQ(run_process({{"sh", "-c", "exit 0"}}), 0);
  EXPECT_EQ(run_process({{"sh", "-c", "exit 3"}}), 3);  // the requeue code reaches the study runner
  EXPECT_EQ(run_process({{"sh", "-c", "kill -9 $$"}}), 128 + 9);
  EXPECT_THROW(run_process({{"/nonexistent/deepen"}}), std::runtime_error);
}

TEST(ChildProcess, LogGetsBothStreamsAppendedAndTheEnvironmentIsAdded) {
  const std::string log = (test::scratch_dir("child_process", "log") / "run.log").string();
  std::ofstream(log) << "before\n";
  ProcessSpec spec{{"sh", "-c", "echo out $DEEPEN_X; echo err >&2"}, {{"DEEPEN_X", "42"}}, log};
  ASSERT_EQ(run_process(spec), 0);
  EXPECT_EQ(read_all(log), "before\nout 42\nerr\n");
}

TEST(ChildProcess, PollRunsWhileTheChildRuns) {
  int polls = 0;
  ASSERT_EQ(run_process({{"sh", "-c", "sleep 0.5"}}, [&] { ++polls; }, 0.05), 0);
  EXPECT_GE(polls, 2);
}

TEST(ChildProcess, ShellQuotingReadsBackAsTheSameWords) {
  EXPECT_EQ(shell_quote("plain/path-1.toml"), "plain/path-1.toml");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  // What the shell makes of the joined line is the argv we started from.
  const std::vector<std::string> argv = {"printf", "%s|", "a b", "it's", "$HOME", ""};
  const std::string out = (test::scratch_dir("child_process", "quote") / "out").string();
  ASSERT_EQ(run_process({{"sh", "-c", shell_join(argv) + " > " + shell_quote(out)}}), 0);
  EXPECT_EQ(read_all(out), "a b|it's|$HOME||");
}

TEST(ChildProcess, FindsProgramsInPathAndNamesNoneForAMissingOne) {
  EXPECT_FALSE(find_in_path("sh").empty());
  EXPECT_TRUE(std::filesystem::path(find_in_path("sh")).is_absolute());
  EXPECT_EQ(find_in_path("deepen-no-such-program"), "");
}

}  // namespace
}  // namespace deepen
