#pragma once
// Device choice and process-group creation from a rendezvous address: Gloo
// on CPU; NCCL on cuda:LOCAL_RANK when LibTorch has CUDA (cuda_support.cpp). Rendezvous goes through strata::TcpStore, whose server listens on
// master_addr only (c10d's TCPStore in 1.13 binds every interface).
#include "strategies/comm.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace strata {

struct ProcessGroupOptions {
  ProcessGroupOptions(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  TORCH_ARG(int, rank);
  TORCH_ARG(int, world_size);
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 29500;
  /// Every collective and the rendezvous fail after this long (never hang).
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// "gloo" or "nccl" ("nccl" only when LibTorch has CUDA).
  TORCH_ARG(std::string, backend) = "gloo";
};

/// Rendezvous and build the process group; errors name the address, port,
/// rank and world size involved (port in use, address unreachable, a rank
/// whose WORLD_SIZE disagrees with rank 0's).
c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const ProcessGroupOptions& options);

/// A Gloo group over an existing store (tests: ranks as threads on a HashStore).
c10::intrusive_ptr<c10d::ProcessGroup> create_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout, const std::string& hostname = "127.0.0.1");

}  // namespace strata
