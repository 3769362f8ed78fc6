// The BatchSource of a config: token shards (deepen prep) read through the deterministic sampler.
#pragma once

#include <memory>

#include "config/config.h"
#include "train/batch_source.h"

namespace deepen {

class Tokenizer;

// Opens data.train and data.valid (validated against the tokenizer's vocabulary) and serves
// micro-batches of parallel.micro_batch sequences of data.seq_len + 1 tokens (inputs + next-token
// labels). Train batches: the global batch of step s is students × grad_accum × micro_batch
// sequences; student r's micro-batch m is slice (r·grad_accum + m) of it, so a run on S students and
// a run on one process with S·grad_accum micro-batches see the same sequences. Eval batches: the
// first eval.batches × micro_batch validation sequences, in order. Diagnostic batch: the first
// eval.diagnostic_batch validation sequences. Throws InputError for missing, empty or inconsistent
// shards, or too little validation data.
std::unique_ptr<BatchSource> make_shard_batch_source(const Config& cfg, const Tokenizer& tokenizer);

}  // namespace deepen
