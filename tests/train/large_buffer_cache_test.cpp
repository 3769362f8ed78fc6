// The large-buffer cache's rule: a step's buffers are reused, and no more is ever mapped than 9/8 of
// the peak of live buffers.
#include <gtest/gtest.h>

#include <cstdint>

#include "train/large_buffer_cache.h"

namespace deepen {
namespace {

constexpr size_t MB = size_t{1} << 20;

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

// Maps `bytes` as the allocator does on a miss; returns what make_room released.
size_t map_fresh(LargeBufferCache& c, size_t bytes) {
  size_t freed = 0;
  for (const auto& m : c.make_room(bytes)) freed += m.bytes;
  c.mapped(bytes);
  return freed;
}

TEST(LargeBufferCache, TheWorkedExampleOfItsHeader) {
  LargeBufferCache c;
  // Step 1: nothing cached, both mapped.
  ASSERT_FALSE(c.take(600 * MB));
  EXPECT_EQ(map_fresh(c, 600 * MB), 0u);
  ASSERT_FALSE(c.take(150 * MB));
  EXPECT_EQ(map_fresh(c, 150 * MB), 0u);
  c.give_back({at(1), 600 * MB});
  c.give_back({at(2), 150 * MB});
  EXPECT_EQ(c.live_bytes(), 0u);
  EXPECT_EQ(c.cached_bytes(), 750 * MB);
  // Step 2: both served from the cache, the same mappings.
  const auto a = c.take(600 * MB), b = c.take(150 * MB);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->base, at(1));
  EXPECT_EQ(b->base, at(2));
  c.give_back(*a);
  c.give_back(*b);
  // A 700 MB buffer: no cached mapping fits, both are released to stay within 9/8 of the 750 MB peak.
  ASSERT_FALSE(c.take(700 * MB));
  EXPECT_EQ(map_fresh(c, 700 * MB), 750 * MB);
  EXPECT_EQ(c.cached_bytes(), 0u);
  EXPECT_EQ(c.live_bytes(), 700 * MB);
  EXPECT_EQ(c.peak_live_bytes(), 750 * MB);
}

TEST(LargeBufferCache, AMappingServesRequestsUpToAnEighthSmaller) {
  LargeBufferCache c;
  c.mapped(64 * MB);
  c.give_back({at(1), 64 * MB});
  EXPECT_FALSE(c.take(56 * MB - 1));  // 64 > 56 - 1 + (56 - 1) / 8: would waste more than an eighth
  const auto m = c.take(58 * MB);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->bytes, 64 * MB);
  EXPECT_EQ(c.live_bytes(), 64 * MB);  // the whole mapping is live, not the request
}

TEST(LargeBufferCache, TheSmallestFittingMappingIsTaken) {
  LargeBufferCache c;
  c.mapped(100 * MB);
  c.mapped(104 * MB);
  c.give_back({at(1), 104 * MB});
  c.give_back({at(2), 100 * MB});
  EXPECT_EQ(c.take(100 * MB)->base, at(2));
  EXPECT_EQ(c.take(100 * MB)->base, at(1));
}

TEST(LargeBufferCache, TheLeastRecentlyFreedGoFirstAndOnlyAsManyAsNeeded) {
  LargeBufferCache c;
  for (uintptr_t i = 1; i <= 3; ++i) map_fresh(c, 100 * MB);  // peak 300
  c.give_back({at(2), 100 * MB});
  c.give_back({at(1), 100 * MB});
  c.give_back({at(3), 100 * MB});
  // 0 live + 300 cached + 150 new must stay within 9/8 of the peak (337.5): 112.5 must go, so two mappings.
  const auto freed = c.make_room(150 * MB);
  ASSERT_EQ(freed.size(), 2u);
  EXPECT_EQ(freed[0].base, at(2));
  EXPECT_EQ(freed[1].base, at(1));
  EXPECT_EQ(c.cached_bytes(), 100 * MB);
}

// The eighth of room: a step that comes near its peak again (a large buffer made while the step's
// small ones are freed) keeps the small ones cached instead of releasing and re-mapping them.
TEST(LargeBufferCache, ASmallBufferCachedBesideANewPeakIsKeptForTheNextStep) {
  LargeBufferCache c;
  map_fresh(c, 600 * MB);        // live 600 (activations)
  map_fresh(c, 50 * MB);         // a small temporary, peak 650
  c.give_back({at(2), 50 * MB});  // cached 50
  ASSERT_FALSE(c.take(150 * MB));
  // Peak 750 (600 live + 150 new); 600 + 50 + 150 = 800 is within 9/8 of it (843.75): nothing released.
  EXPECT_TRUE(c.make_room(150 * MB).empty());
  c.mapped(150 * MB);
  EXPECT_EQ(c.peak_live_bytes(), 750 * MB);
  EXPECT_EQ(c.cached_bytes(), 50 * MB);
  // The next step's small temporary is the same mapping.
  const auto again = c.take(50 * MB);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->base, at(2));
}

TEST(LargeBufferCache, MappedNeverExceedsNineEighthsOfThePeakOfLiveBytesOverChangingShapes) {
  // Shapes that change every few steps (growth, evaluation batches), freed in varying order.
  LargeBufferCache c;
  std::vector<LargeBufferCache::Mapping> live;
  size_t mapped_total = 0;
  uintptr_t next = 1;
  for (int step = 0; step < 200; ++step) {
    const size_t sizes[3] = {size_t(40 + (step / 7) % 5 * 16) * MB, size_t(10 + step % 3) * MB, 150 * MB};
    for (size_t s : sizes) {
      if (auto m = c.take(s)) {
        live.push_back(*m);
        continue;
      }
      for (const auto& r : c.make_room(s)) mapped_total -= r.bytes;
      c.mapped(s);
      mapped_total += s;
      live.push_back({at(next++), s});
      ASSERT_LE(mapped_total, c.peak_live_bytes() + c.peak_live_bytes() / 8) << "step " << step;
    }
    ASSERT_EQ(mapped_total, c.live_bytes() + c.cached_bytes());
    for (size_t i = 0; i < live.size(); ++i) c.give_back(live[(i * 2 + step) % live.size()]);
    live.clear();
  }
}

}  // namespace
}  // namespace deepen
