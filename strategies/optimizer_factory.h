#pragma once
// OptimizerFactory: how a strategy builds the optimizer over the parameter
// groups it decides this rank steps. Its own header so that optimizer
// wrappers (offloaded_moments.h) need not include the Strategy base.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace strata {

/// Builds the inner optimizer over the parameter groups a strategy hands it
/// (all of them, or only this rank's shard).
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::optim::OptimizerParamGroup>)>;

// Why the two helpers below: LibTorch 2.x's add_param_group merges every
// group's options with the optimizer's defaults and takes the default for
// each field whose value equals the options type's constructor default, so an
// SGD group that asks for weight_decay 0 (SGDOptions' own default) decays at
// the defaults' rate (the no-decay group of biases and norms), and an SGD
// group handed to an optimizer with AdamW defaults loses its options. strata
// builds every group with its own options and keeps them exactly.

/// `make(groups)`, then each group given back exactly the options it was
/// built with (for torch's own optimizers, which merge).
template <typename Make>
std::unique_ptr<torch::optim::Optimizer> with_exact_group_options(std::vector<torch::optim::OptimizerParamGroup> groups,
                                                                  Make make) {
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> intended;
  for (const auto& group : groups) intended.push_back(group.has_options() ? group.options().clone() : nullptr);
  std::unique_ptr<torch::optim::Optimizer> optimizer = make(std::move(groups));
  auto& built = optimizer->param_groups();
  TORCH_CHECK(built.size() == intended.size(), "optimizer has ", built.size(), " parameter groups, built with ",
              intended.size());
  for (size_t g = 0; g < built.size(); ++g)
    if (intended[g]) built[g].set_options(std::move(intended[g]));
  return optimizer;
}

/// Base of strata's own optimizers (the offloading ones): the groups go in as
/// built, never through the merge; each must carry its own options.
class ExactGroupsOptimizer : public torch::optim::Optimizer {
 protected:
  ExactGroupsOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, const char* who)
      : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                                std::make_unique<torch::optim::AdamWOptions>()) {
    for (const auto& group : groups)
      TORCH_CHECK(group.has_options(), who, ": every parameter group needs its own options (the Trainer's do)");
    param_groups_ = std::move(groups);
  }
};

}  // namespace strata
