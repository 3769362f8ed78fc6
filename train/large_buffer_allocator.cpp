// The large-buffer CPU allocator (see large_buffer_allocator.h).
#include "train/large_buffer_allocator.h"

#include <sys/mman.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "train/large_buffer_cache.h"

namespace deepen {
namespace {

constexpr size_t kMinBytes = size_t{1} << 20;    // below: LibTorch's default allocator
constexpr size_t kHugePage = size_t{2} << 20;    // x86-64's transparent huge page

class LargeBufferAllocator final : public c10::Allocator {
 public:
  explicit LargeBufferAllocator(c10::Allocator* small) : small_(small) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < kMinBytes) return small_->allocate(n);
    const size_t bytes = (n + kHugePage - 1) / kHugePage * kHugePage;
    std::lock_guard<std::mutex> lock(mutex_);
    auto hit = cache_.take(bytes);
    LargeBufferCache::Mapping m;
    if (hit) {
      m = *hit;
      ++stats_.reuses;
    } else {
      for (const auto& old : cache_.make_room(bytes)) munmap(old.base, old.bytes);
      m = {map_aligned(bytes), bytes};
      cache_.mapped(bytes);
      ++stats_.maps;
    }
    auto* block = new Block{m, this};
    return {m.base, block, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }  // contexts differ from pointers

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  LargeBufferStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    LargeBufferStats s = stats_;
    s.live_bytes = cache_.live_bytes();
    s.cached_bytes = cache_.cached_bytes();
    s.peak_live_bytes = cache_.peak_live_bytes();
    return s;
  }

 private:
  struct Block {
    LargeBufferCache::Mapping mapping;
    LargeBufferAllocator* owner;
  };

  static void free_block(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    {
      std::lock_guard<std::mutex> lock(block->owner->mutex_);
      block->owner->cache_.give_back(block->mapping);
    }
    delete block;
  }

  // A mapping that starts on a huge-page boundary (THP backs only aligned 2 MiB ranges): map one
  // huge page more, then unmap the unaligned head and the tail.
  static void* map_aligned(size_t bytes) {
    const size_t span = bytes + kHugePage;
    void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("deepen: out of memory: could not map " + std::to_string(bytes) + " bytes for a tensor (" +
                               std::strerror(errno) + ")");
    const auto start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start) munmap(p, aligned - start);
    const uintptr_t end = start + span, used_end = aligned + bytes;
    if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
    // Advice only: where THP is off ("never"), the mapping is still kept and reused.
    madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
    return reinterpret_cast<void*>(aligned);
  }

  c10::Allocator* small_;
  std::mutex mutex_;
  LargeBufferCache cache_;
  LargeBufferStats stats_;
};

LargeBufferAllocator* installed = nullptr;
std::once_flag install_once;

}  // namespace

void install_large_buffer_allocator() {
  std::call_once(install_once, [] {
    installed = new LargeBufferAllocator(c10::GetDefaultCPUAllocator());
    // Priority above the default's 0, so nothing registered later at 0 displaces it.
    c10::SetCPUAllocator(installed, /*priority=*/1);
  });
}

LargeBufferStats large_buffer_stats() { return installed ? installed->stats() : LargeBufferStats{}; }

}  // namespace deepen
