#pragma once
// The key under which torch::optim keeps a parameter's state: its TensorImpl's
// address (a void* in LibTorch 2.x; 1.x used the address as a string).
// Strategies and the fused optimizer create and find state under the same key
// torch's own optimizers use, so either kind of optimizer reads the other's.
#include <torch/torch.h>

namespace strata {

inline void* optim_state_key(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }

}  // namespace strata
