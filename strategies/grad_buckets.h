#pragma once
// Gradient bucketing shared by DDP and SDP.
//
// assign_buckets() groups parameters, in REVERSE registration order (the order
// backward produces their gradients), into buckets of at most cap bytes.
// GradReadiness installs a post-hook on each parameter's AccumulateGrad node,
// counts parameters whose gradient is complete, and launches bucket k as soon as
// buckets 0..k are all ready: every rank must issue collectives in the same
// order, and launching strictly in bucket order guarantees it even if two ranks
// see hooks fire in different orders.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace strata {

/// Buckets as lists of indices into `params`; a parameter larger than the cap
/// gets a bucket of its own. cap_bytes must be > 0.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<torch::Tensor>& params,
                                                int64_t cap_bytes);

class GradReadiness {
 public:
  /// `launch(k)` is called (from the autograd thread) when bucket k may start.
  GradReadiness(std::vector<torch::Tensor> params, std::vector<std::vector<size_t>> buckets,
                std::function<void(size_t)> launch);
  /// The hooks stay on the autograd nodes; they become no-ops once this dies.
  ~GradReadiness() { *alive_ = false; }
  GradReadiness(const GradReadiness&) = delete;
  GradReadiness& operator=(const GradReadiness&) = delete;

  /// Registers the hooks; `active()` is read on every hook (false under
  /// no_sync() or when launching after backward is wanted).
  void install_hooks(std::function<bool()> active);

  /// Starts a synchronised backward: every parameter pending again.
  void reset();
  void mark_ready(size_t param_index);
  /// Launches, in order, every bucket not launched yet.
  void launch_remaining();
  /// Parameters that never became ready since reset().
  std::vector<size_t> unready_params() const;
  bool all_launched() const { return next_bucket_ == buckets_.size(); }
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  /// Bucket index of each parameter.
  size_t bucket_of(size_t param_index) const { return bucket_of_[param_index]; }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;
  std::function<void(size_t)> launch_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> pending_;   // per bucket: params not ready yet
  std::vector<bool> ready_;       // per param
  size_t next_bucket_ = 0;        // buckets [0, next_bucket_) are launched
  // The AccumulateGrad nodes must stay alive, or autograd would create new ones
  // without our hooks.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace strata
