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

}  // namespace strata
