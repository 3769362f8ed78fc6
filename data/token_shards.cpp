// Token shards: header encoding and checks, streaming temp-file writer, mmap reader, ShardSet.
#include "data/token_shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "config/binary_fields.h"
#include "config/hash.h"
#include "config/input_error.h"

namespace deepen {
namespace {

namespace fs = std::filesystem;

void encode_header(const ShardHeader& h, unsigned char* p) {
  std::memset(p, 0, kShardHeaderBytes);
  std::memcpy(p, kShardMagic, 8);
  put32(p + 8, h.version);
  put32(p + 12, h.token_bytes);
  put64(p + 16, h.vocab_size);
  put64(p + 24, h.token_count);
  put64(p + 32, h.doc_count);
  put64(p + 40, h.tokenizer_fingerprint);
  put64(p + 48, h.payload_hash);
  put32(p + 56, uint32_t(h.max_id));
  put32(p + 60, uint32_t(hash64(p, 60)));
}

std::string sys_error() { return std::strerror(errno); }

}  // namespace

uint32_t token_bytes_for_vocab(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// ---------------------------------------------------------------------------------------------
// Writer

ShardWriter::ShardWriter(std::string path, uint64_t vocab_size, uint64_t tokenizer_fingerprint)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  if (vocab_size == 0 || vocab_size > (uint64_t(1) << 31))
    throw InputError(path_ + ": vocabulary size " + std::to_string(vocab_size) + " out of range");
  header_.token_bytes = token_bytes_for_vocab(vocab_size);
  header_.vocab_size = vocab_size;
  header_.tokenizer_fingerprint = tokenizer_fingerprint;
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw InputError(tmp_path_ + ": cannot create shard: " + sys_error());
  unsigned char placeholder[kShardHeaderBytes] = {};
  write_all(fd_, placeholder, sizeof placeholder, tmp_path_);
  block_.reserve(kHashBlockBytes);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void ShardWriter::append(std::span<const int32_t> ids) {
  if (finished_) throw std::logic_error(path_ + ": append after finish");
  const size_t tb = header_.token_bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || uint64_t(id) >= header_.vocab_size)
      throw InputError(path_ + ": token " + std::to_string(header_.token_count + i) + " has id " +
                       std::to_string(id) + ", outside the vocabulary [0, " + std::to_string(header_.vocab_size) + ")");
    header_.max_id = std::max<uint64_t>(header_.max_id, uint64_t(id));
    const size_t at = block_.size();
    block_.resize(at + tb);
    if (tb == 2) {
      block_[at] = uint8_t(id);
      block_[at + 1] = uint8_t(id >> 8);
    } else {
      put32(block_.data() + at, uint32_t(id));
    }
    if (block_.size() == kHashBlockBytes) flush_block();
  }
  header_.token_count += ids.size();
}

void ShardWriter::end_document() {
  if (finished_) throw std::logic_error(path_ + ": end_document after finish");
  if (!doc_ends_.empty() && doc_ends_.back() == header_.token_count)
    throw std::logic_error(path_ + ": empty document at token " + std::to_string(header_.token_count));
  doc_ends_.push_back(header_.token_count);
  header_.doc_count = doc_ends_.size();
}

void ShardWriter::flush_block() {
  if (block_.empty()) return;
  header_.payload_hash = chain_block(header_.payload_hash, block_.data(), block_.size(), blocks_++);
  write_all(fd_, block_.data(), block_.size(), tmp_path_);
  block_.clear();
}

void ShardWriter::finish() {
  if (finished_) return;
  flush_block();
  // The document index follows the tokens, hashed as further blocks of the same chain.
  std::vector<unsigned char> index(doc_ends_.size() * 8);
  for (size_t j = 0; j < doc_ends_.size(); ++j) put64(index.data() + 8 * j, doc_ends_[j]);
  for (size_t off = 0; off < index.size(); off += kHashBlockBytes) {
    const size_t n = std::min(kHashBlockBytes, index.size() - off);
    header_.payload_hash = chain_block(header_.payload_hash, index.data() + off, n, blocks_++);
  }
  write_all(fd_, index.data(), index.size(), tmp_path_);
  unsigned char hdr[kShardHeaderBytes];
  encode_header(header_, hdr);
  if (::pwrite(fd_, hdr, sizeof hdr, 0) != ssize_t(sizeof hdr))
    throw std::runtime_error(tmp_path_ + ": header write failed: " + sys_error());
  if (::fsync(fd_) != 0) throw std::runtime_error(tmp_path_ + ": fsync failed: " + sys_error());
  ::close(fd_);
  fd_ = -1;
  finished_ = true;
  std::vector<unsigned char>().swap(block_);  // prep keeps finished writers until commit: 1 MiB each otherwise
}

