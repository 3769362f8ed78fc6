// Token shards: the file format `deepen prep` writes, a streaming atomic writer, a validated
// memory-mapped reader, and ShardSet, a folder of shards read as one token stream cut into sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deepen {

// File layout (little-endian), a 64-byte header then the tokens:
//   offset size field
//   0      8    magic "DPNTOKS\0"
//   8      4    version (kShardVersion)
//   12     4    bytes per token: 2 (uint16) when vocab_size <= 65536, else 4 (uint32)
//   16     8    vocab_size of the tokenizer that wrote it: every id is < vocab_size
//   24     8    token count
//   32     8    documents ended in this shard (informational)
//   40     8    tokenizer fingerprint (Tokenizer::fingerprint(); 0 = unknown)
//   48     8    payload hash: hash64 of each 1 MiB block of the token bytes, chained (Shard::verify)
//   56     4    largest id in the shard (checked against vocab_size on open; 0 when empty)
//   60     4    header check: low 32 bits of hash64(bytes 0..59)
//   64     ...  tokens
inline constexpr char kShardMagic[8] = {'D', 'P', 'N', 'T', 'O', 'K', 'S', '\0'};
inline constexpr uint32_t kShardVersion = 1;
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
  void add_documents(uint64_t n) { header_.doc_count += n; }
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
  uint64_t blocks_ = 0;
  bool finished_ = false, committed_ = false;
};

// Writes one whole shard (temporary file + rename), same errors as ShardWriter.
void write_shard(const std::string& path, std::span<const int32_t> tokens, uint64_t vocab_size,
                 uint64_t tokenizer_fingerprint, uint64_t doc_count = 0);

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
  int64_t documents() const;
  const std::vector<Shard>& shards() const { return shards_; }
  // Copies sequence i (window tokens) into out.
  void read_sequence(int64_t i, int64_t* out) const;
  void read_sequence(int64_t i, int32_t* out) const;
  // Tokens [begin, begin + n) of the stream, across shard boundaries.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  void read(int64_t begin, int64_t n, int64_t* out) const;

 private:
  template <class T> void read_any(int64_t begin, int64_t n, T* out) const;
  std::vector<Shard> shards_;
  std::vector<int64_t> offsets_;  // offsets_[i] = first token of shard i; back() = total
  int64_t window_ = 0;
  int64_t sequences_ = 0;
  uint64_t vocab_ = 0;
};

// Shard files a path names, sorted, without opening them: a folder's *.bin files, a glob's
// matches, or the file itself.
std::vector<std::string> list_shard_files(const std::string& path);

}  // namespace deepen
