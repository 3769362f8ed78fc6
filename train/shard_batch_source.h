// The BatchSource of a config: token shards (deepen prep) read through the deterministic sampler.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/token_shards.h"

#include "train/run_plan.h"
#include "train/batch_source.h"

namespace deepen {

class Tokenizer;

// Opens the plan's data.train and data.valid (validated against the tokenizer's vocabulary) and serves
// micro-batches of parallel.micro_batch sequences. data.packing = "windows": sequences of
// data.seq_len + 1 tokens (inputs + next-token labels). "documents": one document per row, cut to
// data.max_len tokens and right-padded to the micro-batch's longest (train/document_batch.h); the
// shards' document index (data/token_shards.h) finds them, so no re-tokenization; shards without
// one are an InputError naming the file. Train batches: the global batch of step s is students ×
// grad_accum × micro_batch samples of the sampler's stream (data/sampler.h; with
// data.replay_shard_tokens, the replay shard); student r's micro-batch m is slice
// (r·grad_accum + m) of it, so a run on S students and a run on one process with S·grad_accum
// micro-batches see the same sequences. Eval batches: the first eval.batches × micro_batch
// validation items in order, or (data.valid_documents = N) all of the first N documents. Diagnostic
// batch: the first eval.diagnostic_batch validation items. Throws InputError for missing, empty or
// inconsistent shards, or too little validation data.
std::unique_ptr<BatchSource> make_shard_batch_source(const RunPlan& plan, const Tokenizer& tokenizer);

// data.train or data.valid (`path`) opened as a run opens it: windows of data.seq_len + 1 tokens, or
// (documents) with the document index required. InputError naming the file otherwise.
ShardSet open_data_split(const std::string& path, const DataConfig& data, const Tokenizer& tokenizer);

// The micro-batch of `items` (sequences, or with documents the documents) of `set`, read as a run
// reads them (inputs, labels, padding, checksum; kind, step, student and index left at their
// defaults). What the teacher cache's writer feeds its teacher (teacher_cache/).
MicroBatch read_micro_batch(const ShardSet& set, const std::vector<int64_t>& items, const DataConfig& data,
                            int64_t pad_id);

}  // namespace deepen
