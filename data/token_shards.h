// Token shards: the file format `deepen prep` writes, a streaming atomic writer, a validated
// memory-mapped reader, and ShardSet, a folder of shards read as one token stream cut into sequences
// (packed windows) or into its documents (the document index).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deepen {

// File layout (little-endian), a 64-byte header, the tokens, then (version 2) the document index:
//   offset size field
//   0      8    magic "DPNTOKS\0"
//   8      4    version (kShardVersion; version 1 files, without the index, still read)
//   12     4    bytes per token: 2 (uint16) when vocab_size <= 65536, else 4 (uint32)
//   16     8    vocab_size of the tokenizer that wrote it: every id is < vocab_size
//   24     8    token count
//   32     8    documents ended in this shard (D: the length of the document index)
//   40     8    tokenizer fingerprint (Tokenizer::fingerprint(); 0 = unknown)
//   48     8    payload hash: hash64 of each 1 MiB block of the token bytes, chained (Shard::verify)
//   56     4    largest id in the shard (checked against vocab_size on open; 0 when empty)
//   60     4    header check: low 32 bits of hash64(bytes 0..59)
//   64     ...  tokens (token count × bytes per token)
//   then   8·D  version 2: the document index, D uint64 ends, strictly increasing, each <= the token
//               count: document j of this shard ends (exclusive, its EOS included) at local token
//               end_j. Prep cuts shards at a token count, so a document may begin in an earlier
//               shard: it begins where the previous document of the stream ended. The payload hash
//               covers the index too (chained after the token blocks).
// Example: documents of 3, 4 and 5 tokens in shards of 5 tokens:
//   shard 0: tokens 0..4, ends [3]      (document 1 runs on into shard 1)
//   shard 1: tokens 5..9, ends [2]      (document 1 = stream tokens [3, 7))
//   shard 2: tokens 10..11, ends [2]    (document 2 = stream tokens [7, 12))
inline constexpr char kShardMagic[8] = {'D', 'P', 'N', 'T', 'O', 'K', 'S', '\0'};
inline constexpr uint32_t kShardVersion = 2;
// The first version with the document index; older files read as token streams only.
inline constexpr uint32_t kShardDocumentIndexVersion = 2;
inline constexpr size_t kShardHeaderBytes = 64;
inline constexpr const char* kShardExtension = ".bin";

struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;
  uint64_t vocab_size = 0;
  uint64_t token_count = 0;
  uint64_t doc_count = 0;
  uint64_t tokenizer_fingerprint = 0;
  uint64_t payload_hash = 0;
  uint64_t max_id = 0;
  bool has_document_index() const { return version >= kShardDocumentIndexVersion; }
};

// Bytes per token for a vocabulary: 2 up to 65,536 ids, else 4.
uint32_t token_bytes_for_vocab(uint64_t vocab_size);

// Streams tokens into `path` through `path` + ".tmp": the shard appears under its name only on
// commit() (fsync + rename); a writer destroyed before that removes its temporary file, so a
// failed run leaves nothing behind. Throws InputError (naming the shard and position) for an id
// outside [0, vocab_size), std::runtime_error naming the path on I/O failure.
class ShardWriter {
 public:
  ShardWriter(std::string path, uint64_t vocab_size, uint64_t tokenizer_fingerprint);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void append(std::span<const int32_t> ids);
  // The document being appended ends here (after its EOS): records the token count in the index.
  // A document with no token in this shard (it ended exactly at the previous shard's end) is not
  // recorded twice: an end equal to the previous one throws std::logic_error.
  void end_document();
  uint64_t token_count() const { return header_.token_count; }
  const std::string& path() const { return path_; }
  // Writes the header and closes the file, still under its temporary name.
  void finish();
  // finish() if needed, then renames the temporary file to path().
  void commit();

 private:
  void flush_block();
  std::string path_, tmp_path_;
  ShardHeader header_;
  int fd_ = -1;
  std::vector<unsigned char> block_;
  std::vector<uint64_t> doc_ends_;
  uint64_t blocks_ = 0;
  bool finished_ = false, committed_ = false;
};

