// The large-buffer CPU allocator under LibTorch: large tensors come from it, are reused across
// steps, hold their values, and small ones are left to LibTorch's default allocator.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "train/large_buffer_allocator.h"

namespace deepen {
namespace {

TEST(LargeBufferAllocator, AStepsLargeBuffersAreMappedOnceThenReused) {
  install_large_buffer_allocator();
  install_large_buffer_allocator();  // a second install does nothing
  const LargeBufferStats before = large_buffer_stats();
  for (int step = 0; step < 3; ++step) {
    at::Tensor logits = at::empty({64, 8192});  // 2 MiB
    at::Tensor grad = at::empty({3, 1000, 1000});  // 11.4 MiB
    logits.fill_(step);
    grad.fill_(-step);
    EXPECT_EQ(logits.sum().item<double>(), 64.0 * 8192 * step);
    EXPECT_EQ(grad.sum().item<double>(), -3e6 * step);
  }
  const LargeBufferStats after = large_buffer_stats();
  EXPECT_EQ(after.maps - before.maps, 2u);    // step 1 maps both
  EXPECT_EQ(after.reuses - before.reuses, 4u);  // steps 2 and 3 reuse them
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_LE(after.live_bytes + after.cached_bytes, after.peak_live_bytes + after.peak_live_bytes / 8);
}

TEST(LargeBufferAllocator, SmallTensorsAndCopiesBehaveAsBefore) {
  install_large_buffer_allocator();
  const LargeBufferStats before = large_buffer_stats();
  const at::Tensor small = at::arange(1000, at::kFloat);
  EXPECT_EQ(large_buffer_stats().maps + large_buffer_stats().reuses, before.maps + before.reuses);
  // A large tensor's clone (the allocator's copy) and a resize that moves the storage keep the values.
  at::Tensor big = at::arange(1 << 20, at::kFloat);
  const at::Tensor copy = big.clone();
  EXPECT_TRUE(at::equal(copy, at::arange(1 << 20, at::kFloat)));
  big.resize_({2 << 20});
  EXPECT_TRUE(at::equal(big.narrow(0, 0, 1 << 20), copy));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data_ptr()) % (2 << 20), 0u);  // huge-page aligned
  EXPECT_EQ(small.sum().item<double>(), 499500.0);
}

}  // namespace
}  // namespace deepen
