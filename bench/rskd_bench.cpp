// rskd_bench: the teacher cache's targets at the paper's vocabulary (V = 151,936), measured.
//   build/bench/rskd_bench [--rows 16] [--max-n 256] [--threads 2]
// 1. Unbiasedness: over N independent sampled caches of one batch (draws keyed by seed 1..N), the
//    relative error of the mean sampled-loss gradient (w.r.t. the student's hidden states and head)
//    against the full-logit gradient, for K = 8, 32, 64; beside it the error of top-k (k = 8, 32, 64,
//    both tails), which no N changes. An unbiased estimator's error falls as 1/√N (×0.5 per 4× N).
// 2. Bytes per token of the cache's record (teacher_cache/cache_file.h) for each K, measured on the
//    same draws, against two plain layouts of the same draws: K raw ids (4·K bytes) and distinct ids
//    + counts at fixed width (u32 + u8 each), and the top-k layout (8·k).
// The teacher: per row a Zipf distribution p_i ∝ rank_i^(−s) over a random order of the ids, s drawn
// in [1.1, 2.1] (flat to peaked rows; the mean entropy is printed), at τ = 1; the student's logits a
// random projection of random hidden states (a student that disagrees with it).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "teacher_cache/cache_file.h"
#include "teacher_cache/teacher_draws.h"
#include "train/compute_threads.h"
#include "train/distill_loss.h"

namespace {

using namespace deepen;
using at::Tensor;

Tensor gradient(const Tensor& hidden, const Tensor& head, const TeacherTargets& t, const DistillLossOptions& o) {
  Tensor h = hidden.clone().requires_grad_(true), w = head.clone().requires_grad_(true);
  distill_loss(h, w, t, {}, o).loss.backward();
  return at::cat({h.grad().flatten(), w.grad().flatten()}).to(at::kDouble);
}

double rel(const Tensor& a, const Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rskd_bench: RS-KD's gradient error against N and top-k's, and the cache's bytes per token"};
  int64_t rows = 16, hdim = 64, vocab = 151936, max_n = 256, threads = 2;
  app.add_option("--rows", rows, "tokens in the batch");
  app.add_option("--max-n", max_n, "the most caches averaged (powers of 4 from 1)");
  app.add_option("--threads", threads, "LibTorch threads");
  CLI11_PARSE(app, argc, argv);
  set_compute_threads(threads);
  at::manual_seed(0);
  const Tensor hidden = at::randn({rows, hdim});
  const Tensor head = at::randn({vocab, hdim}) * (2.0 / std::sqrt(static_cast<double>(hdim)));
  // Zipf rows: log p_i = −s·log(rank_i) up to a constant, ranks a random permutation per row.
  const Tensor s = at::rand({rows, 1}, at::kDouble) + 1.1;
  const Tensor ranks = at::argsort(at::rand({rows, vocab}), /*stable=*/false, /*dim=*/1).to(at::kDouble) + 1;
  const Tensor teacher = (-s * at::log(ranks)).to(at::kFloat);
  const Tensor p = at::softmax(teacher.to(at::kDouble), 1);
  const double entropy = (-(p * at::log(p.clamp_min(1e-300))).sum(1)).mean().item<double>();
  const DistillLossOptions o{1.0, 1.0, 0, TopkTail::kRenormalize, -100};
  const Tensor full = gradient(hidden, head, TeacherTargets::full(teacher), o);
  std::printf("V = %lld, %lld tokens, teacher entropy %.2f nats (mean over tokens), tau = 1, KL term only\n",
              static_cast<long long>(vocab), static_cast<long long>(rows), entropy);

  std::printf("\n1. relative error of the gradient against the full-logit gradient\n");
  std::printf("%-22s", "targets");
  for (int64_t n = 1; n <= max_n; n *= 4) std::printf("   N = %-5lld", static_cast<long long>(n));
  std::printf("   (N = caches averaged)\n");
  const auto start = std::chrono::steady_clock::now();
  for (int64_t k : {8, 32, 64}) {
    std::printf("sampled, K = %-9lld", static_cast<long long>(k));
    Tensor sum = at::zeros_like(full);
    for (int64_t i = 1, next = 1; i <= max_n; ++i) {
      sum += gradient(hidden, head, sample_teacher_targets(teacher, 1.0, k, static_cast<uint64_t>(i)), o);
      if (i == next) {
        std::printf("   %-10.4f", rel(sum / static_cast<double>(i), full));
        next *= 4;
      }
    }
    std::printf("\n");
  }
  for (TopkTail tail : {TopkTail::kRenormalize, TopkTail::kBucket}) {
    DistillLossOptions ot = o;
    ot.tail = tail;
    for (int64_t k : {8, 32, 64}) {
      const double e = rel(gradient(hidden, head, teacher_topk(teacher, k, 1.0), ot), full);
      char name[64];
      std::snprintf(name, sizeof name, "top-%lld, %s", static_cast<long long>(k), option_name(tail));
      std::printf("%-22s   %-10.4f   (any N: the same targets every time)\n", name, e);
    }
  }
  std::printf("(%.0f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  std::printf("\n2. bytes per token of the same draws\n");
  std::printf("%-14s %10s %14s %16s %18s\n", "K", "distinct", "cache record", "K raw u32 ids", "distinct u32+u8");
  for (int64_t k : {8, 32, 64}) {
    int64_t bytes = 0, distinct = 0;
    std::vector<TokenPlace> places(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) places[static_cast<size_t>(r)].sequence = r;
    const TeacherDraws d = draw_from_teacher(teacher, 1.0, token_uniforms(1, places, k));
    std::vector<unsigned char> out;
    for (int64_t r = 0; r < rows; ++r) {
      CacheRecord rec;
      rec.entropy = static_cast<float>(d.entropy[r].item<double>());
      for (int64_t j = 0; j < k; ++j) {
        const auto id = static_cast<uint32_t>(d.ids[r][j].item<int64_t>());
        if (rec.ids.empty() || rec.ids.back() != id) rec.ids.push_back(id), rec.counts.push_back(1);
        else ++rec.counts.back();
      }
      distinct += static_cast<int64_t>(rec.ids.size());
      out.clear();
      encode_cache_record(rec, static_cast<uint32_t>(k), 0, out);
      bytes += static_cast<int64_t>(out.size());
    }
    const double m = static_cast<double>(distinct) / static_cast<double>(rows);
    std::printf("%-14lld %10.1f %14.1f %16lld %18.1f\n", static_cast<long long>(k), m,
                static_cast<double>(bytes) / static_cast<double>(rows), static_cast<long long>(4 * k), 4 + 5 * m);
  }
  std::printf("top-k layout: 8·k bytes (u32 id + f32 log-probability): 64, 256, 512 for k = 8, 32, 64\n");
  return 0;
}
