#pragma once
// A cache of large CPU blocks under the tracking allocator (trainer/memory.h).
//
// Why: a training step frees and re-allocates the same large tensors every
// step (activations, gradient buckets, gathered FSDP units). Handed back to
// glibc, blocks above its mmap threshold go back to the kernel and return as
// fresh zero-filled pages: every step pays a page fault per 4 KiB of them
// (measured: 20-45% of a gpt-mini step on 2 cores). Blocks from 64 KiB up do
// too: with the fixed threshold glibc's heap gives them back as well (a
// LayerNorm's 768 KiB output: 230 µs a call in a gpt-mini step, 68 µs cached;
// 88k fewer page faults in 30 steps). Kept here, a freed block is handed to
// the next allocation of (about) its size instead.
//
// Bounded: trim(), called once per optimizer step, frees every block that sat
// in the cache since the previous trim without being taken again, so what
// stays cached is what the step itself reuses (the step's own peak working
// set), and a size the run stops using goes back to the system within a step.
// Tensor accounting is unaffected (the tracker counts live tensor bytes; a
// cached block is not a tensor); peak RSS counts cached blocks, as it should.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace strata {

struct BlockCacheStats {
  int64_t cached_bytes = 0;   ///< held now, not in use
  int64_t hits = 0;           ///< allocations served from the cache
  int64_t misses = 0;         ///< allocations that went to the system
  int64_t trimmed_bytes = 0;  ///< given back to the system by trim()
};

class BlockCache {
 public:
  /// Blocks of `min_bytes` and more are cached; smaller ones never reach it
  /// (glibc's heap reuses those without page faults).
  explicit BlockCache(size_t min_bytes = kDefaultMinBytes);
  static constexpr size_t kDefaultMinBytes = size_t{64} << 10;
  ~BlockCache();  ///< frees every cached block
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  bool handles(size_t bytes) const { return bytes >= min_bytes_; }
  /// A block of at least `bytes` (64-byte aligned): a cached one of at most
  /// 1/8 more, else a new one. Throws c10::Error when the system has none.
  void* take(size_t bytes, size_t* capacity);
  /// `block` (of `capacity` bytes, from take()) back into the cache.
  void give(void* block, size_t capacity);
  /// Frees the blocks given back before the previous trim() and not taken since.
  void trim();
  BlockCacheStats stats() const;

 private:
  struct Cached {
    void* block;
    uint64_t epoch;  ///< trim() count when it was given back
  };
  const size_t min_bytes_;
  mutable std::mutex mutex_;
  std::multimap<size_t, Cached> free_;  ///< by capacity
  uint64_t epoch_ = 0;
  BlockCacheStats stats_;
};

}  // namespace strata
