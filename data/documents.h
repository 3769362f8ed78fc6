// Documents as training sequences (data.packing = "documents"): how many targets a document gives,
// and which leading documents make the fixed replay shard.
#pragma once

#include <cstdint>
#include <string>

#include "data/token_shards.h"

namespace deepen {

// Targets of one document of `tokens` tokens (its EOS included) cut to its first `max_len`
// tokens: m = min(tokens, max_len) tokens give m − 1 next-token targets (inputs are its first
// m − 1 tokens, labels its last m − 1), as a causal LM trained on the truncated document scores it.
// Example: max_len 8: a 5-token document gives 4 targets, a 20-token one 7.
inline int64_t document_targets(int64_t tokens, int64_t max_len) {
  const int64_t m = tokens < max_len ? tokens : max_len;
  return m > 0 ? m - 1 : 0;
}

// The fixed replay shard: the smallest D such that documents [0, D) of `train` give at least
// `target_tokens` targets (document_targets each). Example: documents of 5, 3, 9 tokens, max_len 8,
// target 10 -> 4 + 2 = 6 < 10, + 7 = 13 >= 10 -> D = 3. Throws InputError naming `key` and the
// split's total when the split holds fewer targets than asked.
int64_t replay_shard_documents(const ShardSet& train, int64_t target_tokens, int64_t max_len, const std::string& key,
                               const std::string& train_path);

}  // namespace deepen
