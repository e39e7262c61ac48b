#include "strata/trainer/block_cache.h"

#include <c10/core/impl/alloc_cpu.h>

namespace strata {

BlockCache::BlockCache(size_t min_bytes) : min_bytes_(min_bytes) {}

BlockCache::~BlockCache() {
  for (auto& [capacity, cached] : free_) c10::free_cpu(cached.block);
}

void* BlockCache::take(size_t bytes, size_t* capacity) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Best fit within 1/8: a step's sizes recur exactly, and a much larger
    // block would hold memory the allocation does not use.
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= bytes + bytes / 8) {
      void* block = it->second.block;
      *capacity = it->first;
      stats_.cached_bytes -= static_cast<int64_t>(it->first);
      ++stats_.hits;
      free_.erase(it);
      return block;
    }
    ++stats_.misses;
  }
  *capacity = bytes;
  return c10::alloc_cpu(bytes);  // outside the lock: the kernel may take its time
}

void BlockCache::give(void* block, size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(capacity, Cached{block, epoch_});
  stats_.cached_bytes += static_cast<int64_t>(capacity);
}

void BlockCache::trim() {
  std::multimap<size_t, Cached> stale;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->second.epoch < epoch_) {
        stats_.cached_bytes -= static_cast<int64_t>(it->first);
        stats_.trimmed_bytes += static_cast<int64_t>(it->first);
        stale.insert(*it);
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
    ++epoch_;
  }
  for (auto& [capacity, cached] : stale) c10::free_cpu(cached.block);
}

BlockCacheStats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace strata
