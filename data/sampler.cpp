// Sampler: a keyed Feistel permutation per epoch, rank-major step layout, fixed eval batches.
#include "data/sampler.h"

#include <stdexcept>
#include <string>

#include "config/hash.h"

namespace deepen {
namespace {

// A permutation of [0, n): a balanced 4-round Feistel network on 2h bits (2^(2h) >= n, so at most
// 4n values) walked until it lands inside [0, n) (a permutation restricted by cycle walking stays a
// permutation). Round keys depend on (seed, epoch, round).
int64_t permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t x) {
  if (n <= 1) return 0;
  const int bits = 64 - __builtin_clzll(n - 1);  // bits to hold n - 1
  const int h = (bits + 1) / 2;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  uint64_t keys[4];
  for (uint64_t r = 0; r < 4; ++r) keys[r] = mix64(seed ^ mix64(epoch * 0x9e3779b97f4a7c15ULL + r + 1));
  do {
    uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t t = left ^ (mix64(right ^ keys[r]) & mask);
      left = right;
      right = t;
    }
    x = (left << h) | right;
  } while (x >= n);
  return int64_t(x);
}

}  // namespace

int64_t permute_index(int64_t i, int64_t n, uint64_t seed) {
  if (n <= 0 || i < 0 || i >= n)
    throw std::invalid_argument("permute_index: " + std::to_string(i) + " not in [0, " + std::to_string(n) + ")");
  return permute(seed, 0, uint64_t(n), uint64_t(i));
}

Sampler::Sampler(uint64_t seed, int64_t num_sequences, BatchLayout layout, ReplayShard replay)
    : seed_(seed), n_(num_sequences), layout_(layout), replay_(replay) {
  if (n_ <= 0) throw std::invalid_argument("Sampler: no sequences to sample");
  if (layout_.ranks <= 0 || layout_.grad_accum <= 0 || layout_.micro_batch <= 0)
    throw std::invalid_argument("Sampler: ranks, grad_accum and micro_batch must be positive");
  if (replay_.sequences < 0 || replay_.sequences > n_)
    throw std::invalid_argument("Sampler: replay shard of " + std::to_string(replay_.sequences) + " sequences, the split has " +
                                std::to_string(n_));
}

int64_t Sampler::at(int64_t sample) const {
  if (sample < 0) throw std::invalid_argument("Sampler: negative sample index");
  const uint64_t g = uint64_t(sample);
  if (replay_.sequences == 0) return permute(seed_, g / uint64_t(n_), uint64_t(n_), g % uint64_t(n_));
  const uint64_t d = uint64_t(replay_.sequences);
  if (replay_.wrap || g < d) return permute(seed_, g / d, d, g % d);
  // Fresh documents after the shard: their own epochs, keyed apart from the shard's.
  const uint64_t rest = uint64_t(n_) - d, h = g - d;
  if (rest == 0)
    throw std::out_of_range("Sampler: sample " + std::to_string(sample) + " is past the replay shard's " +
                            std::to_string(d) + " sequences and no sequence follows it");
  return int64_t(d) + permute(mix64(seed_ ^ 0x66726573680aULL), h / rest, rest, h % rest);
}

std::vector<int64_t> Sampler::micro_batch(int64_t step, int64_t rank, int64_t micro) const {
  if (step < 0 || rank < 0 || rank >= layout_.ranks || micro < 0 || micro >= layout_.grad_accum)
    throw std::invalid_argument("Sampler: step " + std::to_string(step) + ", rank " + std::to_string(rank) +
                                ", micro-batch " + std::to_string(micro) + " outside the layout");
  const int64_t first = step * layout_.global_batch() + (rank * layout_.grad_accum + micro) * layout_.micro_batch;
  std::vector<int64_t> out(size_t(layout_.micro_batch));
  for (int64_t j = 0; j < layout_.micro_batch; ++j) out[size_t(j)] = at(first + j);
  return out;
}

std::vector<int64_t> Sampler::step(int64_t step) const {
  if (step < 0) throw std::invalid_argument("Sampler: negative step");
  const int64_t g = layout_.global_batch();
  std::vector<int64_t> out(static_cast<size_t>(g));
  for (int64_t k = 0; k < g; ++k) out[size_t(k)] = at(step * g + k);
  return out;
}

std::vector<int64_t> validation_sequences(int64_t num_sequences, int64_t micro_batch, int64_t batch_index) {
  if (num_sequences <= 0 || micro_batch <= 0 || batch_index < 0)
    throw std::invalid_argument("validation_sequences: bad arguments");
  std::vector<int64_t> out(static_cast<size_t>(micro_batch));
  for (int64_t j = 0; j < micro_batch; ++j) out[size_t(j)] = (batch_index * micro_batch + j) % num_sequences;
  return out;
}

std::vector<int64_t> diagnostic_sequences(int64_t num_sequences, int64_t n) {
  if (num_sequences <= 0 || n < 0) throw std::invalid_argument("diagnostic_sequences: bad arguments");
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = int64_t((__int128(i) * num_sequences) / n);
  return out;
}

}  // namespace deepen