// Writes one whole shard (temporary file + rename), same errors as ShardWriter; `doc_ends` is its
// document index (local ends, see the layout above).
void write_shard(const std::string& path, std::span<const int32_t> tokens, uint64_t vocab_size,
                 uint64_t tokenizer_fingerprint, std::span<const uint64_t> doc_ends = {});

// One memory-mapped shard, header validated on open: magic, version, header check, token width,
// file size against the token count, largest id < vocab_size. Copies share the mapping.
class Shard {
 public:
  static Shard open(const std::string& path);  // throws InputError "<path>: <reason>"
  const ShardHeader& header() const;
  const std::string& path() const;
  int64_t size() const { return static_cast<int64_t>(header().token_count); }
  // Copies tokens [begin, begin + n). Every id is checked against vocab_size, so a flipped bit in
  // the payload fails here (InputError naming the file and position) instead of indexing past the
  // embedding; the check costs one compare per token.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  void read(int64_t begin, int64_t n, int64_t* out) const;
  // Full scan: payload hash and every id (prep's output passes; for data copied between machines).
  void verify() const;
  // Local end of document j of this shard (j < header().doc_count; version 2 files only: the
  // index is validated on open, so this is a plain read).
  int64_t document_end(int64_t j) const;

 private:
  struct State;
  explicit Shard(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// The shards of one split read as one token stream (files in name order), cut into sequences of
// `window` = seq_len + 1 tokens with stride seq_len: sequence i is tokens [i*seq_len,
// i*seq_len + seq_len + 1), inputs its first seq_len tokens and labels its last seq_len, so no
// token is lost between sequences; sequences may span two shards (prep cuts shards at a token
// count, not at documents). There are (tokens - 1) / seq_len of them.
// Example: 10 tokens t0..t9, window 4 (seq_len 3): sequences t0..t3, t3..t6, t6..t9.
class ShardSet {
 public:
  // `path`: a folder (its *.bin files), a glob ("data/train/*.bin") or one file. Throws InputError
  // naming the path or file and the reason: no shards ("empty dataset"), an invalid shard,
  // vocabularies or tokenizers that differ between shards or from the expected ones
  // (expected_fingerprint 0 skips that check), fewer tokens than one window.
  static ShardSet open(const std::string& path, int64_t window, uint64_t expected_vocab,
                       uint64_t expected_fingerprint);

  int64_t sequences() const { return sequences_; }
  int64_t window() const { return window_; }
  uint64_t vocab_size() const { return vocab_; }
  int64_t tokens() const { return offsets_.empty() ? 0 : offsets_.back(); }
  // Documents of the stream: the sum of the shards' document counts.
  int64_t documents() const;
  // True when every shard has a document index (format version 2).
  bool has_document_index() const;
  // Throws InputError naming the first shard without a document index and saying to re-run
  // `deepen prep`, with `why` (the config key that needs documents) in the message.
  void require_document_index(const std::string& why) const;
  // Document i (0 <= i < documents()) as stream tokens [begin, begin + tokens), its EOS included.
  // O(log shards). Example (the layout's): document 1 = {3, 4}.
  struct DocumentSpan {
    int64_t begin = 0, tokens = 0;
  };
  DocumentSpan document(int64_t i) const;
  const std::vector<Shard>& shards() const { return shards_; }
  // Copies sequence i (window tokens) into out.
  void read_sequence(int64_t i, int64_t* out) const;
  void read_sequence(int64_t i, int32_t* out) const;
  // Tokens [begin, begin + n) of the stream, across shard boundaries.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  void read(int64_t begin, int64_t n, int64_t* out) const;

 private:
  template <class T> void read_any(int64_t begin, int64_t n, T* out) const;
  int64_t document_end(int64_t i) const;  // stream end of document i
  std::vector<Shard> shards_;
  std::vector<int64_t> doc_offsets_;  // documents ended before shard k (prefix sums of doc_count)
  std::vector<int64_t> offsets_;  // offsets_[i] = first token of shard i; back() = total
  int64_t window_ = 0;
  int64_t sequences_ = 0;
  uint64_t vocab_ = 0;
};

// Shard files a path names, sorted, without opening them: a folder's *.bin files, a glob's
// matches, or the file itself.
std::vector<std::string> list_shard_files(const std::string& path);

}  // namespace deepen
