#pragma once
// ComposedParallel: several model-parallel dimensions beside one strategy,
// as one ModelParallel (a Strategy holds one): pipeline stages outside,
// tensor-parallel ranks inside (3D: pp x dp x tp). Each question is asked of
// every dimension: a gradient counts in the norm when every dimension counts
// it, the norm's sum runs over each dimension's group, the whole parameters
// are gathered inner dimension first, and a checkpoint piece is mapped to the
// whole tensor by the inner dimension (a tensor-parallel part to its runs)
// before the outer one filters it (a tied weight saved by one stage).
//
// Example (strata-gpt's make_parallel):
//   auto both = std::make_shared<ComposedParallel>(
//       std::vector<std::shared_ptr<ModelParallel>>{pipeline, tensor_parallel});
//   strategy->set_model_parallel(both);
#include "strata/strategies/strategy.h"

#include <memory>
#include <vector>

namespace strata {

class ComposedParallel : public ModelParallel {
 public:
  /// `dims`: outermost first; each over its own group. world() is the
  /// outermost's (the job's): an inner one may see only its share of it.
  explicit ComposedParallel(std::vector<std::shared_ptr<ModelParallel>> dims);

  const Comm& world() const override { return dims_.front()->world(); }
  bool counts_gradient(const std::string& name) const override;
  void sum_over_group(torch::Tensor& sq) override;
  std::shared_ptr<void> gather_full_params(TrainingModule& module, bool writeback) override;
  std::vector<StatePiece> to_global(std::vector<StatePiece> pieces, StateUse use) const override;

 private:
  std::vector<std::shared_ptr<ModelParallel>> dims_;
};

}  // namespace strata