void ShardWriter::commit() {
  finish();
  if (committed_) return;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error(path_ + ": rename failed: " + sys_error());
  committed_ = true;
}

void write_shard(const std::string& path, std::span<const int32_t> tokens, uint64_t vocab_size,
                 uint64_t tokenizer_fingerprint, std::span<const uint64_t> doc_ends) {
  ShardWriter w(path, vocab_size, tokenizer_fingerprint);
  uint64_t at = 0;
  for (const uint64_t end : doc_ends) {
    if (end <= at || end > tokens.size())
      throw std::invalid_argument(path + ": document end " + std::to_string(end) + " not in (" + std::to_string(at) +
                                  ", " + std::to_string(tokens.size()) + "]");
    w.append(tokens.subspan(at, end - at));
    w.end_document();
    at = end;
  }
  w.append(tokens.subspan(at));
  w.commit();
}

// ---------------------------------------------------------------------------------------------
// Reader

struct Shard::State {
  std::string path;
  ShardHeader header;
  const unsigned char* map = nullptr;
  size_t map_size = 0;
  ~State() {
    if (map) ::munmap(const_cast<unsigned char*>(map), map_size);
  }
};

Shard Shard::open(const std::string& path) {
  auto state = std::make_shared<State>();
  state->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open shard: " + sys_error());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw InputError(path + ": cannot stat shard: " + sys_error());
  }
  const auto size = uint64_t(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw InputError(path + ": truncated: " + std::to_string(size) + " bytes, shorter than the " +
                     std::to_string(kShardHeaderBytes) + "-byte shard header");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw InputError(path + ": cannot map shard: " + sys_error());
  state->map = static_cast<const unsigned char*>(map);
  state->map_size = size;
  const unsigned char* p = state->map;
  if (std::memcmp(p, kShardMagic, 8) != 0)
    throw InputError(path + ": not a token shard (wrong magic; expected a file written by `deepen prep`)");
  ShardHeader& h = state->header;
  h.version = get32(p + 8);
  if (h.version < 1 || h.version > kShardVersion)
    throw InputError(path + ": shard format version " + std::to_string(h.version) + ", this deepen reads versions 1 to " +
                     std::to_string(kShardVersion) + " (re-run `deepen prep`)");
  if (get32(p + 60) != uint32_t(hash64(p, 60)))
    throw InputError(path + ": corrupted shard header (its check value does not match)");
  h.token_bytes = get32(p + 12);
  h.vocab_size = get64(p + 16);
  h.token_count = get64(p + 24);
  h.doc_count = get64(p + 32);
  h.tokenizer_fingerprint = get64(p + 40);
  h.payload_hash = get64(p + 48);
  h.max_id = get32(p + 56);
  if (h.vocab_size == 0 || h.vocab_size > (uint64_t(1) << 31))
    throw InputError(path + ": vocabulary size " + std::to_string(h.vocab_size) + " out of range");
  if (h.token_bytes != token_bytes_for_vocab(h.vocab_size))
    throw InputError(path + ": " + std::to_string(h.token_bytes) + " bytes per token does not fit vocab size " +
                     std::to_string(h.vocab_size));
  const uint64_t index_bytes = h.has_document_index() ? h.doc_count * 8 : 0;
  const uint64_t want = kShardHeaderBytes + h.token_count * h.token_bytes + index_bytes;
  if (h.token_count > (uint64_t(1) << 48) || h.doc_count > (uint64_t(1) << 48) || size != want)
    throw InputError(path + ": " + (size < want ? "truncated" : "trailing bytes") + ": " + std::to_string(size) +
                     " bytes, the header says " + std::to_string(h.token_count) + " tokens" +
                     (index_bytes ? " and " + std::to_string(h.doc_count) + " documents" : std::string()) + " (" +
                     std::to_string(want) + " bytes)");
  if (h.has_document_index()) {
    // Ends strictly increasing within (0, token_count]: a document is never empty or outside the shard.
    const unsigned char* index = p + kShardHeaderBytes + h.token_count * h.token_bytes;
    uint64_t previous = 0;
    for (uint64_t j = 0; j < h.doc_count; ++j) {
      const uint64_t end = get64(index + 8 * j);
      if (end <= previous) {
        throw InputError(path + ": corrupted document index: document " + std::to_string(j) + " ends at " +
                         std::to_string(end) + ", not after " + std::to_string(previous));
      }
      if (end > h.token_count)
        throw InputError(path + ": corrupted document index: document " + std::to_string(j) + " ends at " +
                         std::to_string(end) + ", past the shard's " + std::to_string(h.token_count) + " tokens");
      previous = end;
    }
  }
  if (h.token_count > 0 && h.max_id >= h.vocab_size)
    throw InputError(path + ": token id " + std::to_string(h.max_id) + " >= vocab size " + std::to_string(h.vocab_size));
  return Shard(std::move(state));
}

