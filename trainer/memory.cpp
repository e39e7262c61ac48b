#include "strata/trainer/memory.h"

#include "strata/core/cuda_support.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace strata {

// Each allocation carries a 64-byte header (keeping the default 64-byte
// alignment) with its size and a reference to the counters it was counted in,
// so the data pointer is also the deleter's context (some LibTorch paths use
// raw_allocate()/raw_deleter(), which require exactly that), and a tensor freed
// after its MemoryTracker is gone still finds live counters.
struct TrackingAllocator::Context {
  size_t nbytes;
  std::shared_ptr<MemoryCounters> counters;
  size_t capacity;                    ///< of the block, header included
  std::shared_ptr<BlockCache> cache;  ///< where the block goes back to, or null
};
namespace {
constexpr size_t kHeader = 64;
}  // namespace
TrackingAllocator::TrackingAllocator(c10::Allocator* underlying, std::shared_ptr<BlockCache> cache)
    : underlying_(underlying), cache_(std::move(cache)) {
  TORCH_CHECK(underlying_ != nullptr, "TrackingAllocator needs an underlying allocator");
}

c10::DataPtr TrackingAllocator::allocate(size_t nbytes) {
  static_assert(sizeof(Context) <= kHeader && alignof(Context) <= kHeader, "header too small");
  const size_t total = nbytes + kHeader;
  const bool cached = cache_ && cache_->handles(total);
  size_t capacity = total;
  auto* base = static_cast<char*>(cached ? cache_->take(total, &capacity) : c10::alloc_cpu(total));
  new (base) Context{nbytes, counters_, capacity, cached ? cache_ : nullptr};
  void* data = base + kHeader;
  auto& c = *counters_;
  const int64_t now = c.current.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  c.allocations.fetch_add(1);
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
  return c10::DataPtr(data, data, &TrackingAllocator::release, c10::Device(c10::DeviceType::CPU));
}

void TrackingAllocator::release(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  auto* ctx = reinterpret_cast<Context*>(base);
  ctx->counters->current.fetch_sub(static_cast<int64_t>(ctx->nbytes));
  std::shared_ptr<BlockCache> cache = std::move(ctx->cache);
  const size_t capacity = ctx->capacity;
  ctx->~Context();  // drops this allocation's reference to the counters
  if (cache) {
    cache->give(base, capacity);
  } else {
    c10::free_cpu(base);
  }
}

void TrackingAllocator::reset_peak() { counters_->peak.store(counters_->current.load()); }

MemoryTracker::MemoryTracker(std::shared_ptr<BlockCache> cache)
    : cache_(cache),
      previous_(c10::GetCPUAllocator()),
      allocator_(std::make_unique<TrackingAllocator>(previous_, std::move(cache))) {
  // Priority above the default so our allocator wins; restored in the destructor.
  c10::SetCPUAllocator(allocator_.get(), /*priority=*/100);
}

MemoryTracker::~MemoryTracker() { c10::SetCPUAllocator(previous_, /*priority=*/100); }

void MemoryTracker::measure_device(c10::Device device) {
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), "MemoryTracker: cannot measure device ",
                    device, "; allowed: cpu, cuda");
  device_ = device;
  if (device_.is_cuda()) reset_cuda_peak_allocated_bytes(device_.index());
}

int64_t MemoryTracker::current_bytes() const {
  return device_.is_cuda() ? cuda_allocated_bytes(device_.index()).current : allocator_->current_bytes();
}

int64_t MemoryTracker::peak_bytes() const {
  return device_.is_cuda() ? cuda_allocated_bytes(device_.index()).peak : allocator_->peak_bytes();
}

void MemoryTracker::reset_peak() {
  if (device_.is_cuda()) {
    reset_cuda_peak_allocated_bytes(device_.index());
  } else {
    allocator_->reset_peak();
  }
}

namespace {
int64_t read_status_kib(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) {
      std::istringstream fields(line.substr(prefix.size()));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}
}  // namespace

int64_t peak_rss_bytes() { return read_status_kib("VmHWM"); }
int64_t current_rss_bytes() { return read_status_kib("VmRSS"); }

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buf;
}

}  // namespace strata
