#pragma once
// Gradient bucketing shared by DDP and SDP (OSS uses GradReadiness only to
// learn which parameters got a gradient; see grad_sync.h).
//
// assign_buckets() groups parameters, in REVERSE registration order (the order
// backward produces their gradients), into buckets of at most cap bytes.
// GradReadiness installs a post-hook on each parameter's AccumulateGrad node,
// counts parameters whose gradient is complete, and launches bucket k as soon as
// buckets 0..k are all ready: every rank must issue collectives in the same
// order, and launching strictly in bucket order guarantees it even if two ranks
// see hooks fire in different orders.
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata {

/// A parameter's AccumulateGrad node as LibTorch hands it out (an
/// intrusive_ptr in 2.x; a shared_ptr before).
using GradAccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

/// Buckets as lists of indices into `params`; a parameter larger than the cap
/// gets a bucket of its own; a bucket never mixes dtypes or devices. Buckets
/// are ordered by their first member, latest-registered first (with one dtype:
/// consecutive runs of the reverse order). cap_bytes must be > 0.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<torch::Tensor>& params,
                                                int64_t cap_bytes);

class GradReadiness {
 public:
  /// `launch(k)` is called when bucket k may start: from whichever autograd
  /// thread completed it (or from launch_remaining()), never two at a time,
  /// and without this object's lock held (it may block on communication).
  GradReadiness(std::vector<torch::Tensor> params, std::vector<std::vector<size_t>> buckets,
                std::function<void(size_t)> launch);
  /// The hooks stay on the autograd nodes; they become no-ops once this dies.
  ~GradReadiness() { alive_->store(false); }
  GradReadiness(const GradReadiness&) = delete;
  GradReadiness& operator=(const GradReadiness&) = delete;

  /// Registers the hooks; `active()` is read on every hook (false under
  /// no_sync() or when launching after backward is wanted). An inactive hook
  /// still records that its parameter was used (see unused_params()).
  void install_hooks(std::function<bool()> active);
  /// Hooks parameter i's CURRENT gradient accumulator if it is not the one
  /// hooked last. Needed after the parameter's data changed dtype (FSDP
  /// mixed precision gathers a unit in bf16): set_data() then drops the
  /// accumulator, and the next graph gets a new one without the hook. Call
  /// it before the parameter is used in the graph whose gradient must count.
  void rehook(size_t i);

  // Every member below is thread-safe: autograd may run AccumulateGrad
  // post-hooks on several threads at once (one per device).

  /// Starts a synchronised backward: every parameter pending again.
  void reset();
  /// The parameter's gradient is final for this backward: launches, in order,
  /// every bucket that became launchable (buckets 0..k all ready).
  void mark_ready(size_t param_index);
  /// Records a gradient that is not final yet (a no_sync backward).
  void mark_used(size_t param_index);
  /// Launches, in order, every bucket not launched yet. Call after backward
  /// has returned (no hook running).
  void launch_remaining();
  /// Parameters that never became ready since reset().
  std::vector<size_t> unready_params() const;
  /// Parameters that got no gradient in any backward (synchronised or not)
  /// since clear_used() or construction.
  std::vector<size_t> unused_params() const;
  void clear_used();
  bool all_launched() const;
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  /// Bucket index of each parameter.
  size_t bucket_of(size_t param_index) const { return bucket_of_[param_index]; }

 private:
  /// With mutex_ held by `lock`: launches buckets in order while the next is
  /// complete (or every one, when `all`); see the .cpp for the protocol.
  void launch_in_order(std::unique_lock<std::mutex>& lock, bool all);

  // Fixed at construction (read without the lock).
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;
  std::function<void(size_t)> launch_;
  std::vector<size_t> bucket_of_;

  mutable std::mutex mutex_;      // guards everything below
  std::vector<size_t> pending_;   // per bucket: params not ready yet
  std::vector<bool> ready_;       // per param, since reset()
  std::vector<bool> used_;        // per param, since clear_used()
  size_t next_bucket_ = 0;        // buckets [0, next_bucket_) are launched (or launching)
  bool launching_ = false;        // a thread is inside launch_in_order()'s loop

  // The AccumulateGrad nodes must stay alive, or autograd would create new ones
  // without our hooks.
  std::vector<GradAccumulatorPtr> accumulators_;  // per parameter: the last one hooked
  std::function<bool()> active_;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace strata
