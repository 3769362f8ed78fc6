// The large-buffer cache's decisions (see large_buffer_cache.h).
#include "train/large_buffer_cache.h"

#include <algorithm>

namespace deepen {

std::optional<LargeBufferCache::Mapping> LargeBufferCache::take(size_t bytes) {
  const auto it = by_size_.lower_bound(bytes);
  if (it == by_size_.end() || it->first > bytes + bytes / 8) return std::nullopt;
  const Mapping m = it->second.mapping;
  by_size_.erase(it);
  cached_ -= m.bytes;
  live_ += m.bytes;
  peak_ = std::max(peak_, live_);
  return m;
}

std::vector<LargeBufferCache::Mapping> LargeBufferCache::make_room(size_t bytes) {
  peak_ = std::max(peak_, live_ + bytes);
  std::vector<Mapping> out;
  while (!by_size_.empty() && live_ + cached_ + bytes > peak_ + peak_ / 8) {
    auto oldest = by_size_.begin();
    for (auto it = by_size_.begin(); it != by_size_.end(); ++it)
      if (it->second.freed_at < oldest->second.freed_at) oldest = it;
    out.push_back(oldest->second.mapping);
    cached_ -= oldest->second.mapping.bytes;
    by_size_.erase(oldest);
  }
  return out;
}

void LargeBufferCache::mapped(size_t bytes) {
  live_ += bytes;
  peak_ = std::max(peak_, live_);
}

void LargeBufferCache::give_back(const Mapping& m) {
  live_ -= std::min(live_, m.bytes);
  cached_ += m.bytes;
  by_size_.emplace(m.bytes, Entry{m, ++clock_});
}

}  // namespace deepen
