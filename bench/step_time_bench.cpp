// step_time_bench: what the per-step time breakdown (run_folder/step_time.h) costs, measured against
// the same work without it in the same run.
//   build/bench/step_time_bench [--size 256] [--ops 12] [--rounds 40]
// Prints the cost of one timed span (ns), then a step of `ops` matrix products of size × size timed
// part by part (one span per product, as the trainer times its parts) against the same step with
// no spans, alternating A and B so that drift in the machine hits both; the ratio is the overhead.
#include <chrono>
#include <cstdio>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "run_folder/step_time.h"

using deepen::median;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of deepen's per-step time breakdown"};
  int64_t size = 256, ops = 12, rounds = 40;
  app.add_option("--size", size, "matrix size of one product");
  app.add_option("--ops", ops, "products per step (one timed span each)");
  app.add_option("--rounds", rounds, "A/B rounds");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  deepen::StepTimer timer(deepen::student_time_parts());
  const int64_t spans = 2'000'000;
  volatile int64_t sink = 0;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < spans; ++i) timer.time(i % 10, [&] { sink = sink + 1; });
  const double per_span = seconds_since(t0) / static_cast<double>(spans);
  t0 = Clock::now();
  for (int64_t i = 0; i < spans; ++i) sink = sink + 1;
  const double per_bare = seconds_since(t0) / static_cast<double>(spans);
  std::printf("one timed span: %.1f ns (two steady_clock reads and an add; the bare loop %.1f ns)\n",
              1e9 * (per_span - per_bare), 1e9 * per_bare);

  const at::Tensor a = at::randn({size, size}), b = at::randn({size, size});
  at::Tensor c = at::empty({size, size});
  auto step = [&](bool timed) {
    const auto start = Clock::now();
    for (int64_t k = 0; k < ops; ++k) {
      if (timed) timer.time(static_cast<size_t>(k % 10), [&] { at::mm_out(c, a, b); });
      else at::mm_out(c, a, b);
    }
    if (timed) timer.take(0, "student");
    return seconds_since(start);
  };
  for (int w = 0; w < 5; ++w) step(w % 2 == 0);  // warm-up: allocator, BLAS threads
  std::vector<double> with, without;
  for (int64_t r = 0; r < rounds; ++r) {
    without.push_back(step(false));
    with.push_back(step(true));
  }
  const double mw = median(with), mo = median(without);
  std::printf("step of %lld products %lldx%lld: %.3f ms without spans, %.3f ms with %lld spans; "
              "with/without %.4fx\n",
              static_cast<long long>(ops), static_cast<long long>(size), static_cast<long long>(size), 1e3 * mo,
              1e3 * mw, static_cast<long long>(ops), mw / mo);
  std::printf("a trainer step times 4 + 3 x micro-batches spans (+ eval, diagnostics, checkpoint when they "
              "run): at %.1f ns each, 16 spans cost %.2f us per step\n",
              1e9 * (per_span - per_bare), 16e6 * (per_span - per_bare));
  return 0;
}