const ShardHeader& Shard::header() const { return state_->header; }
const std::string& Shard::path() const { return state_->path; }

int64_t Shard::document_end(int64_t j) const {
  const ShardHeader& h = state_->header;
  if (!h.has_document_index() || j < 0 || uint64_t(j) >= h.doc_count)
    throw std::out_of_range(state_->path + ": document " + std::to_string(j) + " of " + std::to_string(h.doc_count) +
                            (h.has_document_index() ? "" : " (no document index)"));
  return int64_t(get64(state_->map + kShardHeaderBytes + h.token_count * h.token_bytes + 8 * uint64_t(j)));
}

namespace {

template <class T>
void read_tokens(const std::string& path, const ShardHeader& h, const unsigned char* payload, int64_t begin,
                 int64_t n, T* out) {
  if (begin < 0 || n < 0 || uint64_t(begin + n) > h.token_count)
    throw std::out_of_range(path + ": tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                            ") outside the shard's " + std::to_string(h.token_count));
  const unsigned char* p = payload + size_t(begin) * h.token_bytes;
  const uint32_t vocab = uint32_t(h.vocab_size - 1);  // fits: vocab <= 2^31
  uint32_t worst = 0;
  if (h.token_bytes == 2) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t v = uint32_t(p[2 * i]) | (uint32_t(p[2 * i + 1]) << 8);
      worst = std::max(worst, v);
      out[i] = T(v);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t v = get32(p + 4 * i);
      worst = std::max(worst, v);
      out[i] = T(v);
    }
  }
  if (worst > vocab) {
    for (int64_t i = 0; i < n; ++i)
      if (uint64_t(uint32_t(out[i])) >= h.vocab_size)
        throw InputError(path + ": token " + std::to_string(begin + i) + " has id " +
                         std::to_string(uint32_t(out[i])) + " >= vocab size " + std::to_string(h.vocab_size));
  }
}

}  // namespace

void Shard::read(int64_t begin, int64_t n, int32_t* out) const {
  read_tokens(state_->path, state_->header, state_->map + kShardHeaderBytes, begin, n, out);
}

void Shard::read(int64_t begin, int64_t n, int64_t* out) const {
  read_tokens(state_->path, state_->header, state_->map + kShardHeaderBytes, begin, n, out);
}

void Shard::verify() const {
  const ShardHeader& h = state_->header;
  const unsigned char* p = state_->map + kShardHeaderBytes;
  const size_t n = size_t(h.token_count) * h.token_bytes;
  uint64_t hash = 0, index = 0;
  for (size_t off = 0; off < n; off += kHashBlockBytes)
    hash = chain_block(hash, p + off, std::min(kHashBlockBytes, n - off), index++);
  const size_t docs = h.has_document_index() ? size_t(h.doc_count) * 8 : 0;
  for (size_t off = 0; off < docs; off += kHashBlockBytes)
    hash = chain_block(hash, p + n + off, std::min(kHashBlockBytes, docs - off), index++);
  if (hash != h.payload_hash) throw InputError(state_->path + ": payload hash mismatch (corrupted tokens)");
  std::vector<int32_t> buf(1 << 16);
  for (int64_t at = 0; at < size(); at += int64_t(buf.size())) read(at, std::min<int64_t>(int64_t(buf.size()), size() - at), buf.data());
}

// ---------------------------------------------------------------------------------------------
// ShardSet

