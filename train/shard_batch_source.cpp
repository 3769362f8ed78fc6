// Micro-batches from token shards through the deterministic sampler, and the ids checksum they carry.
#include "train/shard_batch_source.h"

#include <ATen/ATen.h>

#include "config/hash.h"
#include "config/input_error.h"
#include "data/sampler.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"

namespace deepen {

uint64_t ids_checksum(const at::Tensor& ids) {
  const at::Tensor c = ids.to(at::kCPU, at::kLong).contiguous();
  return hash64(c.data_ptr(), c.nbytes(), 0x746f6b656e73ULL);
}

namespace {

class ShardBatchSource : public BatchSource {
 public:
  ShardBatchSource(const Config& cfg, const Tokenizer& tok)
      : seq_len_(cfg.data.seq_len),
        micro_batch_(cfg.parallel.micro_batch),
        eval_batches_(cfg.eval.batches),
        diagnostic_batch_(cfg.eval.diagnostic_batch),
        train_(ShardSet::open(cfg.data.train, cfg.data.seq_len + 1, static_cast<uint64_t>(tok.vocab_size()),
                              tok.fingerprint())),
        valid_(ShardSet::open(cfg.data.valid, cfg.data.seq_len + 1, static_cast<uint64_t>(tok.vocab_size()),
                              tok.fingerprint())),
        sampler_(static_cast<uint64_t>(cfg.run.seed), train_.sequences(),
                 {cfg.parallel.students, cfg.parallel.grad_accum, cfg.parallel.micro_batch}) {
    const int64_t need = std::max(eval_batches_ * micro_batch_, diagnostic_batch_);
    if (valid_.sequences() < need)
      throw InputError(cfg.data.valid + ": " + std::to_string(valid_.sequences()) + " validation sequences of " +
                       std::to_string(seq_len_) + " tokens, but eval.batches × parallel.micro_batch = " +
                       std::to_string(eval_batches_ * micro_batch_) + " and eval.diagnostic_batch = " +
                       std::to_string(diagnostic_batch_) + " need " + std::to_string(need));
  }

  MicroBatch train(int64_t step, int64_t student, int64_t micro) const override {
    MicroBatch mb = make(train_, sampler_.micro_batch(step, student, micro));
    mb.kind = BatchKind::kTrain;
    mb.step = step;
    mb.student = student;
    mb.index = micro;
    return mb;
  }

  MicroBatch eval(int64_t index) const override {
    std::vector<int64_t> ids(static_cast<size_t>(micro_batch_));
    for (int64_t b = 0; b < micro_batch_; ++b) ids[static_cast<size_t>(b)] = index * micro_batch_ + b;
    MicroBatch mb = make(valid_, ids);
    mb.kind = BatchKind::kEval;
    mb.index = index;
    return mb;
  }

  int64_t eval_batches() const override { return eval_batches_; }

  MicroBatch diagnostic() const override {
    std::vector<int64_t> ids(static_cast<size_t>(diagnostic_batch_));
    for (int64_t b = 0; b < diagnostic_batch_; ++b) ids[static_cast<size_t>(b)] = b;
    MicroBatch mb = make(valid_, ids);
    mb.kind = BatchKind::kDiagnostic;
    return mb;
  }

 private:
  MicroBatch make(const ShardSet& set, const std::vector<int64_t>& sequences) const {
    const int64_t rows = static_cast<int64_t>(sequences.size());
    at::Tensor window = at::empty({rows, seq_len_ + 1}, at::kLong);
    int64_t* out = window.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) set.read_sequence(sequences[static_cast<size_t>(r)], out + r * (seq_len_ + 1));
    MicroBatch mb;
    mb.inputs = window.narrow(1, 0, seq_len_).contiguous();
    mb.labels = window.narrow(1, 1, seq_len_).contiguous();
    mb.checksum = ids_checksum(mb.inputs);
    return mb;
  }

  int64_t seq_len_, micro_batch_, eval_batches_, diagnostic_batch_;
  ShardSet train_, valid_;
  Sampler sampler_;
};

}  // namespace

std::unique_ptr<BatchSource> make_shard_batch_source(const Config& cfg, const Tokenizer& tokenizer) {
  return std::make_unique<ShardBatchSource>(cfg, tokenizer);
}

}  // namespace deepen
