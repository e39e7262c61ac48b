#include "strata/core/device.h"

#include "strata/core/cuda_support.h"

namespace strata {

torch::Device resolve_device(const std::string& spec, int local_rank) {
  TORCH_CHECK_VALUE(spec == "auto" || spec == "cpu" || spec == "cuda", "unknown device '", spec,
                    "'; allowed: auto, cpu, cuda");
  TORCH_CHECK_VALUE(local_rank >= 0, "LOCAL_RANK ", local_rank, " must be >= 0");
  if (spec == "cpu") return torch::Device(torch::kCPU);
  const bool available = torch::cuda::is_available();
  if (spec == "auto" && !available) return torch::Device(torch::kCPU);
  TORCH_CHECK_VALUE(available, "--device cuda: no CUDA device is usable (LibTorch built with CUDA: ",
                    built_with_cuda() ? "yes" : "no", ", devices visible: ",
                    built_with_cuda() ? torch::cuda::device_count() : 0, "); use --device cpu or auto");
  const auto count = static_cast<int>(torch::cuda::device_count());
  // One GPU per local rank, as torchrun does: LOCAL_RANK picks the device.
  TORCH_CHECK_VALUE(local_rank < count, "LOCAL_RANK ", local_rank, " has no CUDA device: ", count,
                    " visible, one per local rank is needed; launch at most ", count,
                    " ranks per node or use --device cpu");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

std::string backend_for(const torch::Device& device) { return device.is_cuda() ? "nccl" : "gloo"; }

}  // namespace strata
