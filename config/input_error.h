// InputError: bad user input (config, checkpoint, shard, tokenizer file, message); main exits 2.
#pragma once

#include <stdexcept>
#include <string>

namespace deepen {

// Thrown wherever input is wrong; the message names the file (and key or tensor) and the reason,
// e.g. "configs/x.toml: curriculum.stages: must end at student.layers = 9, got 6".
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

// The process exit codes a launcher or Slurm script can rely on (docs/cluster.md has the table of
// faults and the code each ends with). Every rank of a job that stops on one rank's reported error
// exits with that rank's code.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // a bug, a dead peer, an I/O error (a record or checkpoint not written)
inline constexpr int kExitBadInput = 2;  // InputError
inline constexpr int kExitRequeue = 3;   // coordinated stop after SIGTERM/SIGUSR1: requeue me
inline constexpr int kExitDiverged = 4;  // the divergence guard stopped the run (guard.action = "stop")
inline constexpr int kExitRollback = 5;  // the guard rolled back (guard.action = "rollback"): rerun me
// A rank or the coordinator went silent past control.watchdog_s with its connection still open: its
// node lost (powered off, crashed) or cut off the network, or its process frozen. Not the job's own
// fault, so the scripts requeue (bounded by DEEPEN_MAX_RESTARTS). A process that died on a live node
// closes its connection instead: kExitFailure.
inline constexpr int kExitUnreachable = 6;

// An error that ends the process with its own exit code (kExitDiverged, kExitRollback, or the code
// of another rank's reported error); main prints it as "deepen: error: <what>".
class ExitError : public std::runtime_error {
 public:
  ExitError(int code, const std::string& what) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Thrown by a command whose outcome must reach the exit code without being an error (a run that
// stopped with a checkpoint exits kExitRequeue); main returns `code`.
struct ExitRequest {
  int code;
  explicit ExitRequest(int c) : code(c) {}
};

}  // namespace deepen
