// Sets LibTorch's intra-op threads from the config or the process's CPU affinity.
#include "train/compute_threads.h"

#include <sched.h>

#include <cstdio>
#include <iostream>

#include <ATen/Parallel.h>

namespace deepen {

int64_t allowed_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

int64_t set_compute_threads(int64_t n) {
  if (n <= 0) n = allowed_cores();
  at::set_num_threads(static_cast<int>(n));
  return at::get_num_threads();
}

std::string thread_binding_warning(const std::string& who, int64_t threads, int64_t cores) {
  if (threads <= cores) return "";
  char slower[32];
  std::snprintf(slower, sizeof slower, "%.1f", static_cast<double>(threads) / static_cast<double>(cores));
  return "deepen: warning: " + who + ": run.threads = " + std::to_string(threads) + ", but its CPU affinity allows " +
         std::to_string(cores) + (cores == 1 ? " core" : " cores") + ": the threads take turns (steps up to " + slower +
         "x slower). mpirun binds each rank to one core when it starts 2 or fewer: run `mpirun --bind-to none`, give "
         "each rank cores (`--map-by ppr:N:node:PE=T`, Slurm `--cpus-per-task`), or lower run.threads";
}

int64_t set_compute_threads_checked(int64_t n, const std::string& who) {
  const int64_t threads = set_compute_threads(n);
  const std::string warning = thread_binding_warning(who, threads, allowed_cores());
  // One write: ranks share mpirun's output, and a line written in two parts can be split by another's.
  if (!warning.empty()) std::cerr << warning + "\n" << std::flush;
  return threads;
}

}  // namespace deepen
