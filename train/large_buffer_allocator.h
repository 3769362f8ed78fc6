// LibTorch's CPU allocator for this process: buffers of 1 MiB and more from kept huge-page mappings.
#pragma once

#include <cstddef>

namespace deepen {

// Why: a step at Qwen3's vocabulary allocates buffers of hundreds of MB each step ([tokens, 151,936]
// logits, the [151,936, hidden] head and embedding gradients, AdamW's temporaries). From glibc's
// malloc each is a fresh mmap, page-faulted 4 KiB at a time and zeroed by the kernel every step
// (measured in docs/performance.md, "Speed of the distillation step"). Here such a buffer is a
// 2 MiB-aligned mapping advised for transparent huge pages, kept when freed and reused by the next
// request of its size (LargeBufferCache: never more mapped than 9/8 of the process's peak of live
// buffers). Smaller requests go to LibTorch's default allocator.
//
// Installs once per process (later calls do nothing); call it before the first tensor that should
// use it. The allocator lives as long as the process: LibTorch's allocator registry is itself
// process-wide, and tensors may be freed during static destruction.
void install_large_buffer_allocator();

// What the allocator holds (zeros before install).
struct LargeBufferStats {
  size_t live_bytes = 0, cached_bytes = 0, peak_live_bytes = 0;
  size_t maps = 0, reuses = 0;  // fresh mappings made, requests served from the cache
};
LargeBufferStats large_buffer_stats();

}  // namespace deepen
