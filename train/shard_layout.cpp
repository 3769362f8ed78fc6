// Flat-bucket layout of sharded data parallelism: buckets, padding, each rank's owned slices.
#include "train/shard_layout.h"

#include <algorithm>
#include <stdexcept>

namespace deepen {

ShardLayout make_shard_layout(const std::vector<int64_t>& numels, int64_t ranks, int64_t bucket_elements,
                              const std::vector<int64_t>& units) {
  if (ranks < 1 || bucket_elements < 1) throw std::invalid_argument("make_shard_layout: ranks and bucket size >= 1");
  if (!units.empty() && units.size() != numels.size())
    throw std::invalid_argument("make_shard_layout: one unit per parameter expected");
  ShardLayout layout;
  layout.ranks = ranks;
  layout.units = units.empty() ? std::vector<int64_t>(numels.size(), 0) : units;
  const int64_t n = static_cast<int64_t>(numels.size());
  int64_t i = 0;
  while (i < n) {
    ShardLayout::Bucket b;
    b.first_param = i;
    int64_t used = 0;
    // Same rule as the replicated all-reduce's buckets: consecutive parameters until the next one
    // would overflow; a parameter larger than a bucket travels alone.
    while (i < n && (i == b.first_param || (used + numels[static_cast<size_t>(i)] <= bucket_elements &&
                                            layout.units[static_cast<size_t>(i)] == layout.units[static_cast<size_t>(b.first_param)]))) {
      layout.params.push_back({static_cast<int64_t>(layout.buckets.size()), used, numels[static_cast<size_t>(i)]});
      used += numels[static_cast<size_t>(i)];
      ++i;
    }
    b.end_param = i;
    b.size = (used + ranks - 1) / ranks * ranks;
    if (b.size == 0) b.size = ranks;  // empty parameters only: one padding element per rank
    layout.buckets.push_back(b);
  }
  return layout;
}

int64_t ShardLayout::shard_numel() const {
  int64_t total = 0;
  for (const Bucket& b : buckets) total += b.size / ranks;
  return total;
}

int64_t ShardLayout::shard_offset(int64_t bucket) const {
  int64_t off = 0;
  for (int64_t b = 0; b < bucket; ++b) off += chunk(b);
  return off;
}

std::vector<ShardLayout::Owned> ShardLayout::owned(int64_t rank) const {
  if (rank < 0 || rank >= ranks) throw std::invalid_argument("ShardLayout::owned: rank outside 0..ranks-1");
  std::vector<Owned> out;
  int64_t shard_base = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t c = chunk(static_cast<int64_t>(b));
    const int64_t lo = rank * c, hi = lo + c;
    for (int64_t p = buckets[b].first_param; p < buckets[b].end_param; ++p) {
      const Placement& pl = params[static_cast<size_t>(p)];
      const int64_t start = std::max(lo, pl.offset), end = std::min(hi, pl.offset + pl.numel);
      if (start >= end) continue;
      out.push_back({p, start - pl.offset, end - start, shard_base + (start - lo)});
    }
    shard_base += c;
  }
  return out;
}

}  // namespace deepen
