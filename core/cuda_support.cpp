#include "strata/core/cuda_support.h"

#include <c10/util/Exception.h>

#ifdef STRATA_WITH_CUDA
#include <ATen/Context.h>
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
#include <string>
#include <vector>

namespace strata {

const std::vector<std::string>& nccl_timeout_variables() {
  // The names LibTorch 2.x's ProcessGroupNCCL reads, first the current one,
  // then the deprecated one it still honours (ProcessGroupNCCL.hpp's
  // TORCH_NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_BLOCKING_WAIT). A unit test
  // checks this list against the header in every build.
  static const std::vector<std::string> names = {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING",
                                                 "TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"};
  return names;
}

bool enable_nccl_timeouts() {
  // Why: a collective whose peer died must end the rank, not wait forever
  // inside NCCL. TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (tear down) makes the
  // watchdog abort the communicator and end the process when a collective
  // outlives the group's timeout; torchrun's agent sets the same for its
  // workers. The user's own choice (any of the names, even "0") is left
  // alone. Must run before the group is constructed: its constructor reads it.
  for (const auto& name : nccl_timeout_variables())
    if (std::getenv(name.c_str()) != nullptr) return false;
  return ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", /*overwrite=*/0) == 0;
}

#ifdef STRATA_WITH_CUDA

std::vector<std::string> nccl_timeout_variables_in_libtorch() {
  std::vector<std::string> names = c10d::TORCH_NCCL_ASYNC_ERROR_HANDLING;
  names.insert(names.end(), c10d::TORCH_NCCL_BLOCKING_WAIT.begin(), c10d::TORCH_NCCL_BLOCKING_WAIT.end());
  return names;
}

bool built_with_cuda() { return true; }

namespace {
// LibTorch initialises CUDA lazily, on the first CUDA tensor: until then the
// caching allocator has no per-device state, and asking it for statistics
// fails with "Invalid device argument 0: did you call init?" (seen on the
// first H200 run: the memory tracker resets its peak before the model exists).
// The Python frontend calls the same init in torch.cuda._lazy_init.
void init_cuda() { at::globalContext().lazyInitDevice(c10::DeviceType::CUDA); }
}  // namespace

void set_cuda_device(int index) {
  const int count = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK(index >= 0 && index < count, "cuda:", index, " does not exist: ", count,
              " CUDA device(s) visible (check LOCAL_RANK and CUDA_VISIBLE_DEVICES)");
  init_cuda();
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
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  // LibTorch 2.x: a ProcessGroup dispatches each collective to the Backend
  // registered for its tensors' device type; NCCL serves CUDA tensors.
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
  return group;
}

CudaAllocatedBytes cuda_allocated_bytes(int index) {
  using c10::CachingAllocator::StatType;
  init_cuda();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  const auto& bytes = stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  return {bytes.current, bytes.peak};
}

void reset_cuda_peak_allocated_bytes(int index) {
  init_cuda();
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
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
std::vector<std::string> nccl_timeout_variables_in_libtorch() { no_cuda("nccl_timeout_variables_in_libtorch"); }
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
