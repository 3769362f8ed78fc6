// Teacher cache files: record encoding, the streaming temp-file writer, the mmap reader.
#include "teacher_cache/cache_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "config/binary_fields.h"
#include "config/hash.h"

namespace deepen {
namespace {

void put_varint(std::vector<unsigned char>& out, uint32_t v) {
  while (v >= 0x80) {
    out.push_back(uint8_t(v | 0x80));
    v >>= 7;
  }
  out.push_back(uint8_t(v));
}

const unsigned char* get_varint(const unsigned char* p, const unsigned char* end, uint32_t& v) {
  v = 0;
  for (int shift = 0; shift < 35; shift += 7) {
    if (p >= end) throw std::runtime_error("corrupt record: truncated varint");
    const uint32_t byte = *p++;
    v |= (byte & 0x7f) << shift;
    if (!(byte & 0x80)) return p;
  }
  throw std::runtime_error("corrupt record: varint longer than 5 bytes");
}

void encode_header(const CacheFileHeader& h, unsigned char* p) {
  std::memset(p, 0, kCacheFileHeaderBytes);
  std::memcpy(p, kCacheFileMagic, 8);
  put32(p + 8, h.version);
  put32(p + 12, h.samples);
  put32(p + 16, h.topk);
  put64(p + 24, h.first_sequence);
  put64(p + 32, h.sequences);
  put64(p + 40, h.records);
  put64(p + 48, h.payload_hash);
  put32(p + 60, uint32_t(hash64(p, 60)));
}

CacheFileHeader decode_header(const unsigned char* p, const std::string& path) {
  if (std::memcmp(p, kCacheFileMagic, 8) != 0) throw std::runtime_error(path + ": not a teacher cache file (bad magic)");
  if (get32(p + 60) != uint32_t(hash64(p, 60))) throw std::runtime_error(path + ": header check failed (corrupt header)");
  CacheFileHeader h;
  h.version = get32(p + 8);
  if (h.version != kCacheFileVersion)
    throw std::runtime_error(path + ": cache file version " + std::to_string(h.version) + ", this deepen reads " +
                             std::to_string(kCacheFileVersion));
  h.samples = get32(p + 12);
  h.topk = get32(p + 16);
  h.first_sequence = get64(p + 24);
  h.sequences = get64(p + 32);
  h.records = get64(p + 40);
  h.payload_hash = get64(p + 48);
  return h;
}

std::string sys_error() { return std::strerror(errno); }

}  // namespace

void encode_cache_record(const CacheRecord& r, uint32_t samples, uint32_t topk, std::vector<unsigned char>& out) {
  if (r.ids.size() != r.counts.size() || r.ids.empty())
    throw std::invalid_argument("cache record: " + std::to_string(r.ids.size()) + " ids and " +
                                std::to_string(r.counts.size()) + " counts");
  if (r.topk_ids.size() != topk || r.topk_logp.size() != topk)
    throw std::invalid_argument("cache record: top-k of " + std::to_string(r.topk_ids.size()) + ", the file stores " +
                                std::to_string(topk));
  uint64_t total = 0;
  for (size_t j = 0; j < r.ids.size(); ++j) {
    if (j > 0 && r.ids[j] <= r.ids[j - 1]) throw std::invalid_argument("cache record: ids not ascending and distinct");
    if (r.counts[j] == 0) throw std::invalid_argument("cache record: a count of 0");
    total += r.counts[j];
  }
  if (total != samples)
    throw std::invalid_argument("cache record: counts sum to " + std::to_string(total) + ", not K = " + std::to_string(samples));
  unsigned char f[4];
  std::memcpy(f, &r.entropy, 4);  // little-endian hosts only (as the shards)
  out.insert(out.end(), f, f + 4);
  put_varint(out, static_cast<uint32_t>(r.ids.size()));
  uint32_t prev = 0;
  for (size_t j = 0; j < r.ids.size(); ++j) {
    put_varint(out, j == 0 ? r.ids[j] : r.ids[j] - prev);
    prev = r.ids[j];
  }
  for (uint32_t c : r.counts) put_varint(out, c);
  for (uint32_t id : r.topk_ids) {
    unsigned char b[4];
    put32(b, id);
    out.insert(out.end(), b, b + 4);
  }
  for (float v : r.topk_logp) {
    std::memcpy(f, &v, 4);
    out.insert(out.end(), f, f + 4);
  }
}

const unsigned char* decode_cache_record(const unsigned char* p, const unsigned char* end, uint32_t samples,
                                         uint32_t topk, CacheRecord& r) {
  if (end - p < 4) throw std::runtime_error("corrupt record: truncated entropy");
  std::memcpy(&r.entropy, p, 4);
  p += 4;
  uint32_t m = 0;
  p = get_varint(p, end, m);
  if (m == 0 || m > samples) throw std::runtime_error("corrupt record: " + std::to_string(m) + " distinct ids of K = " +
                                                      std::to_string(samples) + " draws");
  r.ids.resize(m);
  r.counts.resize(m);
  uint32_t id = 0;
  for (uint32_t j = 0; j < m; ++j) {
    uint32_t d = 0;
    p = get_varint(p, end, d);
    if (j > 0 && d == 0) throw std::runtime_error("corrupt record: repeated id");
    id = j == 0 ? d : id + d;
    r.ids[j] = id;
  }
  uint64_t total = 0;
  for (uint32_t j = 0; j < m; ++j) {
    p = get_varint(p, end, r.counts[j]);
    total += r.counts[j];
  }
  if (total != samples)
    throw std::runtime_error("corrupt record: counts sum to " + std::to_string(total) + ", not K = " + std::to_string(samples));
  if (end - p < static_cast<std::ptrdiff_t>(8 * size_t(topk))) throw std::runtime_error("corrupt record: truncated top-k");
  r.topk_ids.resize(topk);
  r.topk_logp.resize(topk);
  for (uint32_t j = 0; j < topk; ++j, p += 4) r.topk_ids[j] = get32(p);
  for (uint32_t j = 0; j < topk; ++j, p += 4) std::memcpy(&r.topk_logp[j], p, 4);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Writer

CacheFileWriter::CacheFileWriter(std::string path, uint32_t samples, uint32_t topk, uint64_t first_sequence)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  header_.samples = samples;
  header_.topk = topk;
  header_.first_sequence = first_sequence;
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw std::runtime_error(tmp_path_ + ": cannot create: " + sys_error());
  unsigned char zero[kCacheFileHeaderBytes] = {};
  write_all(fd_, zero, sizeof zero, tmp_path_);  // the real header is written last
  block_.reserve(kHashBlockBytes);
}

CacheFileWriter::~CacheFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void CacheFileWriter::write_bytes(const unsigned char* p, size_t n) {
  while (n > 0) {
    const size_t take = std::min(n, kHashBlockBytes - block_.size());
    block_.insert(block_.end(), p, p + take);
    p += take;
    n -= take;
    if (block_.size() == kHashBlockBytes) {
      header_.payload_hash = chain_block(header_.payload_hash, block_.data(), block_.size(), blocks_++);
      write_all(fd_, block_.data(), block_.size(), tmp_path_);
      block_.clear();
    }
  }
}

void CacheFileWriter::append_sequence(const std::vector<CacheRecord>& records) {
  record_.clear();
  for (const CacheRecord& r : records) encode_cache_record(r, header_.samples, header_.topk, record_);
  write_bytes(record_.data(), record_.size());
  bytes_ += record_.size();
  offsets_.push_back(bytes_);
  counts_.push_back(static_cast<uint32_t>(records.size()));
  header_.records += records.size();
  ++header_.sequences;
}

CacheFileHeader CacheFileWriter::commit() {
  std::vector<unsigned char> index(8 * offsets_.size() + 4 * counts_.size());
  for (size_t i = 0; i < offsets_.size(); ++i) put64(index.data() + 8 * i, offsets_[i]);
  for (size_t i = 0; i < counts_.size(); ++i) put32(index.data() + 8 * offsets_.size() + 4 * i, counts_[i]);
  write_bytes(index.data(), index.size());
  if (!block_.empty()) {
    header_.payload_hash = chain_block(header_.payload_hash, block_.data(), block_.size(), blocks_++);
    write_all(fd_, block_.data(), block_.size(), tmp_path_);
    block_.clear();
  }
  unsigned char h[kCacheFileHeaderBytes];
  encode_header(header_, h);
  if (::pwrite(fd_, h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
    throw std::runtime_error(tmp_path_ + ": header write failed: " + sys_error());
  if (::fsync(fd_) != 0) throw std::runtime_error(tmp_path_ + ": fsync failed: " + sys_error());
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw std::runtime_error(tmp_path_ + ": close failed: " + sys_error());
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error(path_ + ": rename from " + tmp_path_ + " failed: " + sys_error());
  committed_ = true;
  return header_;
}

// ---------------------------------------------------------------------------------------------
// Reader

struct CacheFile::State {
  std::string path;
  CacheFileHeader header;
  const unsigned char* map = nullptr;
  size_t size = 0;
  const unsigned char* records = nullptr;  // after the header
  const unsigned char* offsets = nullptr;  // the index
  const unsigned char* counts = nullptr;
  ~State() {
    if (map) ::munmap(const_cast<unsigned char*>(map), size);
  }
};

CacheFileHeader read_cache_file_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + sys_error());
  unsigned char h[kCacheFileHeaderBytes];
  const ssize_t n = ::pread(fd, h, sizeof h, 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof h)) throw std::runtime_error(path + ": shorter than a cache file header");
  return decode_header(h, path);
}

