#include "core/cuda_support.h"

#include <c10/util/Exception.h>

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

// Like USE_C10D_GLOO, LibTorch's CMake config does not export this guard.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <string_view>

namespace strata {

bool enable_nccl_timeouts() {
  // Why: in LibTorch 1.13 ProcessGroupNCCL's `timeout` is only enforced when
  // one of these is set. Without them a collective whose peer died waits
  // forever inside NCCL (the watchdog only logs), so a failing rank would
  // leave the others hanging. Async error handling aborts the communicator
  // and throws on the next use; the user's own choice (either variable, even
  // "0") is left alone. Must run before the group is constructed: its
  // constructor reads the variables.
  if (std::getenv("NCCL_ASYNC_ERROR_HANDLING") != nullptr || std::getenv("NCCL_BLOCKING_WAIT") != nullptr) {
    return false;
  }
  return ::setenv("NCCL_ASYNC_ERROR_HANDLING", "1", /*overwrite=*/0) == 0;
}

#ifdef STRATA_WITH_CUDA

// enable_nccl_timeouts() sets and reads these names: they must be the ones this
// LibTorch's ProcessGroupNCCL reads (checked by the cuda_support_compiles test).
static_assert(std::string_view(c10d::NCCL_ASYNC_ERROR_HANDLING) == "NCCL_ASYNC_ERROR_HANDLING");
static_assert(std::string_view(c10d::NCCL_BLOCKING_WAIT) == "NCCL_BLOCKING_WAIT");

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
  enable_nccl_timeouts();  // before the constructor, which reads the variable
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

int64_t cuda_total_memory_bytes(int index) {
  cudaDeviceProp properties{};
  C10_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  return static_cast<int64_t>(properties.totalGlobalMem);
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
int64_t cuda_total_memory_bytes(int) { no_cuda("cuda_total_memory_bytes"); }

#endif

}  // namespace strata
