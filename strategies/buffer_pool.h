#pragma once
// BufferPool: keeps the large buffers a strategy frees and re-allocates every
// step (FSDP: a unit's gathered parameters, its full gradient, the
// reduce-scatter's receive buffer) for reuse, by exact byte size.
//
// Why: on CPU such buffers come straight from the kernel (strata-gpt fixes
// glibc's mmap threshold at 1 MiB so that RSS tracks live tensors), and every
// fresh one is page-faulted in and zeroed 4 KiB at a time. FSDP frees and
// re-gathers each unit twice per step, so on gpt-mini that is ~14k page faults
// per rank and step, measured at ~20% of the step. On CUDA, PyTorch's caching
// allocator does this reuse already (and knows about streams): use the pool for
// CPU buffers only.
//
// Buffers come from the injected allocator (the tracking allocator on CPU), so
// a free buffer the pool keeps still counts as allocated tensor memory: the
// memory measurements include what the pool holds. At most
// `max_free_per_size` free buffers of one size are kept; more are released.
// Buffers under `min_bytes` are not kept at all: malloc serves those from its
// heap, reusing freed memory without new page faults.
//
//   BufferPool pool(c10::GetAllocator(c10::kCPU), 4, 1 << 20);
//   torch::Tensor t = pool.empty(n, torch::kFloat);  // freed: back into the pool
#include <c10/core/Allocator.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

namespace strata {

class BufferPool {
 public:
  BufferPool(c10::Allocator* allocator, size_t max_free_per_size, size_t min_bytes = 0);
  /// Releases the free buffers. Buffers still in use stay valid; freeing them
  /// later releases them to the allocator.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// `nbytes` bytes (uninitialised): a free buffer of exactly that size, or a
  /// new one. Deleting the DataPtr returns it to the pool (under `min_bytes`:
  /// to the allocator). Thread-safe.
  c10::DataPtr allocate(size_t nbytes);
  /// A 1-D contiguous tensor of `numel` elements (uninitialised) whose storage
  /// comes from allocate().
  torch::Tensor empty(int64_t numel, const torch::TensorOptions& options);

  /// Buffers of each size in use now (handed out, not yet given back).
  std::unordered_map<size_t, size_t> in_use() const;
  /// Releases free buffers so that, per size, at most `keep[size]` (0 for a
  /// size not listed) exist, in use and free together. With in_use() taken
  /// at a step's peak, the kept buffers add nothing to the next step's peak.
  void trim_to(const std::unordered_map<size_t, size_t>& keep);

  /// Bytes in free buffers the pool keeps now.
  int64_t free_bytes() const;
  /// Allocations (of at least min_bytes) served from a free buffer / by the
  /// allocator, so far.
  int64_t reused() const;
  int64_t allocated() const;

 private:
  struct State;
  struct Lease;
  static void give_back(void* lease);
  std::shared_ptr<State> state_;
};

}  // namespace strata
