#pragma once
// Everything strata needs from CUDA and NCCL, behind a CPU-only interface.
//
// cuda_support.cpp is the one file that includes CUDA headers. CMake defines
// STRATA_WITH_CUDA for it when LibTorch has CUDA; otherwise the same functions
// exist and each one fails with an error saying this LibTorch is CPU-only, so
// callers never need an #ifdef. With the PyPI wheel (a CUDA build) the CUDA
// half is compiled and linked into every binary.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

/// True when this build's LibTorch has CUDA (the functions below work).
bool built_with_cuda();

/// Makes cuda:index the current device of this thread (NCCL binds each rank
/// to the current device when its communicator is created).
void set_cuda_device(int index);

/// Makes the NCCL process group end a rank whose collective outlives the
/// timeout: unless the user set any of nccl_timeout_variables(), sets
/// TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (what torchrun sets for its workers).
/// Returns true when it set the variable. Called by create_nccl_group();
/// CPU-testable.
bool enable_nccl_timeouts();
/// The variables enable_nccl_timeouts() respects, as strata spells them.
const std::vector<std::string>& nccl_timeout_variables();
/// The same names as this build's ProcessGroupNCCL.hpp spells them (CUDA
/// builds; the test compares the two lists).
std::vector<std::string> nccl_timeout_variables_in_libtorch();

/// An NCCL process group over `store`; call set_cuda_device(LOCAL_RANK) first.
/// A collective that does not finish within `timeout` aborts the communicator
/// and fails the rank (see enable_nccl_timeouts()), instead of hanging.
c10::intrusive_ptr<c10d::ProcessGroup> create_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int rank, int world_size,
                                                         std::chrono::milliseconds timeout);

/// Bytes of tensors allocated on cuda:index, now and at the peak: the caching
/// allocator's own count of live allocations, not its reserved pool.
struct CudaAllocatedBytes {
  int64_t current = 0;
  int64_t peak = 0;
};
CudaAllocatedBytes cuda_allocated_bytes(int index);
/// Sets the peak to the current value (start of a measured phase).
void reset_cuda_peak_allocated_bytes(int index);
/// Total memory of cuda:index, bytes (the memory planner's default budget).
int64_t cuda_total_memory_bytes(int index);

}  // namespace strata
