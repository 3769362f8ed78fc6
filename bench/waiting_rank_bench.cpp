// waiting_rank_bench: what a rank that waits costs a rank beside it that computes. Rank 0 does a
// fixed amount of fp32 GEMM work with --threads threads while rank 1 waits for its one-byte "done"
// message, polling MPI as deepen's waits do (a teacher waiting for room in its channel while its
// student computes a step). Three ways to wait, alternated in the same run:
//   idle      one poll every 100 ms: the baseline, a waiter that costs the computing rank nothing
//   fixed-50  a 50 µs sleep between polls after 2 ms (deepen's wait before dist/wait_backoff.h)
//   backoff   WaitBackoff (dist/wait_backoff.h): the sleep grows to 1 ms
// Prints rank 0's median time per way and its ratio to idle, and rank 1's CPU use while it waits.
// Run unbound, as a workstation or an oversubscribed test runs its ranks:
//   mpirun -np 2 --bind-to none build/bench/waiting_rank_bench [--threads 2] [--size 1024] [--gemms 60] [--reps 5]
#include <mpi.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "dist/mpi_session.h"
#include "dist/wait_backoff.h"

using deepen::median;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

enum class Way { kIdle, kFixed50, kBackoff };
const char* name(Way w) { return w == Way::kIdle ? "idle" : w == Way::kFixed50 ? "fixed-50" : "backoff"; }

// Rank 1: waits for rank 0's message the given way; returns the CPU share of one core it used.
double wait_for_done(Way way) {
  char done = 0;
  MPI_Request req;
  MPI_Irecv(&done, 1, MPI_CHAR, 0, 7, MPI_COMM_WORLD, &req);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  deepen::WaitBackoff backoff;
  int flag = 0;
  while (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag) {
    if (way == Way::kIdle) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } else if (way == Way::kBackoff) {
      backoff.pause();
    } else {  // the old wait: spin 50 µs, yield to 2 ms, then 50 µs sleeps
      const double waited = seconds_since(t0);
      if (waited < 50e-6) continue;
      if (waited < 2e-3) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return (process_cpu_seconds() - cpu0) / seconds_since(t0);
}

// Rank 0: the fixed work, timed; then tells rank 1.
double compute(const at::Tensor& a, const at::Tensor& b, int gemms) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  at::Tensor c;
  for (int i = 0; i < gemms; ++i) c = at::mm(a, b);
  const double s = seconds_since(t0);
  char done = 1;
  MPI_Send(&done, 1, MPI_CHAR, 1, 7, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  deepen::MpiSession mpi(&argc, &argv);
  CLI::App app{"waiting_rank_bench: the cost of a polling waiter to the rank that computes beside it"};
  int threads = 2, size = 1024, gemms = 60, reps = 5;
  app.add_option("--threads", threads, "compute threads of rank 0 (run.threads)");
  app.add_option("--size", size, "square fp32 GEMM size");
  app.add_option("--gemms", gemms, "GEMMs per timed piece of work");
  app.add_option("--reps", reps, "rounds of the three ways, alternated");
  CLI11_PARSE(app, argc, argv);
  if (mpi.size() != 2) {
    if (mpi.rank() == 0) std::fprintf(stderr, "waiting_rank_bench: run it with mpirun -np 2\n");
    return 2;
  }
  at::set_num_threads(mpi.rank() == 0 ? threads : 1);
  const at::Tensor a = at::randn({size, size}), b = at::randn({size, size});
  const std::vector<Way> ways = {Way::kIdle, Way::kFixed50, Way::kBackoff};
  std::vector<std::vector<double>> time(ways.size()), cpu(ways.size());
  if (mpi.rank() == 0) compute(a, b, gemms / 4 + 1);  // warm-up, rank 1 idles
  else wait_for_done(Way::kIdle);
  for (int r = 0; r < reps; ++r)
    for (size_t w = 0; w < ways.size(); ++w) {
      if (mpi.rank() == 0) {
        time[w].push_back(compute(a, b, gemms));
      } else {
        const double share = wait_for_done(ways[w]);
        MPI_Send(&share, 1, MPI_DOUBLE, 0, 8, MPI_COMM_WORLD);
      }
      if (mpi.rank() == 0) {
        double share = 0;
        MPI_Recv(&share, 1, MPI_DOUBLE, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        cpu[w].push_back(share);
      }
    }
  if (mpi.rank() == 0) {
    std::printf("rank 0: %d GEMMs %dx%d fp32 on %d threads; rank 1 waits for it (%d rounds, ways alternated)\n", gemms,
                size, size, threads, reps);
    const double base = median(time[0]);
    for (size_t w = 0; w < ways.size(); ++w)
      std::printf("  %-9s rank 0 %.3f s (%.3fx idle), rank 1 waiting uses %.1f%% of a core\n", name(ways[w]),
                  median(time[w]), median(time[w]) / base, 100.0 * median(cpu[w]));
  }
  return 0;
}
