#pragma once
// Exact tensor memory accounting.
//
// TrackingAllocator wraps the CPU allocator (installed with c10::SetCPUAllocator)
// and counts live and peak bytes of every CPU tensor allocation. MemoryTracker is
// the RAII owner: it installs the allocator in its constructor and restores the
// previous one in its destructor. It must outlive every tensor allocated while it
// was installed (own it in main(), or in a test's scope).
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

class TrackingAllocator final : public c10::Allocator {
 public:
  /// `underlying` is the allocator this one replaces (restored by
  /// MemoryTracker); allocation itself uses c10::alloc_cpu like the default.
  explicit TrackingAllocator(c10::Allocator* underlying);

  c10::DataPtr allocate(size_t nbytes) const override;
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

  int64_t current_bytes() const { return current_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  int64_t allocations() const { return allocations_.load(); }
  /// Sets peak to the current value (start of a measured phase).
  void reset_peak();

 private:
  struct Context;
  static void release(void* ctx);
  void on_free(size_t nbytes) const;

  c10::Allocator* underlying_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
};

class MemoryTracker {
 public:
  MemoryTracker();
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Where the numbers below come from: the CPU tracking allocator (default),
  /// or, for a CUDA device, that device's caching-allocator statistics.
  void measure_device(c10::Device device);

  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  void reset_peak();

 private:
  c10::Device device_ = c10::kCPU;
  c10::Allocator* previous_;
  std::unique_ptr<TrackingAllocator> allocator_;
};

/// Peak resident set size of this process (VmHWM), bytes; 0 if unknown.
int64_t peak_rss_bytes();
/// Current resident set size (VmRSS), bytes; 0 if unknown.
int64_t current_rss_bytes();

/// "12.3 MiB"
std::string format_bytes(int64_t bytes);

}  // namespace strata
