// Qwen3 byte-level BPE read from a Hugging Face tokenizer.json (ids equal `tokenizers`' on any text).
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace deepen {

// Qwen3 checkpoints' embedding rows (config.json vocab_size); the tokenizer produces 151,669 ids.
inline constexpr int64_t kQwen3PaddedVocab = 151936;

// Encoding, as Hugging Face `tokenizers` does it for this file:
//   1. added tokens (all 26, special or not) are cut out of the raw text first, leftmost-longest;
//   2. each remaining piece is NFC-normalized, then split by the Qwen3 regex (qwen3_split.h);
//   3. each pre-token's bytes are merged by BPE: repeatedly the adjacent pair of lowest merge rank,
//      leftmost first, until no pair has a rank.
// Only the configuration Qwen2/Qwen3 files use is accepted (NFC; Split with exactly the Qwen regex,
// Isolated; ByteLevel without prefix space; BPE without dropout, byte fallback or affixes; added
// tokens without strip/single-word options); anything else is an InputError naming the file and
// the field, rather than ids that silently differ from `tokenizers`.
std::unique_ptr<Tokenizer> load_qwen3_tokenizer(const std::string& path);

}  // namespace deepen
