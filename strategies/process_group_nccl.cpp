// NCCL process groups. CMake compiles this file only when LibTorch has CUDA
// and then defines STRATA_WITH_NCCL; the guard keeps it inert anywhere else.
#ifdef STRATA_WITH_NCCL

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

// Like USE_C10D_GLOO, LibTorch's CMake config does not export this guard.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>

namespace strata::detail {

/// Declared in process_group.cpp, its only caller.
c10::intrusive_ptr<c10d::ProcessGroup> create_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int rank, int world_size,
                                                         std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  // NCCL binds each rank to the current CUDA device; the caller selects it
  // (LOCAL_RANK) before creating the group. Communicators are created lazily
  // on the first collective, so construction itself does not block.
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
}

}  // namespace strata::detail

#endif  // STRATA_WITH_NCCL
