#pragma once
// Exact tensor memory accounting.
//
// TrackingAllocator wraps the CPU allocator (installed with c10::SetCPUAllocator)
// and counts live and peak bytes of every CPU tensor allocation. MemoryTracker is
// the RAII owner: it installs the allocator in its constructor and restores the
// previous one in its destructor. Tensors may outlive it: each allocation holds
// a reference to the counters it was counted in (MemoryCounters), so freeing it
// later updates those counters and never touches a destroyed allocator.
// With a BlockCache (trainer/block_cache.h), large blocks come from and go
// back to it instead of the system (the cache, too, lives as long as the
// last allocation made from it).
#include "strata/trainer/block_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

/// Live and peak bytes of one tracker; shared by the allocator and every
/// allocation it made, so it lives as long as the last of them.
struct MemoryCounters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
};

class TrackingAllocator final : public c10::Allocator {
 public:
  /// `underlying` is the allocator this one replaces (restored by
  /// MemoryTracker); allocation itself uses c10::alloc_cpu like the default,
  /// or for blocks it handles `cache` when one is given.
  explicit TrackingAllocator(c10::Allocator* underlying, std::shared_ptr<BlockCache> cache = nullptr);

  c10::DataPtr allocate(size_t nbytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

  int64_t current_bytes() const { return counters_->current.load(); }
  int64_t peak_bytes() const { return counters_->peak.load(); }
  int64_t allocations() const { return counters_->allocations.load(); }
  /// Sets peak to the current value (start of a measured phase).
  void reset_peak();
  /// The counters, alive as long as this allocator or any allocation it made.
  std::shared_ptr<const MemoryCounters> counters() const { return counters_; }

 private:
  struct Context;
  static void release(void* ctx);

  c10::Allocator* underlying_;
  std::shared_ptr<BlockCache> cache_;
  std::shared_ptr<MemoryCounters> counters_ = std::make_shared<MemoryCounters>();
};

class MemoryTracker {
 public:
  /// With `cache`, large CPU blocks are reused through it (strata-gpt's
  /// default; trim it once per step, callbacks/block_cache_trim.h).
  explicit MemoryTracker(std::shared_ptr<BlockCache> cache = nullptr);
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Where the numbers below come from: the CPU tracking allocator (default),
  /// or, for a CUDA device, that device's caching-allocator statistics.
  void measure_device(c10::Device device);

  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  void reset_peak();
  /// The block cache given to the constructor (null when none).
  const std::shared_ptr<BlockCache>& cache() const { return cache_; }

 private:
  std::shared_ptr<BlockCache> cache_;
  c10::Device device_ = c10::kCPU;
  c10::Allocator* previous_;
  std::unique_ptr<TrackingAllocator> allocator_;
};

/// Peak resident set size of this process (VmHWM), bytes; 0 if unknown.
int64_t peak_rss_bytes();
/// Current resident set size (VmRSS), bytes; 0 if unknown.
int64_t current_rss_bytes();
/// Resets the peak (VmHWM) to the current resident set size (Linux: "5" to
/// /proc/self/clear_refs), so that peak_rss_bytes() then reads the peak of
/// what follows; false where the kernel refuses (the peak stays the
/// process's).
bool reset_peak_rss();

/// "12.3 MiB"
std::string format_bytes(int64_t bytes);

}  // namespace strata
