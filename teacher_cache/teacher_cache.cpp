// A teacher cache opened for reading: files mapped and checked, a micro-batch's targets decoded.
#include "teacher_cache/teacher_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "config/input_error.h"
#include "train/micro_batch.h"

namespace deepen {
namespace {
namespace fs = std::filesystem;
}  // namespace

std::shared_ptr<const TeacherCache> TeacherCache::open(const std::string& dir) {
  auto cache = std::shared_ptr<TeacherCache>(new TeacherCache());
  cache->dir_ = dir;
  cache->manifest_ = read_cache_manifest(dir);
  const CacheManifest& m = cache->manifest_;
  for (const CacheFileEntry& f : m.files) {
    const std::string path = (fs::path(dir) / f.path).string();
    const std::string named = path + " (hash " + hash_hex(f.hash) + ", " + std::to_string(f.bytes) + " bytes in " +
                              cache_manifest_path(dir) + ")";
    if (!fs::exists(path)) throw InputError("teacher cache file missing: " + named);
    if (fs::file_size(path) != f.bytes)
      throw InputError("teacher cache file of the wrong size: " + named + " has " + std::to_string(fs::file_size(path)) +
                       " bytes (truncated or replaced)");
    try {
      CacheFile file = CacheFile::open(path);
      const CacheFileHeader& h = file.header();
      if (h.payload_hash != f.hash || static_cast<int64_t>(h.first_sequence) != f.first_sequence ||
          static_cast<int64_t>(h.sequences) != f.sequences || static_cast<int64_t>(h.records) != f.records ||
          h.samples != static_cast<uint32_t>(m.samples) || h.topk != static_cast<uint32_t>(m.topk))
        throw InputError("teacher cache file not the one its manifest lists: " + named + ": its header says hash " +
                         hash_hex(h.payload_hash) + ", sequences " + std::to_string(h.first_sequence) + "+" +
                         std::to_string(h.sequences));
      cache->by_split_[f.split == 0 ? 0 : 1].push_back(cache->files_.size());
      cache->files_.push_back(std::move(file));
    } catch (const std::runtime_error& e) {
      if (dynamic_cast<const InputError*>(&e)) throw;
      throw InputError("teacher cache file corrupt: " + named + ": " + e.what());
    }
  }
  for (auto& list : cache->by_split_)
    std::sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return cache->files_[a].header().first_sequence < cache->files_[b].header().first_sequence;
    });
  return cache;
}

TeacherCache::Location TeacherCache::locate(int64_t split, int64_t item) const {
  const std::vector<size_t>& list = by_split_[split == 0 ? 0 : 1];
  // The last file whose first sequence is <= item.
  auto it = std::upper_bound(list.begin(), list.end(), item, [&](int64_t x, size_t f) {
    return x < static_cast<int64_t>(files_[f].header().first_sequence);
  });
  if (it != list.begin()) {
    const CacheFile& f = files_[*(it - 1)];
    const int64_t index = item - static_cast<int64_t>(f.header().first_sequence);
    if (index < static_cast<int64_t>(f.header().sequences)) return {&f, index};
  }
  const int64_t held = split == 0 ? manifest_.train_sequences : manifest_.valid_sequences;
  throw InputError(dir_ + ": the teacher cache holds " + (split == 0 ? "train" : "validation") + " sequences [0, " +
                   std::to_string(held) + "); sequence " + std::to_string(item) + " is not in it");
}

int64_t TeacherCache::bytes_of(int64_t split, const std::vector<int64_t>& items) const {
  int64_t n = 0;
  for (int64_t item : items) {
    const Location at = locate(split, item);
    n += static_cast<int64_t>(at.file->sequence_bytes(at.index).size());
  }
  return n;
}

