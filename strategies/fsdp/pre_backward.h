#pragma once
// A hook that runs when the gradient w.r.t. a tensor has arrived, before
// backward goes further: FSDP's pre-backward, where a unit's parameters are
// gathered again before the engine enters the unit's backward.
#include <torch/torch.h>

#include <functional>

namespace strata {

/// Returns `out` passed through an identity autograd Function whose backward
/// calls `hook` (on the autograd thread) and passes the gradient on. The
/// result is a view of `out` made inside a custom Function: modifying it in
/// place is an error (torch forbids it; clone first). `out` must require grad.
torch::Tensor with_pre_backward_hook(const torch::Tensor& out, std::function<void()> hook);

}  // namespace strata
