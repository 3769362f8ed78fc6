// Teacher cache files: the on-disk layout of one file of targets, its streaming atomic writer and its
// validated memory-mapped reader. Torch-free: writer and reader take and give plain arrays.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deepen {

// A cache file holds the teacher's targets for a run of consecutive sequences (windows or
// documents) of one split, position by position (one record per next-token target, in order).
// Layout (little-endian), a 64-byte header, the records, then the index:
//   offset size field
//   0      8    magic "DPNCACHE"
//   8      4    version (kCacheFileVersion)
//   12     4    samples K: draws per token (every record's counts sum to it)
//   16     4    top-k k stored per record (0 = none)
//   20     4    reserved (0)
//   24     8    first sequence: the split's index of the file's first sequence
//   32     8    sequences n
//   40     8    records (targets) in the file
//   48     8    payload hash: hash64 of each 1 MiB block of the bytes after the header, chained
//   56     4    reserved (0)
//   60     4    header check: low 32 bits of hash64(bytes 0..59)
//   64     ...  records; sequence i's are bytes [offset_i, offset_{i+1}) of this region
//   then   8·(n+1) + 4·n   the index: offsets (u64, offset_0 = 0, offset_n = the records' bytes), then
//               each sequence's record count (u32)
// One record (one target position of a sequence):
//   entropy  f32: the teacher's entropy H(p_T^τ) at this position, in nats
//   m        varint (LEB128): how many distinct ids the K draws gave
//   ids      m varints: the smallest id, then each next id minus the previous one (ascending, > 0)
//   counts   m varints: how often each id came up (they sum to K)
//   top-k    (k > 0) k × u32 ids, then k × f32 log p_T^τ, largest first
// Example, K = 4, draws {17, 17, 301, 5}, no top-k: f32 H, then 03 | 05 0c 9c 02 | 01 02 01
// (ids 5, 17 = 5 + 12, 301 = 17 + 284; counts 1, 2, 1): 4 + 1 + 4 + 3 = 12 bytes.
// Ids below 128 take one byte, below 16,384 two, below 2,097,152 three: at V = 151,936 and m
// distinct ids a record is 5 + ~3m bytes (sorted ids are ~V/m apart), at most 5 + 4K.
inline constexpr char kCacheFileMagic[8] = {'D', 'P', 'N', 'C', 'A', 'C', 'H', 'E'};
inline constexpr uint32_t kCacheFileVersion = 1;
inline constexpr size_t kCacheFileHeaderBytes = 64;

struct CacheFileHeader {
  uint32_t version = kCacheFileVersion;
  uint32_t samples = 0;
  uint32_t topk = 0;
  uint64_t first_sequence = 0;
  uint64_t sequences = 0;
  uint64_t records = 0;
  uint64_t payload_hash = 0;
};

// One record as the writer takes it and the reader gives it.
struct CacheRecord {
  float entropy = 0;
  std::vector<uint32_t> ids;     // distinct, ascending
  std::vector<uint32_t> counts;  // same length, each >= 1, summing to K
  std::vector<uint32_t> topk_ids;
  std::vector<float> topk_logp;
};

// Appends one record's bytes to `out`. Throws std::invalid_argument when ids are not ascending and
// distinct, counts do not sum to `samples`, or the top-k has another length than `topk`.
void encode_cache_record(const CacheRecord& r, uint32_t samples, uint32_t topk, std::vector<unsigned char>& out);

// Decodes the record at `p` (ending no later than `end`) into `r` (reusing its vectors) and returns
// the byte after it; throws std::runtime_error("corrupt record ...") on a truncated or inconsistent one.
const unsigned char* decode_cache_record(const unsigned char* p, const unsigned char* end, uint32_t samples,
                                         uint32_t topk, CacheRecord& r);

// Streams records into `path` through `path`.tmp: the file appears under its name only on commit()
// (header, index, fsync, rename); a writer destroyed before that removes its temporary file, so a
// killed writer leaves no file that looks complete. Throws std::runtime_error naming the path on
// I/O failure.
class CacheFileWriter {
 public:
  CacheFileWriter(std::string path, uint32_t samples, uint32_t topk, uint64_t first_sequence);
  ~CacheFileWriter();
  CacheFileWriter(const CacheFileWriter&) = delete;
  CacheFileWriter& operator=(const CacheFileWriter&) = delete;

  // The records of the next sequence, in position order.
  void append_sequence(const std::vector<CacheRecord>& records);
  // Writes the index and the header, then renames the file into place. Returns the header written.
  CacheFileHeader commit();

 private:
  void write_bytes(const unsigned char* p, size_t n);
  std::string path_, tmp_path_;
  CacheFileHeader header_;
  int fd_ = -1;
  std::vector<unsigned char> block_, record_;
  std::vector<uint64_t> offsets_{0};
  std::vector<uint32_t> counts_;
  uint64_t bytes_ = 0, blocks_ = 0;
  bool committed_ = false;
};

// One memory-mapped cache file, header and index validated on open (magic, version, header check,
// file size, offsets increasing and inside the records). Copies share the mapping.
class CacheFile {
 public:
  static CacheFile open(const std::string& path);  // throws std::runtime_error "<path>: <reason>"
  const CacheFileHeader& header() const;
  const std::string& path() const;
  // Sequence i of the file (0 <= i < header().sequences): its record count and its bytes.
  int64_t records(int64_t i) const;
  std::span<const unsigned char> sequence_bytes(int64_t i) const;
  // Hashes every byte after the header as the writer did (the payload hash).
  uint64_t hash_payload() const;
  uint64_t bytes() const;  // the file's size

 private:
  struct State;
  explicit CacheFile(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// Reads only the 64-byte header of `path` (throws std::runtime_error naming it when it is not a
// valid cache file header).
CacheFileHeader read_cache_file_header(const std::string& path);

}  // namespace deepen
