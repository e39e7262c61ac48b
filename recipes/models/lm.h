#pragma once
// What every language model of the recipes shares: the next-token loss and
// the validation sums over logits.
#include "strata/core/training_module.h"

#include <torch/torch.h>

namespace strata::recipes {

/// Next-token cross-entropy of logits [B, T, V] against targets [B, T]
/// (-1 = ignored), the mean over scored positions, computed in fp32.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& target);

/// Validation sums for logits [B, T, V]: summed loss and scored positions,
/// and samples whose every scored position is predicted exactly (argmax).
ValidationStep lm_validation(const torch::Tensor& logits, const Batch& batch);

}  // namespace strata::recipes
