// logit_channel_bench: the logit channel (header + ids check + payload, LogitChannelSender ->
// ChannelTeacherSource) against raw MPI_Send/MPI_Recv of the same payload bytes between the same two
// ranks, alternated in one run; and the channel's bytes per token for full fp32, full bf16, top-k and
// hidden states (bf16, at --hidden: the paper teacher's 4096), each measured by sending one micro-batch.
//   mpirun --allow-run-as-root -np 2 build/bench/logit_channel_bench [--vocab 151936] [--tokens 256]
// Prints GB/s of logit payload for both and the ratio channel / raw MPI (goal >= 0.8x), and the
// bytes per token of each payload with the ratio full bf16 / hidden bf16.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
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

// Rank 0 sends `iters` micro-batches of logits through the channel; rank 1 receives them as a
// student does. Returns the seconds for all of them, delivery included.
double channel_run(Communicator& comm, const ChannelFormat& format, const at::Tensor& logits,
                   const MicroBatch& batch, int iters, int64_t* bytes, int64_t vocab) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  if (comm.rank() == 0) {
    LogitChannelSender sender(comm, format, /*first_student=*/0, /*max_in_flight=*/2);
    for (int i = 0; i < iters; ++i) sender.send({BatchKind::kTrain, batch.step, 0, 0}, batch.checksum, logits);
    sender.flush();
    *bytes = sender.bytes_sent();
  } else {
    // A hidden channel's student holds the teacher head [V, H]; only its shape matters here, so a
    // broadcast view stands in for the 2.5 GB fp32 matrix.
    const at::Tensor head = format.hidden ? at::zeros({1, logits.size(-1)}).expand({vocab, logits.size(-1)}) : at::Tensor();
    ChannelTeacherSource source(comm, format, vocab, 0, 1, at::kCPU, head);
    for (int i = 0; i < iters; ++i) source.targets(batch);
    *bytes = source.channel_bytes();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return seconds_since(t0);
}

double raw_mpi_run(const at::Tensor& payload, int rank, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  const auto n = static_cast<int>(payload.nbytes());  // < 2^31 for the sizes used here
  for (int i = 0; i < iters; ++i) {
    if (rank == 0) {
      MPI_Send(payload.data_ptr(), n, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
    } else {
      MPI_Recv(payload.data_ptr(), n, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"logit channel throughput vs raw MPI point-to-point"};
  int64_t vocab = 151936, tokens = 256, k = 64, hidden = 4096;
  int iters = 10, rounds = 3;
  app.add_option("--vocab", vocab, "vocabulary (Qwen3: 151936)");
  app.add_option("--tokens", tokens, "tokens per micro-batch");
  app.add_option("--topk", k, "k of the top-k channel");
  app.add_option("--hidden", hidden, "teacher hidden size of the hidden-state channel (Qwen3-8B: 4096)");
  app.add_option("--iters", iters, "micro-batches per measurement");
  app.add_option("--rounds", rounds, "alternating measurements of each; the best is reported");
  CLI11_PARSE(app, argc, argv);

  MpiSession mpi(&argc, &argv);
  auto comm = two_rank_communicator(mpi, "logit_channel_bench");
  if (!comm) return 2;
  const at::Tensor logits = at::randn({tokens, vocab}, at::kFloat);
  MicroBatch batch;
  batch.inputs = at::arange(tokens, at::kLong).reshape({1, tokens});
  batch.checksum = ids_checksum(batch.inputs);
  at::Tensor payload = at::empty_like(logits);

  double best_channel = 1e30, best_raw = 1e30;
  int64_t bytes = 0;
  ChannelFormat full;
  for (int r = 0; r < rounds; ++r) {
    best_channel = std::min(best_channel, channel_run(*comm, full, logits, batch, iters, &bytes, vocab));
    best_raw = std::min(best_raw, raw_mpi_run(payload, mpi.rank(), iters));
  }
  const double payload_gb = static_cast<double>(logits.nbytes()) * iters / 1e9;

  // Bytes per token of each format (one micro-batch each).
  const at::Tensor hidden_states = at::randn({tokens, hidden}, at::kFloat);
  auto bytes_per_token = [&](ChannelFormat f) {
    int64_t b = 0;
    channel_run(*comm, f, f.hidden ? hidden_states : logits, batch, 1, &b, vocab);
    return static_cast<double>(b) / static_cast<double>(tokens);
  };
  ChannelFormat bf16 = full;
  bf16.bf16_values = true;
  ChannelFormat topk = full;
  topk.topk = true;
  topk.k = k;
  ChannelFormat hidden_bf16 = bf16;
  hidden_bf16.hidden = true;
  const double full_bpt = bytes_per_token(full), bf16_bpt = bytes_per_token(bf16), topk_bpt = bytes_per_token(topk);
  const double hidden_bpt = bytes_per_token(hidden_bf16);

  if (mpi.rank() == 1) {
    std::cout << std::fixed << std::setprecision(2);
    std::cout << "logit channel, " << tokens << " tokens x vocab " << vocab << " fp32 per micro-batch ("
              << logits.nbytes() / 1e6 << " MB), " << iters << " micro-batches, best of " << rounds << "\n";
    std::cout << "  raw MPI_Send/Recv : " << payload_gb / best_raw << " GB/s\n";
    std::cout << "  deepen channel    : " << payload_gb / best_channel << " GB/s (header, ids check, payload)\n";
    std::cout << "  ratio channel/raw : " << best_raw / best_channel << "x (goal >= 0.8x)\n";
    std::cout << std::setprecision(1) << "bytes per token on the channel: full fp32 " << full_bpt << ", full bf16 "
              << bf16_bpt << ", top-" << k << " " << topk_bpt << " (k*(4+4) = " << k * 8
              << " + header); top-k / full = " << std::setprecision(4) << topk_bpt / full_bpt << "\n";
    std::cout << std::setprecision(1) << "hidden-state channel (bf16, hidden " << hidden << "): " << hidden_bpt
              << " bytes per token (2*hidden = " << 2 * hidden << " + header) = " << hidden_bpt / 1024
              << " KiB vs full bf16 " << bf16_bpt / 1024 << " KiB: " << bf16_bpt / hidden_bpt << "x fewer bytes\n";
  }
  return 0;
}
