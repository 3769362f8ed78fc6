// The replay shard's document count: a walk over the document index (no token is read).
#include "data/documents.h"

#include "config/input_error.h"

namespace deepen {

int64_t replay_shard_documents(const ShardSet& train, int64_t target_tokens, int64_t max_len, const std::string& key,
                               const std::string& train_path) {
  int64_t have = 0;
  for (int64_t d = 0; d < train.documents(); ++d) {
    have += document_targets(train.document(d).tokens, max_len);
    if (have >= target_tokens) return d + 1;
  }
  throw InputError(key + " = " + std::to_string(target_tokens) + ": " + train_path + " holds only " +
                   std::to_string(have) + " target tokens in " + std::to_string(train.documents()) +
                   " documents (cut to data.max_len = " + std::to_string(max_len) + ")");
}

}  // namespace deepen