std::vector<std::string> list_shard_files(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == kShardExtension && e.is_regular_file(ec)) files.push_back(e.path().string());
  } else if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    if (::glob(path.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  } else if (fs::exists(path, ec)) {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

ShardSet ShardSet::open(const std::string& path, int64_t window, uint64_t expected_vocab,
                        uint64_t expected_fingerprint) {
  if (window < 2) throw InputError(path + ": sequence window " + std::to_string(window) + " (seq_len + 1) must be >= 2");
  std::error_code ec;
  const bool pattern = path.find_first_of("*?[") != std::string::npos;
  if (!pattern && !fs::exists(path, ec))
    throw InputError(path + ": no such shard file or folder (run `deepen prep` first)");
  const std::vector<std::string> files = list_shard_files(path);
  if (files.empty()) throw InputError(path + ": empty dataset: no *.bin shards there (run `deepen prep` first)");
  ShardSet set;
  set.window_ = window;
  set.vocab_ = expected_vocab;
  set.offsets_.push_back(0);
  for (const std::string& f : files) {
    Shard shard = Shard::open(f);
    const ShardHeader& h = shard.header();
    if (!set.shards_.empty()) {
      const ShardHeader& first = set.shards_.front().header();
      if (h.vocab_size != first.vocab_size)
        throw InputError(f + ": vocab size " + std::to_string(h.vocab_size) + " differs from " +
                         set.shards_.front().path() + "'s " + std::to_string(first.vocab_size));
      if (h.tokenizer_fingerprint != first.tokenizer_fingerprint)
        throw InputError(f + ": written by a different tokenizer than " + set.shards_.front().path() +
                         " (fingerprints differ)");
    }
    if (expected_vocab != 0 && h.vocab_size != expected_vocab)
      throw InputError(f + ": vocab size " + std::to_string(h.vocab_size) + ", but the tokenizer has " +
                       std::to_string(expected_vocab) + " (shards from another tokenizer?)");
    if (expected_fingerprint != 0 && h.tokenizer_fingerprint != 0 && h.tokenizer_fingerprint != expected_fingerprint)
      throw InputError(f + ": written by a different tokenizer with the same vocabulary size (fingerprint mismatch)");
    set.offsets_.push_back(set.offsets_.back() + int64_t(h.token_count));
    set.shards_.push_back(std::move(shard));
  }
  set.vocab_ = set.shards_.front().header().vocab_size;
  set.doc_offsets_.push_back(0);
  for (const Shard& s : set.shards_) set.doc_offsets_.push_back(set.doc_offsets_.back() + int64_t(s.header().doc_count));
  if (set.tokens() == 0)
    throw InputError(path + ": empty dataset: " + std::to_string(files.size()) + " shard file(s) hold 0 tokens");
  set.sequences_ = (set.tokens() - 1) / (window - 1);
  if (set.sequences_ == 0)
    throw InputError(path + ": " + std::to_string(set.tokens()) + " tokens, fewer than one sequence of " +
                     std::to_string(window) + " (data.seq_len + 1)");
  return set;
}

int64_t ShardSet::documents() const { return doc_offsets_.empty() ? 0 : doc_offsets_.back(); }

bool ShardSet::has_document_index() const {
  for (const Shard& s : shards_)
    if (!s.header().has_document_index()) return false;
  return true;
}

void ShardSet::require_document_index(const std::string& why) const {
  for (const Shard& s : shards_)
    if (!s.header().has_document_index())
      throw InputError(s.path() + ": shard format version " + std::to_string(s.header().version) +
                       " has no document index, which " + why +
                       " needs; re-run `deepen prep` (--overwrite) to rewrite the shards");
}

int64_t ShardSet::document_end(int64_t i) const {
  // Shard k holds the ends of documents [doc_offsets_[k], doc_offsets_[k + 1]).
  const size_t k = size_t(std::upper_bound(doc_offsets_.begin(), doc_offsets_.end(), i) - doc_offsets_.begin()) - 1;
  return offsets_[k] + shards_[k].document_end(i - doc_offsets_[k]);
}

ShardSet::DocumentSpan ShardSet::document(int64_t i) const {
  if (i < 0 || i >= documents())
    throw std::out_of_range("document " + std::to_string(i) + " of " + std::to_string(documents()));
  const int64_t begin = i == 0 ? 0 : document_end(i - 1);
  return {begin, document_end(i) - begin};
}

template <class T>
void ShardSet::read_any(int64_t begin, int64_t n, T* out) const {
  if (begin < 0 || n < 0 || begin + n > tokens())
    throw std::out_of_range("tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) + ") outside the " +
                            std::to_string(tokens()) + " of the shard set");
  size_t i = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  while (n > 0) {
    const int64_t take = std::min(n, offsets_[i + 1] - begin);
    if (take > 0) shards_[i].read(begin - offsets_[i], take, out);
    out += take;
    begin += take;
    n -= take;
    ++i;
  }
}

void ShardSet::read(int64_t begin, int64_t n, int32_t* out) const { read_any(begin, n, out); }
void ShardSet::read(int64_t begin, int64_t n, int64_t* out) const { read_any(begin, n, out); }

void ShardSet::read_sequence(int64_t i, int64_t* out) const {
  if (i < 0 || i >= sequences_)
    throw std::out_of_range("sequence " + std::to_string(i) + " of " + std::to_string(sequences_));
  read_any(i * (window_ - 1), window_, out);
}

void ShardSet::read_sequence(int64_t i, int32_t* out) const {
  if (i < 0 || i >= sequences_)
    throw std::out_of_range("sequence " + std::to_string(i) + " of " + std::to_string(sequences_));
  read_any(i * (window_ - 1), window_, out);
}

}  // namespace deepen