CacheFile CacheFile::open(const std::string& path) {
  auto s = std::make_shared<State>();
  s->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + sys_error());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat: " + sys_error());
  }
  s->size = static_cast<size_t>(st.st_size);
  if (s->size < kCacheFileHeaderBytes) {
    ::close(fd);
    throw std::runtime_error(path + ": shorter than a cache file header");
  }
  void* map = ::mmap(nullptr, s->size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error(path + ": cannot map: " + sys_error());
  s->map = static_cast<const unsigned char*>(map);
  s->header = decode_header(s->map, path);
  const uint64_t n = s->header.sequences;
  const uint64_t index_bytes = 8 * (n + 1) + 4 * n;
  if (s->size < kCacheFileHeaderBytes + index_bytes) throw std::runtime_error(path + ": truncated (no room for its index)");
  const uint64_t record_bytes = s->size - kCacheFileHeaderBytes - index_bytes;
  s->records = s->map + kCacheFileHeaderBytes;
  s->offsets = s->records + record_bytes;
  s->counts = s->offsets + 8 * (n + 1);
  uint64_t prev = 0, records = 0;
  for (uint64_t i = 0; i <= n; ++i) {
    const uint64_t o = get64(s->offsets + 8 * i);
    if ((i == 0 && o != 0) || o < prev || o > record_bytes || (i == n && o != record_bytes))
      throw std::runtime_error(path + ": corrupt index (offset " + std::to_string(i) + ")");
    prev = o;
  }
  for (uint64_t i = 0; i < n; ++i) records += get32(s->counts + 4 * i);
  if (records != s->header.records)
    throw std::runtime_error(path + ": corrupt index (" + std::to_string(records) + " records, the header says " +
                             std::to_string(s->header.records) + ")");
  return CacheFile(std::move(s));
}

const CacheFileHeader& CacheFile::header() const { return state_->header; }
const std::string& CacheFile::path() const { return state_->path; }
uint64_t CacheFile::bytes() const { return state_->size; }

int64_t CacheFile::records(int64_t i) const { return get32(state_->counts + 4 * i); }

std::span<const unsigned char> CacheFile::sequence_bytes(int64_t i) const {
  const uint64_t a = get64(state_->offsets + 8 * i), b = get64(state_->offsets + 8 * (i + 1));
  return {state_->records + a, static_cast<size_t>(b - a)};
}

uint64_t CacheFile::hash_payload() const {
  uint64_t h = 0, index = 0;
  const unsigned char* p = state_->map + kCacheFileHeaderBytes;
  size_t left = state_->size - kCacheFileHeaderBytes;
  while (left > 0) {
    const size_t n = std::min(left, kHashBlockBytes);
    h = chain_block(h, p, n, index++);
    p += n;
    left -= n;
  }
  return h;
}

}  // namespace deepen
