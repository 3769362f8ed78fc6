// Which cached mapping serves a large CPU buffer, and which mappings to give back to the system: the
// decisions of LargeBufferAllocator (train/large_buffer_allocator.h), without its system calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace deepen {

// A training step allocates the same large buffers every step (a micro-batch's logits, the head's
// gradient, the optimizer's temporaries) and frees them before the next. Kept mapped, they are not
// page-faulted and zeroed again each step; the bound below keeps that from ever holding more than
// 9/8 of the process's own peak of live buffers.
//
// Rules:
// - take(n): the smallest cached mapping of at least n bytes and at most n + n/8, else none;
// - make_room(n) before mapping n fresh bytes: the peak of live bytes becomes max(peak, live + n),
//   then the least recently freed mappings are released until live + cached + n <= peak + peak/8;
// - mapped(n): a fresh mapping of n bytes is live;
// - give_back(m): a freed buffer joins the cache (its bytes move from live to cached).
// So everything mapped (live + cached) never exceeds 9/8 of the peak of live bytes. The eighth is
// room for a step's small buffers: held to the peak itself, a step that nears its peak again (the
// head's gradient made while the activations are still live) released the small cached buffers
// every step only to map them afresh in the next (35 mappings a step in bench/kd_step_bench).
//
// Worked example, each step allocating a 600 MB and a 150 MB buffer and freeing both:
//   step 1: take(600) none, make_room(600) nothing (peak 600), mapped; take(150) none, peak 750;
//           both freed: cached 750.
//   step 2: take(600) and take(150) reuse them: nothing mapped, nothing faulted.
//   a 700 MB buffer later (live 0): take(700) none (600 < 700); make_room(700): peak stays 750
//           (room up to 843), 0 + 750 + 700 > 843, so the 600 then the 150 are released: 700
//           mapped in all.
class LargeBufferCache {
 public:
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
  };

  std::optional<Mapping> take(size_t bytes);
  std::vector<Mapping> make_room(size_t bytes);
  void mapped(size_t bytes);
  void give_back(const Mapping& m);

  size_t live_bytes() const { return live_; }
  size_t cached_bytes() const { return cached_; }
  size_t peak_live_bytes() const { return peak_; }

 private:
  struct Entry {
    Mapping mapping;
    uint64_t freed_at = 0;  // order of give_back: the smallest is released first
  };
  std::multimap<size_t, Entry> by_size_;
  size_t live_ = 0, cached_ = 0, peak_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace deepen
