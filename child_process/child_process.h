// Child processes: spawn a program (this binary, mpirun, gnuplot), forward stop signals, wait.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace deepen {

// A command line and the environment variables to add to (or replace in) the parent's environment.
struct ProcessSpec {
  std::vector<std::string> argv;                            // argv[0] is looked up in PATH if it has no '/'
  std::vector<std::pair<std::string, std::string>> env;     // extra NAME=value
  std::string log_path;                                     // "" = inherit stdout/stderr; else append both there
};

// Runs the process to completion and returns its exit code (128 + signal number when it was killed
// by a signal, like a shell). While it runs, SIGINT/SIGTERM/SIGUSR1 delivered to this process are
// forwarded to the child's process group, so a coordinated stop reaches every rank of an mpirun
// job. Throws std::runtime_error when the program cannot be started at all.
// `poll`, when given, is called about every `poll_s` seconds while the child runs (progress lines).
int run_process(const ProcessSpec& spec, const std::function<void()>& poll = {}, double poll_s = 1.0);

// The running executable (/proc/self/exe resolved), so children are the very same build.
std::string self_executable();

// Absolute path of a program found in PATH, or "" when there is none.
std::string find_in_path(const std::string& program);

// The command line as a shell would print it ('quoted' where needed), for plans and logs.
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace deepen