TeacherTargets TeacherCache::read(int64_t split, const std::vector<int64_t>& items, const at::Tensor& labels,
                                  CacheTargets which) const {
  const at::Tensor y = labels.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = y.size(0), T = y.size(1), N = B * T;
  if (static_cast<int64_t>(items.size()) != B)
    throw std::invalid_argument("TeacherCache::read: " + std::to_string(items.size()) + " items for " + std::to_string(B) + " rows");
  const uint32_t K = static_cast<uint32_t>(manifest_.samples), k = static_cast<uint32_t>(manifest_.topk);
  const bool topk = which == CacheTargets::kTopk;
  if (topk && k == 0) throw InputError(dir_ + ": cache.targets = \"topk\", but this teacher cache stores no top-k (cache.topk = 0 when made)");
  // Decode every row first: the sampled width M is the batch's widest record.
  std::vector<std::vector<CacheRecord>> rows(static_cast<size_t>(B));
  size_t widest = 1;
  const int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const Location at = locate(split, items[static_cast<size_t>(b)]);
    int64_t targets = 0;
    while (targets < T && yp[b * T + targets] != kIgnoreLabel) ++targets;
    const int64_t n = at.file->records(at.index);
    if (n != targets)
      throw InputError(dir_ + ": " + (split == 0 ? "train" : "validation") + " sequence " +
                       std::to_string(items[static_cast<size_t>(b)]) + " has " + std::to_string(n) +
                       " cached targets, the batch " + std::to_string(targets) +
                       " (a cache of other data: data.seq_len, data.max_len or the shards differ)");
    std::vector<CacheRecord>& out = rows[static_cast<size_t>(b)];
    out.resize(static_cast<size_t>(n));
    const std::span<const unsigned char> bytes = at.file->sequence_bytes(at.index);
    const unsigned char* p = bytes.data();
    const unsigned char* end = p + bytes.size();
    try {
      for (CacheRecord& r : out) {
        p = decode_cache_record(p, end, K, k, r);
        widest = std::max(widest, r.ids.size());
      }
      if (p != end) throw std::runtime_error("corrupt record: trailing bytes");
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(at.file->path() + ": sequence " + std::to_string(items[static_cast<size_t>(b)]) + ": " + e.what());
    }
  }
  if (topk) {
    at::Tensor values = at::full({N, static_cast<int64_t>(k)}, -std::log(static_cast<double>(k)), at::kFloat);
    at::Tensor indices = at::arange(static_cast<int64_t>(k), at::kLong).repeat({N, 1});
    float* v = values.data_ptr<float>();
    int64_t* ix = indices.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      for (size_t t = 0; t < rows[static_cast<size_t>(b)].size(); ++t) {
        const CacheRecord& r = rows[static_cast<size_t>(b)][t];
        const int64_t row = b * T + static_cast<int64_t>(t);
        for (uint32_t j = 0; j < k; ++j) {
          v[row * k + j] = r.topk_logp[j];
          ix[row * k + j] = r.topk_ids[j];
        }
      }
    return TeacherTargets::topk(values, indices);
  }
  const int64_t M = static_cast<int64_t>(widest);
  at::Tensor ids = at::zeros({N, M}, at::kLong);
  at::Tensor weights = at::zeros({N, M}, at::kFloat);
  at::Tensor entropy = at::zeros({N}, at::kFloat);
  int64_t* ip = ids.data_ptr<int64_t>();
  float* wp = weights.data_ptr<float>();
  float* hp = entropy.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (size_t t = 0; t < rows[static_cast<size_t>(b)].size(); ++t) {
      const CacheRecord& r = rows[static_cast<size_t>(b)][t];
      const int64_t row = b * T + static_cast<int64_t>(t);
      hp[row] = r.entropy;
      for (size_t j = 0; j < r.ids.size(); ++j) {
        ip[row * M + static_cast<int64_t>(j)] = r.ids[j];
        wp[row * M + static_cast<int64_t>(j)] = static_cast<float>(r.counts[j]) / static_cast<float>(K);
      }
    }
  return TeacherTargets::sampled(ids, weights, entropy);
}

}  // namespace deepen
