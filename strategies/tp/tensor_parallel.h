#pragma once
// TensorParallel: the tensor-parallel dimension of a run, as a ModelParallel
// (strategies/strategy.h) beside a data-parallel strategy. It splits a
// TensorParallelModel's parameters over this rank's tensor-parallel group by
// the model's plan (plan.h) and hands the model the tp::Parallel its forward
// calls (parallel.h); the strategy (single for pure tensor parallelism, ddp,
// oss, sdp or fsdp: their specs say tensor_parallel()) then runs over the
// data-parallel group.
//
// What one rank holds: its part of each split parameter (1/T of the
// attention and MLP weights and of the vocabulary) and every replicated one
// (LayerNorms, row-parallel biases, position embeddings) whole. What it sends
// per micro-batch, per block: two all-reduces of [B, S, C] activations in
// forward and two in backward (sequence parallel: an all-gather and a
// reduce-scatter in place of each), plus the embedding's and the head's.
//
// Example (4 ranks, tp 2: ddp over {0,2} and {1,3}):
//   auto mesh = tp::MeshDims::of(world.size(), 2);
//   Comm tp_group = world.split("tp", mesh.tp_groups());
//   Comm dp_group = world.split("dp", mesh.dp_groups());
//   auto parallel = std::make_shared<tp::TensorParallel>(world, tp_group, tp::TensorParallelOptions());
//   parallel->apply(module);                        // before the strategy's setup
//   auto strategy = registry.create("ddp", dp_group);
//   strategy->set_model_parallel(parallel);
#include "strata/strategies/strategy.h"
#include "strata/strategies/tp/plan.h"

#include <torch/arg.h>

#include <map>
#include <memory>
#include <string>

namespace strata::tp {

struct TensorParallelOptions {
  /// Activations outside the parallel layers split along the sequence
  /// (Megatron's sequence parallelism); the sequence length must divide by T.
  TORCH_ARG(bool, sequence_parallel) = false;
};

class TensorParallel : public ModelParallel {
 public:
  /// `world`: every rank; `group`: this rank's tensor-parallel ranks
  /// (MeshDims::tp_groups()).
  TensorParallel(Comm world, Comm group, TensorParallelOptions options = {});

  /// Splits `module`'s parameters by its plan, in place (a parameter keeps
  /// its identity, its data becomes this rank's part), and gives it its
  /// tp::Parallel. A deferred parameter is built whole, initialised
  /// (init_parameter) and cut: every rank's part equals the same rows of an
  /// unsplit build. Throws c10::ValueError, naming the values, when the
  /// module is no TensorParallelModel or cannot split over this group.
  void apply(TrainingModule& module);

  const Comm& world() const override { return world_; }
  const Comm& group() const { return group_; }
  const TensorParallelOptions& options() const { return options_; }
  bool counts_gradient(const std::string& name) const override;
  void sum_over_group(torch::Tensor& sq) override;
  std::shared_ptr<void> gather_full_params(TrainingModule& module, bool writeback) override;
  /// A split parameter's part is runs of the whole: a colwise or vocab part
  /// one run per chunk, a rowwise part one per row. Each becomes a piece.
  std::vector<StatePiece> to_global(std::vector<StatePiece> pieces, StateUse use) const override;

  /// The split parameters, by qualified name (after apply()).
  const std::map<std::string, Layout>& layouts() const { return layouts_; }
  /// Their global shapes.
  const std::map<std::string, std::vector<int64_t>>& global_shapes() const { return shapes_; }
  /// One paragraph: the group, what is split and what is replicated.
  std::string describe() const;

 private:
  /// The whole value of split parameter `name` from every rank's `local` part.
  torch::Tensor gather(const std::string& name, const torch::Tensor& local);

  Comm world_;
  Comm group_;
  TensorParallelOptions options_;
  std::map<std::string, Layout> layouts_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  int64_t replicated_params_ = 0;
};

}  // namespace strata::tp
