// Deterministic sampler: which sequences each student rank reads at each step, as pure functions, so
// every rank (and the teacher pipeline feeding it) knows the batch without asking anyone.
#pragma once

#include <cstdint>
#include <vector>

namespace deepen {

// Sequences are a ShardSet's (ShardSet::sequences() of the training split).
//
// The stream of samples: sample g (g = 0, 1, 2, ...) belongs to epoch e = g / N and is sequence
// perm_e(g mod N), where perm_e is a seeded permutation of [0, N) (a 4-round Feistel network with
// cycle walking, keyed by seed and e): each epoch visits every sequence exactly once, in a new order,
// and any sample is computed in O(1) without materializing a permutation.
//
// Step s consumes the G = R*A*b samples [s*G, (s+1)*G) (R data-parallel ranks, A micro-batches per
// step, b sequences per micro-batch). Inside a step the samples are laid out rank-major, then
// micro-batch: rank r's micro-batch m is samples s*G + (r*A + m)*b + [0, b).
//
// Worked example, G = 8, b = 2, step 0 (k = sample index within the step):
//   R=2, A=2:  rank 0: m0 = k{0,1}, m1 = k{2,3}    rank 1: m0 = k{4,5}, m1 = k{6,7}
//   R=1, A=4:  rank 0: m0 = k{0,1}, m1 = k{2,3}, m2 = k{4,5}, m3 = k{6,7}
//   R=4, A=1:  rank 0 = k{0,1}, rank 1 = k{2,3}, rank 2 = k{4,5}, rank 3 = k{6,7}
// The global batch of every step is the same 8 sequences (here even the same micro-batches) in all
// three layouts, so a 2-student run and a 1-student run with the same global batch train on the
// same data; with b changed (R=1, A=1, b=8) a step still holds the same 8 sequences.
// The checkpointed sampler cursor is the step: nothing else is needed to resume.
struct BatchLayout {
  int64_t ranks = 1;        // R: data-parallel student ranks
  int64_t grad_accum = 1;   // A: micro-batches per optimizer step
  int64_t micro_batch = 1;  // b: sequences per micro-batch
  int64_t global_batch() const { return ranks * grad_accum * micro_batch; }
};

// A seeded bijection of [0, n) (epoch 0 of the stream). Throws std::invalid_argument unless
// 0 <= i < n.
int64_t permute_index(int64_t i, int64_t n, uint64_t seed);

// A fixed training shard: the first `sequences` sequences (documents) of the split, D of N.
//   wrap (grow runs, the paper's "every grow phase replays the same shard"): the stream never
//        leaves the shard; epoch e is perm_e of [0, D). The iterator is not reset at a phase
//        change, so with D = one phase's samples every phase reads the same D documents (each
//        phase in a new order).
//   fresh (joint controls longer than the shard: "continues onto fresh data"): samples [0, D) are
//        perm_0 of the shard, then samples D, D+1, ... walk the documents after it, D + perm'_e of
//        [0, N - D), never the shard again.
// Example: N = 10, D = 4, 2 samples per step: wrap steps 0,1 = the 4 shard documents, steps 2,3 =
// the same 4 again (another order), ...; fresh steps 0,1 = the same 4 as wrap, steps 2.. = documents
// from 4..9. sequences = 0: no shard, every sample from all N (the plain stream above).
struct ReplayShard {
  int64_t sequences = 0;  // D; 0 = off
  bool wrap = true;       // false: fresh
};

class Sampler {
 public:
  // Throws std::invalid_argument when num_sequences or a layout entry is not positive, or the
  // shard is larger than the split.
  Sampler(uint64_t seed, int64_t num_sequences, BatchLayout layout, ReplayShard replay = {});

  // Sequence of sample g of the stream (g >= 0). A fresh stream past its shard with no document
  // after it throws std::out_of_range.
  int64_t at(int64_t sample) const;
  // The b sequences of micro-batch `micro` (< A) of `rank` (< R) at `step`.
  std::vector<int64_t> micro_batch(int64_t step, int64_t rank, int64_t micro) const;
  // All G sequences of a step in sample order (what its R*A micro-batches cover).
  std::vector<int64_t> step(int64_t step) const;

  uint64_t seed() const { return seed_; }
  int64_t num_sequences() const { return n_; }
  const BatchLayout& layout() const { return layout_; }

 private:
  uint64_t seed_;
  int64_t n_;
  BatchLayout layout_;
  ReplayShard replay_;
};

// Validation: batch i is sequences (i*b + j) mod N, j < b, of the validation split, in order; an eval
// reads batches 0 .. eval.batches-1 every time (with R ranks, rank r takes the batches i with
// i mod R == r), so every eval point scores the same tokens.
std::vector<int64_t> validation_sequences(int64_t num_sequences, int64_t micro_batch, int64_t batch_index);

// The fixed diagnostic batch: n validation sequences spread evenly, floor(i*N/n) for i < n
// (N = 10, n = 4 -> 0, 2, 5, 7). Repeats only when n > N.
std::vector<int64_t> diagnostic_sequences(int64_t num_sequences, int64_t n);

}  // namespace deepen
