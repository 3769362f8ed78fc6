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

// The process exit codes a launcher or Slurm script can rely on.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // a bug, a dead peer, an I/O error
inline constexpr int kExitBadInput = 2;  // InputError
inline constexpr int kExitRequeue = 3;   // coordinated stop after SIGTERM/SIGUSR1: requeue me

// Thrown by a command whose outcome must reach the exit code without being an error (a run that
// stopped with a checkpoint exits kExitRequeue); main returns `code`.
struct ExitRequest {
  int code;
  explicit ExitRequest(int c) : code(c) {}
};

}  // namespace deepen
