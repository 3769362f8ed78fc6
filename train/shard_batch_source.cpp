// Micro-batches from token shards through the deterministic sampler, and the ids checksum they carry.
#include "train/shard_batch_source.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "config/hash.h"
#include "config/input_error.h"
#include "data/documents.h"
#include "data/sampler.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "train/document_batch.h"

namespace deepen {

uint64_t ids_checksum(const at::Tensor& ids) {
  const at::Tensor c = ids.to(at::kCPU, at::kLong).contiguous();
  return hash64(c.data_ptr(), c.nbytes(), 0x746f6b656e73ULL);
}

namespace {

constexpr const char* kNeedsIndex = "data.packing = \"documents\"";

// Documents are read back through the index, so a split needs only enough tokens for one of them.
int64_t shard_window(const DataConfig& d) { return d.packing == Packing::kDocuments ? 2 : d.seq_len + 1; }


// The sampler's replay shard: documents only; grow runs replay it, joint runs continue past it.
ReplayShard replay_shard(const Config& cfg, const ShardSet& train) {
  if (cfg.data.packing != Packing::kDocuments || cfg.data.replay_shard_tokens == 0) return {};
  return {replay_shard_documents(train, cfg.data.replay_shard_tokens, cfg.data.max_len,
                                 cfg.source + ": data.replay_shard_tokens", cfg.data.train),
          cfg.curriculum.mode == CurriculumMode::kGrow};
}

class ShardBatchSource : public BatchSource {
 public:
  ShardBatchSource(const RunPlan& plan, const Tokenizer& tok)
      : ShardBatchSource(plan.cfg, plan.counts, tok) {}
  ShardBatchSource(const Config& cfg, const BatchCounts& counts, const Tokenizer& tok)
      : data_(cfg.data),
        documents_(cfg.data.packing == Packing::kDocuments),
        seq_len_(cfg.data.seq_len),
        pad_id_(tok.eos_id()),
        micro_batch_(cfg.parallel.micro_batch),
        eval_batches_(counts.eval_batches),
        diagnostic_batch_(cfg.eval.diagnostic_batch),
        train_(open_data_split(cfg.data.train, cfg.data, tok)),
        valid_(open_data_split(cfg.data.valid, cfg.data, tok)),
        sampler_(static_cast<uint64_t>(data_order_seed(cfg)), documents_ ? train_.documents() : train_.sequences(),
                 {counts.students, counts.grad_accum, cfg.parallel.micro_batch}, replay_shard(cfg, train_)) {
    valid_count_ = documents_ ? valid_.documents() : valid_.sequences();
    if (documents_ && cfg.data.valid_documents > 0) {
      if (valid_count_ < cfg.data.valid_documents)
        throw InputError(cfg.source + ": data.valid_documents = " + std::to_string(cfg.data.valid_documents) + ": " +
                         cfg.data.valid + " holds only " + std::to_string(valid_count_) +
                         " documents (raise data.valid_fraction and re-run `deepen prep`)");
      valid_count_ = cfg.data.valid_documents;  // the fixed validation set: its first N documents
      if (diagnostic_batch_ > valid_count_)
        throw InputError(cfg.source + ": eval.diagnostic_batch = " + std::to_string(diagnostic_batch_) +
                         " exceeds data.valid_documents = " + std::to_string(valid_count_));
      return;
    }
    const int64_t need = std::max(eval_batches_ * micro_batch_, diagnostic_batch_);
    if (valid_count_ < need)
      throw InputError(cfg.data.valid + ": " + std::to_string(valid_count_) +
                       (documents_ ? " validation documents" : " validation sequences of " + std::to_string(seq_len_) + " tokens") +
                       ", but eval.batches × parallel.micro_batch = " + std::to_string(eval_batches_ * micro_batch_) +
                       " and eval.diagnostic_batch = " + std::to_string(diagnostic_batch_) + " need " + std::to_string(need));
  }

  MicroBatch train(int64_t step, int64_t student, int64_t micro) const override {
    MicroBatch mb = make(train_, sampler_.micro_batch(step, student, micro));
    mb.kind = BatchKind::kTrain;
    mb.step = step;
    mb.student = student;
    mb.index = micro;
    return mb;
  }

