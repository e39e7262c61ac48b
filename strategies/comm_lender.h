#pragma once
// Lender: what a CPU collective hands its process group (strategies/comm.cpp
// only).
#include <ATen/ATen.h>

#include <functional>
#include <utility>
#include <vector>

namespace strata::detail {

// What a CPU collective hands its process group: views of the caller's memory
// that do not own it, while the owners stay with the PendingWork until its
// wait() has returned. Why: Gloo's worker thread drops its reference to a
// finished work (and to the tensors in it) a moment after wait() returns, so a
// buffer let go right after the wait went back to the pool or the allocator
// on whichever thread let go last. FSDP's next reduce-scatter, allocating a
// buffer of the same size at once, raced it: a rank's peak memory varied by a
// unit's gradient from run to run (CI saw +13 MB on a disk-offload run).
// Sound because wait() returns or throws only after the worker has finished
// with the tensors, and PendingWork's destructor and move assignment wait
// too; wait() drops the works before the owners. CUDA tensors go as
// they are: NCCL records their streams with the caching allocator, which
// needs the owning storage.
class Lender {
 public:
  at::Tensor operator()(const at::Tensor& t) {
    // An empty tensor has no memory to outlive anything (and from_blob of its
    // possibly null data pointer is not worth the question).
    if (!t.device().is_cpu() || t.numel() == 0) return t;
    owners_.push_back(t);
    return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
  }
  /// `on_complete`, holding the owners until it is destroyed: at the end of
  /// PendingWork::wait(), on the waiting thread.
  std::function<void()> keeping(std::function<void()> on_complete = {}) && {
    if (owners_.empty()) return on_complete;
    return [owners = std::move(owners_), on_complete = std::move(on_complete)] {
      if (on_complete) on_complete();
    };
  }

 private:
  std::vector<at::Tensor> owners_;
};

}  // namespace strata::detail
