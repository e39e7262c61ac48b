#include "core/cuda_support.h"

#include <c10/util/Exception.h>

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

// Like USE_C10D_GLOO, LibTorch's CMake config does not export this guard.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace strata {

#ifdef STRATA_WITH_CUDA

bool built_with_cuda() { return true; }

void set_cuda_device(int index) {
  const int count = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK(index >= 0 && index < count, "cuda:", index, " does not exist: ", count,
              " CUDA device(s) visible (check LOCAL_RANK and CUDA_VISIBLE_DEVICES)");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
}

c10::intrusive_ptr<c10d::ProcessGroup> create_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int rank, int world_size,
                                                         std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  // Communicators are created lazily on the first collective, on the device
  // current at that time (set_cuda_device), so construction does not block.
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
}

CudaAllocatedBytes cuda_allocated_bytes(int index) {
  using c10::cuda::CUDACachingAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const auto& bytes = stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  return {bytes.current, bytes.peak};
}

void reset_cuda_peak_allocated_bytes(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
}

#else  // CPU-only LibTorch: same interface, each call says why it cannot work.

namespace {
[[noreturn]] void no_cuda(const char* what) {
  TORCH_CHECK(false, what, " needs LibTorch with CUDA; this build's LibTorch is CPU-only");
}
}  // namespace

bool built_with_cuda() { return false; }
void set_cuda_device(int) { no_cuda("set_cuda_device"); }
c10::intrusive_ptr<c10d::ProcessGroup> create_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                         std::chrono::milliseconds) {
  no_cuda("the NCCL backend");
}
CudaAllocatedBytes cuda_allocated_bytes(int) { no_cuda("cuda_allocated_bytes"); }
void reset_cuda_peak_allocated_bytes(int) { no_cuda("reset_cuda_peak_allocated_bytes"); }

#endif

}  // namespace strata
