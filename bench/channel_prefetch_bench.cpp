// channel_prefetch_bench: how long a student waits for its teacher targets per step, receiving each
// micro-batch only when it is needed (as before) against prefetching it (the next micro-batch's
// receive posted while the current one computes), alternated in one run, for full bf16 logits and
// bf16 hidden states at the paper's shapes.
//   mpirun --allow-run-as-root -np 2 build/bench/channel_prefetch_bench [--tokens 128] [--compute-ms 50]
// Rank 0 plays the teacher's last stage (LogitChannelSender, two micro-batches in flight, as
// parallel.max_in_flight = 2), sending as fast as the student takes them (--teacher-ms adds a
// pause per micro-batch: a slower teacher); rank 1 plays a student (ChannelTeacherSource) doing
// --compute-ms of real matmul work per micro-batch, as the trainer's forward and backward would.
// Prints, per step of --micro micro-batches, the student's time blocked in targets() and prefetch()
// (the wait) and the step's wall time, for each payload and mode.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "bench/two_rank_communicator.h"
#include "dist/communicator.h"
#include "dist/logit_channel.h"
#include "dist/mpi_session.h"
#include "train/micro_batch.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace deepen;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  int64_t vocab = 151936, hidden = 4096, tokens = 128;
  int micro = 4, steps = 6, rounds = 3;
  double compute_ms = 50, teacher_ms = 0;
};

struct PerStep {
  double wait = 0, step = 0;  // seconds per step, student side
};

// Real work for about `ms` milliseconds: fp32 matmuls, no MPI call in between (as a forward and
// backward make none), so whatever the channel does meanwhile is what MPI does without the student.
void compute_for(double ms, const at::Tensor& a) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) * 1e3 < ms) at::mm(a, a);
}

PerStep run(Communicator& comm, const ChannelFormat& format, const at::Tensor& output, const Options& o, bool prefetch) {
  std::vector<MicroBatch> batches;
  for (int i = 0; i < o.micro; ++i) {
    MicroBatch b;
    b.index = i;
    b.inputs = at::arange(o.tokens, at::kLong).reshape({1, o.tokens}) + i;
    b.checksum = ids_checksum(b.inputs);
    batches.push_back(b);
  }
  PerStep total;
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) {
    LogitChannelSender sender(comm, format, /*first_student=*/0, /*max_in_flight=*/2);
    for (int s = 0; s < o.steps; ++s) {
      for (MicroBatch& b : batches) {
        if (o.teacher_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.teacher_ms));
        sender.send({BatchKind::kTrain, s, 0, b.index}, b.checksum, output);
      }
    }
    sender.flush();
  } else {
    // The hidden channel's student holds the teacher head [V, H]; only its shape matters here.
    const at::Tensor head = format.hidden ? at::zeros({1, o.hidden}).expand({o.vocab, o.hidden}) : at::Tensor();
    ChannelTeacherSource source(comm, format, o.vocab, 0, 1, at::kCPU, head);
    const at::Tensor work = at::randn({256, 256});
    for (int s = 0; s < o.steps; ++s) {
      for (MicroBatch& b : batches) b.step = s;
      const auto step0 = Clock::now();
      double wait = 0;
      auto timed = [&wait](auto&& f) {
        const auto t0 = Clock::now();
        f();
        wait += seconds_since(t0);
      };
      if (prefetch) timed([&] { source.prefetch(batches[0]); });
      for (size_t i = 0; i < batches.size(); ++i) {
        TeacherTargets t;
        timed([&] { t = source.targets(batches[i]); });
        if (prefetch && i + 1 < batches.size()) timed([&] { source.prefetch(batches[i + 1]); });
        compute_for(o.compute_ms, work);
      }
      total.wait += wait;
      total.step += seconds_since(step0);
    }
    total.wait /= o.steps;
    total.step /= o.steps;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"student wait for teacher targets per step, with and without prefetch"};
  Options o;
  app.add_option("--vocab", o.vocab, "vocabulary (Qwen3: 151936)");
  app.add_option("--hidden", o.hidden, "teacher hidden size (Qwen3-8B: 4096)");
  app.add_option("--tokens", o.tokens, "tokens per micro-batch");
  app.add_option("--micro", o.micro, "micro-batches per step (parallel.grad_accum)");
  app.add_option("--steps", o.steps, "steps per measurement");
  app.add_option("--rounds", o.rounds, "alternating measurements of each mode; the best is reported");
  app.add_option("--compute-ms", o.compute_ms, "student compute per micro-batch (real matmul work)");
  app.add_option("--teacher-ms", o.teacher_ms, "teacher pause before each micro-batch (0: the teacher is ahead)");
  CLI11_PARSE(app, argc, argv);

  MpiSession mpi(&argc, &argv);
  auto comm = two_rank_communicator(mpi, "channel_prefetch_bench");
  if (!comm) return 2;

  ChannelFormat full_bf16;
  full_bf16.bf16_values = true;
  ChannelFormat hidden_bf16 = full_bf16;
  hidden_bf16.hidden = true;
  const at::Tensor logits = at::randn({o.tokens, o.vocab}, at::kFloat);
  const at::Tensor hidden = at::randn({o.tokens, o.hidden}, at::kFloat);

  if (mpi.rank() == 1)
    std::cout << "student wait for teacher targets, " << o.micro << " micro-batches of " << o.tokens
              << " tokens per step, " << o.compute_ms << " ms student compute per micro-batch, teacher pause "
              << o.teacher_ms << " ms; mean over " << o.steps << " steps, best of " << o.rounds << " rounds\n";
  for (const auto& [name, format, output] :
       {std::tuple{std::string("full bf16 logits"), full_bf16, logits}, std::tuple{std::string("bf16 hidden states"), hidden_bf16, hidden}}) {
    PerStep best[2] = {{1e30, 1e30}, {1e30, 1e30}};
    for (int r = 0; r < o.rounds; ++r) {
      for (int mode = 0; mode < 2; ++mode) {
        const PerStep p = run(*comm, format, output, o, mode == 1);
        best[mode].wait = std::min(best[mode].wait, p.wait);
        best[mode].step = std::min(best[mode].step, p.step);
      }
    }
    if (mpi.rank() == 1) {
      std::cout << std::fixed << std::setprecision(2) << "  " << name << ":\n";
      for (int mode = 0; mode < 2; ++mode)
        std::cout << "    " << (mode ? "prefetch      " : "receive on use") << ": wait " << best[mode].wait * 1e3
                  << " ms/step, step " << best[mode].step * 1e3 << " ms\n";
    }
  }
  return 0;
}