  // Batch i: validation items [i·b, (i+1)·b), the last batch of a fixed document set cut at its end.
  MicroBatch eval(int64_t index) const override {
    const auto [first, end] = eval_range(index);
    std::vector<int64_t> ids;
    for (int64_t i = first; i < end; ++i) ids.push_back(i);
    MicroBatch mb = make(valid_, ids);
    mb.kind = BatchKind::kEval;
    mb.index = index;
    return mb;
  }

  int64_t eval_batches() const override { return eval_batches_; }

  std::vector<int64_t> identity(const BatchKey& key) const override {
    std::vector<int64_t> ids;
    if (key.kind == BatchKind::kTrain) {
      ids.push_back(0);
      for (int64_t s : sampler_.micro_batch(key.step, key.student, key.index)) ids.push_back(s);
      return ids;
    }
    ids.push_back(1);
    if (key.kind == BatchKind::kDiagnostic) {
      for (int64_t b = 0; b < diagnostic_batch_; ++b) ids.push_back(b);
      return ids;
    }
    const auto [first, end] = eval_range(key.index);
    for (int64_t i = first; i < end; ++i) ids.push_back(i);
    return ids;
  }

  MicroBatch diagnostic() const override {
    std::vector<int64_t> ids(static_cast<size_t>(diagnostic_batch_));
    for (int64_t b = 0; b < diagnostic_batch_; ++b) ids[static_cast<size_t>(b)] = b;
    MicroBatch mb = make(valid_, ids);
    mb.kind = BatchKind::kDiagnostic;
    return mb;
  }

 private:
  std::pair<int64_t, int64_t> eval_range(int64_t index) const {
    const int64_t first = index * micro_batch_;
    return {first, documents_ ? std::min(first + micro_batch_, valid_count_) : first + micro_batch_};
  }

  MicroBatch make(const ShardSet& set, const std::vector<int64_t>& items) const {
    return read_micro_batch(set, items, data_, pad_id_);
  }

  DataConfig data_;
  bool documents_;
  int64_t seq_len_, pad_id_, micro_batch_, eval_batches_, diagnostic_batch_;
  ShardSet train_, valid_;
  Sampler sampler_;
  int64_t valid_count_ = 0;  // validation items an eval may read
};

}  // namespace

ShardSet open_data_split(const std::string& path, const DataConfig& d, const Tokenizer& tok) {
  ShardSet set = ShardSet::open(path, shard_window(d), static_cast<uint64_t>(tok.vocab_size()), tok.fingerprint());
  if (d.packing == Packing::kDocuments) {
    set.require_document_index(kNeedsIndex);
    if (set.documents() == 0) throw InputError(path + ": no complete document in its index (" + kNeedsIndex + ")");
  }
  return set;
}

MicroBatch read_micro_batch(const ShardSet& set, const std::vector<int64_t>& items, const DataConfig& data,
                            int64_t pad_id) {
  MicroBatch mb;
  if (data.packing == Packing::kDocuments) {
    // Only the first max_len tokens of a document are read: a long document costs no more.
    std::vector<std::vector<int64_t>> docs(items.size());
    for (size_t r = 0; r < items.size(); ++r) {
      const ShardSet::DocumentSpan d = set.document(items[r]);
      docs[r].resize(static_cast<size_t>(std::min(d.tokens, data.max_len)));
      set.read(d.begin, static_cast<int64_t>(docs[r].size()), docs[r].data());
    }
    try {
      PaddedDocuments p = pad_documents(docs, data.max_len, pad_id);
      mb.inputs = std::move(p.inputs);
      mb.labels = std::move(p.labels);
    } catch (const std::invalid_argument& e) {
      throw InputError(set.shards().front().path() + " (its split): " + e.what());
    }
  } else {
    const int64_t rows = static_cast<int64_t>(items.size()), seq_len = data.seq_len;
    at::Tensor window = at::empty({rows, seq_len + 1}, at::kLong);
    int64_t* out = window.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) set.read_sequence(items[static_cast<size_t>(r)], out + r * (seq_len + 1));
    mb.inputs = window.narrow(1, 0, seq_len).contiguous();
    mb.labels = window.narrow(1, 1, seq_len).contiguous();
  }
  mb.checksum = ids_checksum(mb.inputs);
  return mb;
}

std::unique_ptr<BatchSource> make_shard_batch_source(const RunPlan& plan, const Tokenizer& tokenizer) {
  return std::make_unique<ShardBatchSource>(plan, tokenizer);
}

}  // namespace deepen
