// Intra-op thread count for LibTorch, set explicitly because LibTorch may start with one thread.
#pragma once

#include <cstdint>
#include <string>

namespace deepen {

// The cores this process may run on: its CPU affinity, where mpirun's and srun's binding shows.
int64_t allowed_cores();

// n = 0 uses every core this process may run on (allowed_cores()). Returns the count in force
// afterwards.
int64_t set_compute_threads(int64_t n);

// A one-line warning when `threads` compute threads must share fewer `cores`, else "". `who` names
// the process ("rank 1"). Such threads take turns on a core and wait for each other at every
// parallel region's end: a silent 2x slowdown, as mpirun gives when it binds each of 2 ranks to one
// core (its default for 2 or fewer ranks).
// Example: threads 2, cores 1 -> "deepen: warning: rank 1: run.threads = 2, but its CPU affinity
// allows 1 core: the threads take turns (steps up to 2.0x slower). mpirun binds ..."; 2 on 2 -> "".
std::string thread_binding_warning(const std::string& who, int64_t threads, int64_t cores);

// set_compute_threads(n), then the warning above (on stderr) when it applies.
int64_t set_compute_threads_checked(int64_t n, const std::string& who);

}  // namespace deepen
