// comm_bench: point-to-point bandwidth between two MPI ranks for logit-sized messages, raw MPI
// (MPI_Send/MPI_Recv on bytes) against deepen's MpiCommunicator (send/recv, and isend with two
// messages in flight as a streaming channel does), measured alternately in the same run.
//   mpirun --allow-run-as-root -np 2 build/bench/comm_bench [--vocab 151936] [--tokens 1024]
// Prints GB/s per message size and the ratio communicator / raw MPI. Raw MPI is the baseline that
// the logit channel will be held to later (goal >= 0.8x).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "bench/two_rank_communicator.h"
#include "dist/communicator.h"
#include "dist/mpi_session.h"

using deepen::median;

namespace {

using Clock = std::chrono::steady_clock;

// One timed transfer of `iters` messages rank 0 -> rank 1; `finish` completes what is still in
// flight, and a one-byte ack closes the transfer so that the time covers delivery. Seconds.
template <class Send, class Recv, class Finish>
double timed(int rank, int iters, Send&& send, Recv&& recv, Finish&& finish) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  char ack = 0;
  if (rank == 0) {
    for (int i = 0; i < iters; ++i) send();
    finish();
    MPI_Recv(&ack, 1, MPI_CHAR, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    for (int i = 0; i < iters; ++i) recv();
    finish();
    MPI_Send(&ack, 1, MPI_CHAR, 0, 99, MPI_COMM_WORLD);
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  deepen::MpiSession mpi(&argc, &argv);
  CLI::App app{"comm_bench: MPI point-to-point bandwidth, raw vs deepen's communicator"};
  int64_t vocab = 151936, tokens = 1024, topk = 64;
  int iters = 5, reps = 5;
  app.add_option("--vocab", vocab, "vocabulary size (Qwen3: 151936)");
  app.add_option("--tokens", tokens, "tokens per logit micro-batch (e.g. 4 sequences x 256)");
  app.add_option("--topk", topk, "k of the top-k channel message");
  app.add_option("--iters", iters, "messages per timed transfer (at least ~200 MB worth)");
  app.add_option("--reps", reps, "timed transfers per variant (median reported)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.rank() == 0 ? app.exit(e) : 0;
  }
  auto comm = deepen::two_rank_communicator(mpi, "comm_bench");
  if (!comm) return 2;
  const int rank = mpi.rank();

  struct Size {
    std::string name;
    int64_t bytes;
  };
  const std::vector<Size> sizes = {
      {"full fp32 [" + std::to_string(tokens) + " x " + std::to_string(vocab) + "]", tokens * vocab * 4},
      {"full bf16", tokens * vocab * 2},
      {"full fp32 1/4 batch", tokens / 4 * vocab * 4},
      {"top-" + std::to_string(topk) + " (fp32 value + int32 index)", tokens * topk * 8},
  };
  if (rank == 0) {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    std::cout << "comm_bench: 2 ranks on " << mpi.hostnames()[0] << (mpi.hostnames()[0] == mpi.hostnames()[1] ? " (same node)" : " and " + mpi.hostnames()[1])
              << ", MPI " << mpi.thread_level_name() << ", GLIBC_TUNABLES=" << (tunables ? tunables : "(unset)")
              << "\n" << iters << "+ messages (>= 200 MB) per transfer, median of " << reps << " transfers\n\n"
              << std::left << std::setw(44) << "message" << std::right << std::setw(10) << "MB" << std::setw(12)
              << "raw GB/s" << std::setw(12) << "comm GB/s" << std::setw(10) << "ratio" << std::setw(14)
              << "isend2 GB/s" << std::setw(10) << "ratio" << "\n";
  }
  for (const Size& s : sizes) {
    if (s.bytes >= (int64_t{1} << 31)) {
      if (rank == 0) std::cout << s.name << ": skipped (raw MPI_Send counts stop at 2 GiB)\n";
      continue;
    }
    // Two buffers, touched before timing (first touch of fresh pages is slow on this VM).
    std::vector<at::Tensor> buf = {at::full({s.bytes}, 1, at::kByte), at::full({s.bytes}, 2, at::kByte)};
    auto raw_send = [&] { MPI_Send(buf[0].data_ptr(), static_cast<int>(s.bytes), MPI_BYTE, 1, 1, MPI_COMM_WORLD); };
    auto raw_recv = [&] {
      MPI_Recv(buf[0].data_ptr(), static_cast<int>(s.bytes), MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    };
    auto comm_send = [&] { comm->send(buf[0], 1, 1); };
    auto comm_recv = [&] { comm->recv(buf[0], 0, 1); };
    // Streaming: two messages in flight from alternating buffers, as a channel with back-pressure.
    std::vector<std::unique_ptr<deepen::Request>> inflight(2);
    int slot = 0;
    auto stream_send = [&] {
      if (inflight[slot]) inflight[slot]->wait();
      inflight[slot] = comm->isend(buf[slot], 1, 2);
      slot ^= 1;
    };
    auto stream_recv = [&] {
      if (inflight[slot]) inflight[slot]->wait();
      inflight[slot] = comm->irecv(buf[slot], 0, 2);
      slot ^= 1;
    };
    auto drain = [&] {
      for (auto& r : inflight)
        if (r) r->wait();
      for (auto& r : inflight) r.reset();
      slot = 0;
    };
    // Small messages repeat until a transfer moves ~200 MB, so one scheduler hiccup does not decide it.
    const int n = static_cast<int>(std::min<int64_t>(1000, std::max<int64_t>(iters, 200'000'000 / s.bytes)));
    auto nothing = [] {};
    timed(rank, 1, raw_send, raw_recv, nothing);  // warm-up (connections, first use of the buffers)
    timed(rank, 1, comm_send, comm_recv, nothing);
    timed(rank, 2, stream_send, stream_recv, drain);
    std::vector<double> raw, ours, stream;
    for (int r = 0; r < reps; ++r) {
      raw.push_back(timed(rank, n, raw_send, raw_recv, nothing));
      ours.push_back(timed(rank, n, comm_send, comm_recv, nothing));
      stream.push_back(timed(rank, n, stream_send, stream_recv, drain));
    }
    if (rank == 0) {
      const double gb = static_cast<double>(s.bytes) * n / 1e9;
      const double r = gb / median(raw), c = gb / median(ours), st = gb / median(stream);
      std::cout << std::left << std::setw(44) << s.name << std::right << std::fixed << std::setprecision(1)
                << std::setw(10) << s.bytes / 1e6 << std::setprecision(2) << std::setw(12) << r << std::setw(12) << c
                << std::setw(10) << c / r << std::setw(14) << st << std::setw(10) << st / r << "\n";
    }
  }
  return 0;
}
