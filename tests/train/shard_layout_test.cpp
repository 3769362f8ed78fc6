// ShardLayout: the header's worked example, and the invariants sharded training relies on.
#include "train/shard_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace deepen {
namespace {

using Owned = ShardLayout::Owned;

bool same(const Owned& a, const Owned& b) {
  return a.param == b.param && a.param_offset == b.param_offset && a.numel == b.numel && a.shard_offset == b.shard_offset;
}

TEST(ShardLayout, HeaderExample) {
  const ShardLayout l = make_shard_layout({6, 4, 3}, 2, 8);
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].size, 6);
  EXPECT_EQ(l.buckets[1].size, 8);
  EXPECT_EQ(l.params[2].bucket, 1);
  EXPECT_EQ(l.params[2].offset, 4);
  EXPECT_EQ(l.shard_numel(), 7);
  const auto r0 = l.owned(0), r1 = l.owned(1);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_TRUE(same(r0[0], {0, 0, 3, 0}));
  EXPECT_TRUE(same(r0[1], {1, 0, 4, 3}));
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_TRUE(same(r1[0], {0, 3, 3, 0}));
  EXPECT_TRUE(same(r1[1], {2, 0, 3, 3}));
}

// Every element of every parameter is owned by exactly one rank, inside that rank's shard, and
// no two owned slices of a rank overlap in its shard: what makes reduce-scatter + update +
// all-gather equal to updating the whole replicated model.
TEST(ShardLayout, EveryElementHasExactlyOneOwner) {
  const std::vector<int64_t> numels = {1, 7, 64, 5, 0, 33, 128, 2, 9};
  for (int64_t ranks : {1, 2, 3, 4, 7}) {
    for (int64_t bucket : {1, 10, 64, 100, 1000}) {
      const ShardLayout l = make_shard_layout(numels, ranks, bucket);
      std::vector<std::vector<int>> owners;
      for (int64_t n : numels) owners.emplace_back(static_cast<size_t>(n), 0);
      for (int64_t r = 0; r < ranks; ++r) {
        std::vector<int> used(static_cast<size_t>(l.shard_numel()), 0);
        for (const Owned& o : l.owned(r)) {
          ASSERT_GE(o.param_offset, 0);
          ASSERT_LE(o.param_offset + o.numel, numels[static_cast<size_t>(o.param)]);
          ASSERT_LE(o.shard_offset + o.numel, l.shard_numel());
          for (int64_t k = 0; k < o.numel; ++k) {
            ++owners[static_cast<size_t>(o.param)][static_cast<size_t>(o.param_offset + k)];
            ++used[static_cast<size_t>(o.shard_offset + k)];
          }
        }
        for (int u : used) ASSERT_LE(u, 1) << "ranks " << ranks << " bucket " << bucket;
      }
      for (size_t p = 0; p < numels.size(); ++p)
        for (int c : owners[p]) ASSERT_EQ(c, 1) << "param " << p << " ranks " << ranks << " bucket " << bucket;
      for (const auto& b : l.buckets) EXPECT_EQ(b.size % ranks, 0);
    }
  }
}

// One rank owns everything, in parameter order: the replicated optimizer's view.
TEST(ShardLayout, OneRankOwnsEveryParameterWhole) {
  const ShardLayout l = make_shard_layout({4, 4, 4}, 1, 8);
  const auto o = l.owned(0);
  ASSERT_EQ(o.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same(o[i], {static_cast<int64_t>(i), 0, 4, static_cast<int64_t>(4 * i)}));
}

TEST(ShardLayout, ALargeParameterTravelsInABucketOfItsOwn) {
  const ShardLayout l = make_shard_layout({3, 50, 3}, 4, 10);
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.buckets[1].size, 52);  // 50 padded to a multiple of 4
  EXPECT_EQ(l.chunk(1), 13);
  EXPECT_THROW(make_shard_layout({3}, 0, 10), std::invalid_argument);
  EXPECT_THROW(l.owned(4), std::invalid_argument);
}

// Full sharding gathers a decoder block by its buckets: no bucket may hold two units' parameters,
// while parameters of one unit still share buckets (the header's example).
TEST(ShardLayout, ABucketNeverHoldsTwoUnits) {
  const ShardLayout example = make_shard_layout({6, 4, 3}, 2, 16, {0, 0, 1});
  ASSERT_EQ(example.buckets.size(), 2u);
  EXPECT_EQ(example.buckets[0].size, 10);
  EXPECT_EQ(example.buckets[1].size, 4);
  EXPECT_EQ(make_shard_layout({6, 4, 3}, 2, 16).buckets.size(), 1u);

  const std::vector<int64_t> numels = {5, 5, 5, 40, 1, 1, 7, 7, 2};
  const std::vector<int64_t> units = {-1, 0, 0, 0, 1, 1, 1, 2, -1};
  for (int64_t ranks : {1, 2, 3}) {
    for (int64_t bucket : {1, 8, 12, 1000}) {
      const ShardLayout l = make_shard_layout(numels, ranks, bucket, units);
      EXPECT_EQ(l.units, units);
      for (const auto& b : l.buckets)
        for (int64_t p = b.first_param; p < b.end_param; ++p)
          EXPECT_EQ(units[static_cast<size_t>(p)], units[static_cast<size_t>(b.first_param)])
              << "ranks " << ranks << " bucket " << bucket;
    }
  }
  // With a bucket larger than everything, one bucket per run of equal units.
  EXPECT_EQ(make_shard_layout(numels, 2, 1000, units).buckets.size(), 5u);
  EXPECT_THROW(make_shard_layout({1, 2}, 2, 8, {0}), std::invalid_argument);
}

}  // namespace
}  // namespace deepen
