#pragma once
// Devices: which device a rank trains on, and the c10d backend that goes
// with it. The CUDA calls themselves live in core/cuda_support.cpp.
#include <torch/torch.h>

#include <string>

namespace strata {

/// The device a rank trains on, from --device: "cpu"; "cuda" is cuda:LOCAL_RANK
/// (one GPU per local rank, as torchrun) and an error when no CUDA device is
/// usable or LOCAL_RANK has none; "auto" is cuda:LOCAL_RANK when CUDA devices
/// are visible, else cpu. Errors name the value and what is allowed.
torch::Device resolve_device(const std::string& spec, int local_rank);

/// The c10d backend for a device: "nccl" for CUDA, "gloo" otherwise.
std::string backend_for(const torch::Device& device);

}  // namespace strata
