#include "strata/strategies/buffer_pool.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>
#include <vector>

namespace strata {

struct BufferPool::State {
  c10::Allocator* allocator;
  size_t max_free_per_size;
  size_t min_bytes;
  mutable std::mutex mutex;
  std::unordered_map<size_t, std::vector<c10::DataPtr>> free;  // by byte size
  std::unordered_map<size_t, size_t> in_use;                   // leased, by byte size
  int64_t free_bytes = 0;
  int64_t reused = 0;
  int64_t allocated = 0;
  bool closed = false;  // the pool is gone: returned buffers are released
};

// What a leased DataPtr's context points at: the allocator's own DataPtr and
// the pool state it goes back to (kept alive by the lease, so a buffer freed
// after the pool releases itself correctly).
struct BufferPool::Lease {
  c10::DataPtr buffer;
  size_t nbytes;
  std::shared_ptr<State> state;
};

BufferPool::BufferPool(c10::Allocator* allocator, size_t max_free_per_size, size_t min_bytes)
    : state_(std::make_shared<State>()) {
  TORCH_CHECK(allocator != nullptr, "BufferPool: the allocator is null");
  state_->allocator = allocator;
  state_->max_free_per_size = max_free_per_size;
  state_->min_bytes = min_bytes;
}

BufferPool::~BufferPool() {
  std::unordered_map<size_t, std::vector<c10::DataPtr>> released;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->closed = true;
    released.swap(state_->free);
    state_->free_bytes = 0;
  }
  // `released` frees the buffers here, outside the lock.
}

c10::DataPtr BufferPool::allocate(size_t nbytes) {
  if (nbytes < state_->min_bytes) return state_->allocator->allocate(nbytes);
  c10::DataPtr buffer;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->free.find(nbytes);
    if (it != state_->free.end() && !it->second.empty()) {
      buffer = std::move(it->second.back());
      it->second.pop_back();
      state_->free_bytes -= static_cast<int64_t>(nbytes);
      ++state_->reused;
    } else {
      ++state_->allocated;
    }
  }
  if (!buffer) buffer = state_->allocator->allocate(nbytes);  // outside the lock: may be slow, may throw
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ++state_->in_use[nbytes];
  }
  void* data = buffer.get();
  const c10::Device device = buffer.device();
  auto* lease = new Lease{std::move(buffer), nbytes, state_};
  return c10::DataPtr(data, lease, &BufferPool::give_back, device);
}

void BufferPool::give_back(void* ptr) {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(ptr));
  State& state = *lease->state;
  std::lock_guard<std::mutex> lock(state.mutex);
  --state.in_use[lease->nbytes];
  auto& same_size = state.free[lease->nbytes];
  if (state.closed || same_size.size() >= state.max_free_per_size) return;  // ~Lease releases it
  same_size.push_back(std::move(lease->buffer));
  state.free_bytes += static_cast<int64_t>(lease->nbytes);
}

torch::Tensor BufferPool::empty(int64_t numel, const torch::TensorOptions& options) {
  TORCH_CHECK(numel >= 0, "BufferPool::empty: numel ", numel, " is negative");
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocate(nbytes), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return torch::empty({0}, options).set_(storage, 0, {numel}, {1});
}

std::unordered_map<size_t, size_t> BufferPool::in_use() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::unordered_map<size_t, size_t> out;
  for (const auto& [nbytes, count] : state_->in_use) {
    if (count > 0) out[nbytes] = count;
  }
  return out;
}

void BufferPool::trim_to(const std::unordered_map<size_t, size_t>& keep) {
  std::vector<c10::DataPtr> released;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (auto& [nbytes, buffers] : state_->free) {
      const auto it = keep.find(nbytes);
      const size_t wanted = it == keep.end() ? 0 : it->second;
      const size_t used = state_->in_use[nbytes];
      const size_t allowed = wanted > used ? wanted - used : 0;
      while (buffers.size() > allowed) {
        released.push_back(std::move(buffers.back()));
        buffers.pop_back();
        state_->free_bytes -= static_cast<int64_t>(nbytes);
      }
    }
  }
  // `released` frees the buffers here, outside the lock.
}

int64_t BufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->free_bytes;
}

int64_t BufferPool::reused() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->reused;
}

int64_t BufferPool::allocated() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->allocated;
}

}  // namespace strata
