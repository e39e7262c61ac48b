#include "strategies/process_group.h"

#include "core/cuda_support.h"
#include "strategies/tcp_store.h"

// The Gloo headers are guarded by USE_C10D_GLOO, which LibTorch's CMake config
// does not export; Debian's LibTorch is built with Gloo (the symbols are in
// libtorch_cpu), so declaring it here only unlocks the declarations.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <arpa/inet.h>

#include <string>

namespace strata {


namespace {

constexpr const char* kWorldSizeKey = "strata/world_size";

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string to_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> create_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int rank, int world_size,
                                                         std::chrono::milliseconds timeout,
                                                         const std::string& hostname) {
  TORCH_CHECK(store, "create_gloo_group: store is null (rank ", rank, ", world size ", world_size, ")");
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "create_gloo_group: rank ", rank,
              " is outside the world [0, ", world_size, ")");
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Which address Gloo's own sockets bind to. With a loopback master every
  // rank is on this machine: bind to that address, so traffic stays on the
  // loopback interface and never depends on how this host's name resolves
  // (containers often map it to an address peers cannot reach). Otherwise the
  // master's address is not ours to bind (it is rank 0's host), so let Gloo
  // pick this machine's address from its hostname (loopback as a fallback).
  options->devices.push_back(is_loopback(hostname)
                                 ? c10d::ProcessGroupGloo::createDeviceForHostname(hostname)
                                 : c10d::ProcessGroupGloo::createDefaultDevice());
  // The constructor connects the full mesh through the store: it blocks until
  // every rank has published its address (bounded by `timeout`).
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const ProcessGroupOptions& options) {
  const int rank = options.rank();
  const int world_size = options.world_size();
  const std::string& addr = options.master_addr();
  const int port = options.master_port();
  const std::string& backend = options.backend();
  TORCH_CHECK(world_size >= 1, "create_process_group: WORLD_SIZE ", world_size, " must be >= 1");
  TORCH_CHECK(rank >= 0 && rank < world_size, "create_process_group: RANK ", rank,
              " is outside [0, WORLD_SIZE ", world_size, ")");
  TORCH_CHECK(backend == "gloo" || backend == "nccl", "create_process_group: unknown backend '",
              backend, "'; allowed values: 'gloo', 'nccl'");
  TORCH_CHECK(backend != "nccl" || built_with_cuda(),
              "backend 'nccl' needs LibTorch with CUDA; this build has only 'gloo'");

  // Rank 0 hosts the store; the others connect, retrying until the timeout
  // (rank 0 may start later than they do).
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<TcpStore>(addr, port, rank == 0, options.timeout());
  } catch (const c10::Error& e) {
    // The store's message names the address and port; add who was asking.
    TORCH_CHECK(false, e.what_without_backtrace(), " (rank ", rank, ", WORLD_SIZE ", world_size, ")");
  }

  // Rendezvous check: a rank launched with a different WORLD_SIZE would
  // otherwise hang in the Gloo mesh until the timeout, or worse, connect to
  // the wrong peers. get() blocks until rank 0 has set the key.
  if (rank == 0) {
    const std::string text = std::to_string(world_size);
    store->set(kWorldSizeKey, std::vector<uint8_t>(text.begin(), text.end()));
  }
  const std::string rank0_world_size = to_text(store->get(kWorldSizeKey));
  TORCH_CHECK(rank0_world_size == std::to_string(world_size), "rank ", rank, " has WORLD_SIZE ",
              world_size, " but rank 0 has WORLD_SIZE ", rank0_world_size, " (MASTER_ADDR ", addr,
              ":", port, ")");

  if (backend == "nccl") return create_nccl_group(store, rank, world_size, options.timeout());
  return create_gloo_group(store, rank, world_size, options.timeout(), addr);
}

}  // namespace strata
