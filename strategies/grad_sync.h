#pragma once
// GradSync: what every data-parallel strategy (ddp, oss, sdp, fsdp) does around
// backward, in one place: gradient hooks (GradReadiness) and the rule for
// parameters that get no gradient.
//
// The rule. A trainable parameter that gets no gradient in any backward of a
// step (every micro-batch since the last reduce) is an error naming it, raised
// identically on every rank after every rank has issued the same collectives,
// so nobody hangs. With find_unused_parameters it is tolerated: it counts as a
// zero gradient in the reduction; and when NO rank used it, the optimizer
// skips it for that step, exactly as torch skips a parameter whose .grad is
// None (no weight decay, no momentum, no step count): this is what single-
// process training and torch DDP do, so parity holds. Deciding "no rank"
// takes agreement: one one-element all-reduce per step, plus one all-reduce of
// a per-parameter count in steps where some rank missed a gradient.
//
// Example (a strategy's members):
//   void setup(...)            { grad_sync_.install(params(), param_names(), buckets, launch, active); }
//   void backward(loss)        { grad_sync_.backward(loss, require_sync()); }
//   void reduce_gradients()    { grad_sync_.launch_remaining(); wait...; grad_sync_.resolve_unused(comm(), name()); }
//   void optimizer_step(opt)   { HiddenGrads hide(... grad_sync_.unused_everywhere() ...); opt.step(); }
#include "strata/strategies/comm.h"
#include "strata/strategies/grad_buckets.h"
#include "strata/strategies/spec.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata {

class GradSync {
 public:
  explicit GradSync(bool find_unused_parameters) : find_unused_parameters_(find_unused_parameters) {}

  /// (Re)builds the hooks for `params`: the hooks of an earlier install()
  /// become no-ops. `launch(k)` sends bucket k; `active()` is false under no_sync.
  void install(const std::vector<torch::Tensor>& params, std::vector<std::string> names,
               std::vector<std::vector<size_t>> buckets, std::function<void(size_t)> launch,
               std::function<bool()> active);
  const GradReadiness& readiness() const;
  /// GradReadiness::rehook for parameter k (of install()'s list).
  void rehook(size_t k);

  /// A synchronised backward starts with every parameter pending again.
  void backward(const torch::Tensor& loss, bool require_sync);

  /// After the last backward of a step: launches every bucket the hooks did
  /// not (so every rank issues the same collectives, unused parameters or not).
  void launch_remaining();

  /// After this step's gradient collectives: agrees over ranks on parameters
  /// without a gradient (see the rule above) and throws naming them, unless
  /// find_unused_parameters; then unused_everywhere() lists those no rank used.
  void resolve_unused(Comm& comm, const std::string& owner);
  const std::vector<size_t>& unused_everywhere() const { return unused_everywhere_; }

 private:
  bool find_unused_parameters_;
  std::vector<std::string> names_;
  std::unique_ptr<GradReadiness> readiness_;
  std::vector<size_t> unused_everywhere_;
};

/// RAII: while alive, the tensors have no gradient (so a torch optimizer skips
/// them); their gradient tensors are put back on destruction.
class HiddenGrads {
 public:
  explicit HiddenGrads(std::vector<torch::Tensor> tensors);
  ~HiddenGrads();
  HiddenGrads(const HiddenGrads&) = delete;
  HiddenGrads& operator=(const HiddenGrads&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> saved_;  // (tensor, its grad)
};

/// The options the data-parallel strategies share, declared here once so
/// that each spec declares them alike (one key, one kind and default):
/// --bucket-cap-mb (ddp, oss, sdp; each adds its own range) and
/// --find-unused-parameters (the rule above; ddp, oss, sdp, fsdp).
StrategyOption bucket_cap_mb_option();
StrategyOption find_unused_parameters_option();

}  // namespace strata
