#pragma once
// OSSStrategy ("oss", alias "zero1"): optimizer state sharding (ZeRO-1).
//
// Sharded: optimizer state. Each rank owns one contiguous shard of the flat
// parameter space (FlatLayout) and builds the inner optimizer over the pieces
// of parameters in its shard only. Communicated per step: gradients
// reduce-scattered to their owners after backward (Ψ), updated parameters
// all-gathered from their owners after the step (Ψ): 2Ψ in all.
// Model state per rank with fp32 AdamW: 4Ψ' params + 4Ψ' grads + 8Ψ'/N state.
//
// The inner optimizer sees 1-D pieces, not whole tensors: exact for every
// element-wise optimizer (SGD, Adam, AdamW, Adagrad, RMSprop); LBFGS is not
// supported. All trainable parameters must share one dtype (one flat buffer).
// Parameters without a gradient: see grad_sync.h.
#include "strata/strategies/flat_layout.h"
#include "strata/strategies/grad_sync.h"
#include "strata/strategies/strategy.h"

#include <utility>
#include <vector>

namespace strata {

struct ShardOptions {
  /// OSS: caps the transient buffers of the reduce-scatter / all-gather rounds.
  /// SDP: also the gradient bucket size.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Tolerate parameters that get no gradient (see grad_sync.h); otherwise
  /// such a parameter is an error naming it.
  TORCH_ARG(bool, find_unused_parameters) = false;
};

class OSSStrategy : public Strategy {
 public:
  OSSStrategy(Comm comm, ShardOptions options = {});
  std::string name() const override { return "oss"; }

  void setup(TrainingModule& module) override;
  std::unique_ptr<torch::optim::Optimizer> setup_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const OptimizerFactory& factory) override;
  void backward(const torch::Tensor& loss) override;
  void reduce_gradients() override;
  void optimizer_step(torch::optim::Optimizer& optimizer) override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;
  std::string describe() const override;
  bool optimizer_sharded() const override { return true; }

  const FlatLayout& layout() const { return layout_; }

 protected:
  /// Gradients live here: OSS keeps full flat gradients (param grads are views).
  /// Installs grad_sync_'s hooks.
  virtual void setup_gradients();
  /// This rank's reduced gradient shard (shard_numel elements).
  virtual torch::Tensor owned_grad() const;

  std::vector<torch::Tensor> local_grads_for_norm() const override { return {owned_grad()}; }
  /// kSave: this rank's shard of the (replicated) parameters, so the ranks
  /// split the writing; kLoad: the base's full parameters.
  std::vector<ParamPiece> param_pieces(StateUse use) const override;
  /// The 1-D pieces the inner optimizer holds (this rank's shard).
  std::vector<ParamPiece> optimizer_param_pieces(StateUse use) const override;
  int64_t round_numel() const;
  /// Fails (on every rank alike) if a parameter's requires_grad changed after setup.
  void check_trainable_unchanged() const;

  ShardOptions options_;
  GradSync grad_sync_;
  FlatLayout layout_;
  torch::Tensor flat_params_;
  torch::Tensor flat_grads_;

 private:
  /// What the inner optimizer holds: 1-D views of parameter pieces.
  std::vector<ParamPiece> optimizer_pieces_;
};

/// How "oss" (alias zero1) registers (strategies/spec.h): --bucket-cap-mb,
/// --find-unused-parameters; --offload keeps the optimizer state in the tier.
StrategySpec oss_spec();

/// What oss and sdp share: their options, their options as ShardOptions, and
/// their memory (sdp shards gradients too) and communication models.
std::vector<StrategyOption> shard_options();
ShardOptions shard_options_from(const StrategyArgs& args);
std::optional<MemoryEstimate> sharded_optimizer_memory(const MemoryQuery& query, bool shard_grads);
std::optional<CommEstimate> sharded_optimizer_comm(const MemoryQuery& query, CollectiveKind gradient_collective);
/// Their factory: `S` with the shard options, the optimizer state offloaded as asked.
template <typename S>
StrategySpec::Factory shard_factory() {
  return [](Comm comm, const StrategyArgs& args, const StrategyContext& context) -> std::unique_ptr<Strategy> {
    return offload_optimizer_state_as_asked(std::make_unique<S>(std::move(comm), shard_options_from(args)), context);
  };
}

}  // namespace strata
