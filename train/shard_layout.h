// ShardLayout: where each trainable parameter sits in the flat buckets that sharded data
// parallelism reduce-scatters, and which slice of each bucket every student rank owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepen {

// Parameters are laid end to end, in the trainer's order, into buckets of at most
// bucket_elements (a larger parameter gets a bucket of its own); each bucket is padded with zeros
// to a multiple of the rank count S and split into S equal chunks, chunk r owned by rank r. A
// parameter never spans buckets, so a rank owns at most one contiguous slice of each parameter.
// Rank r's shard is its chunks of every bucket, end to end.
// With `units` (full sharding: a unit is what is gathered whole at once, a decoder block), a
// bucket never holds parameters of two units, so gathering one unit's buckets gathers exactly it.
//
// Example: parameters of 6, 4 and 3 elements, S = 2, bucket_elements 8:
//   bucket 0 = p0 (6 elements, no padding),      chunks of 3:  rank 0 p0[0,3)  rank 1 p0[3,6)
//   bucket 1 = p1 then p2 (7, padded to 8),      chunks of 4:  rank 0 p1[0,4)  rank 1 p2[0,3) + 1 padding
//   rank 0's shard (7 elements): p0[0,3) at 0, p1[0,4) at 3
//   rank 1's shard (7 elements): p0[3,6) at 0, p2[0,3) at 3, padding at 6
struct ShardLayout {
  struct Placement {          // a whole parameter inside its bucket
    int64_t bucket = 0;
    int64_t offset = 0;       // first element in the bucket
    int64_t numel = 0;
  };
  struct Bucket {
    int64_t first_param = 0;  // parameters [first_param, end_param), laid end to end from offset 0
    int64_t end_param = 0;
    int64_t size = 0;         // elements including the padding: a multiple of ranks
  };
  struct Owned {              // a slice of one parameter that a rank owns
    int64_t param = 0;
    int64_t param_offset = 0;  // first element of the parameter
    int64_t numel = 0;
    int64_t shard_offset = 0;  // where it sits in the rank's shard
  };

  int64_t ranks = 1;
  std::vector<Placement> params;
  std::vector<Bucket> buckets;
  std::vector<int64_t> units;  // per parameter (all 0 when made without units)

  int64_t chunk(int64_t bucket) const { return buckets[static_cast<size_t>(bucket)].size / ranks; }
  // Elements of one rank's shard (the same on every rank): the sum of the buckets' chunks.
  int64_t shard_numel() const;
  // Where bucket b's chunk starts in a rank's shard.
  int64_t shard_offset(int64_t bucket) const;
  // Rank `rank`'s slices, by bucket then parameter order (a parameter with no element in the
  // rank's chunks is absent).
  std::vector<Owned> owned(int64_t rank) const;
};

// Elements of `element_size` bytes in a bucket of `bucket_bytes` (parallel.bucket_cap_mb), at least 1.
inline int64_t bucket_elements(int64_t bucket_bytes, int64_t element_size) {
  return bucket_bytes / element_size > 0 ? bucket_bytes / element_size : 1;
}

// Pure. numels: the parameters' element counts in the trainer's order; ranks >= 1; bucket_elements >= 1;
// units: empty, or one per parameter (a bucket is closed where the unit changes).
// Example with units: numels {6, 4, 3}, units {0, 0, 1}, S = 2, bucket_elements 16: bucket 0 =
// p0 + p1 (10 elements), bucket 1 = p2 (3, padded to 4), where without units one bucket holds all.
ShardLayout make_shard_layout(const std::vector<int64_t>& numels, int64_t ranks, int64_t bucket_elements,
                              const std::vector<int64_t>& units = {});

}  // namespace deepen
