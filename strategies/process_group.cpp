#include "strata/strategies/process_group.h"

#include "strata/core/cuda_support.h"
#include "strata/core/net.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

// The Gloo headers are guarded by USE_C10D_GLOO, which LibTorch's CMake config
// does not export; the wheel's LibTorch is built with Gloo (the symbols are in
// libtorch_cpu), so declaring it here only unlocks the declarations. This is
// the one file that includes Gloo's own headers (Debian's libgloo-dev): what
// of them is compiled in here is listed in docs/design.md ("Gloo headers").
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <sstream>
#include <string>

namespace strata {

namespace {

constexpr const char* kWorldSizeKey = "strata/world_size";

std::string to_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::string seconds_text(std::chrono::milliseconds t) {
  return c10::str(static_cast<double>(t.count()) / 1000.0, " s");
}

/// Names the store the options describe, for error messages.
std::string describe_store(const ProcessGroupOptions& o) {
  if (!o.store_file().empty()) return "the FileStore " + o.store_file() + " (STRATA_STORE_FILE)";
  const std::string where = o.master_addr() + ":" + std::to_string(o.master_port());
  if (o.agent_store()) return "torchrun's agent store at MASTER_ADDR:MASTER_PORT " + where;
  return "rank 0's store at MASTER_ADDR:MASTER_PORT " + where;
}

std::string who(const ProcessGroupOptions& o) {
  return c10::str("rank ", o.rank(), ", WORLD_SIZE ", o.world_size());
}

/// An exception's message without c10's backtrace.
std::string message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> create_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int rank, int world_size,
                                                         std::chrono::milliseconds timeout,
                                                         const std::string& master_addr,
                                                         const std::string& interfaces) {
  TORCH_CHECK(store, "create_gloo_group: store is null (rank ", rank, ", world size ", world_size, ")");
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "create_gloo_group: rank ", rank,
              " is outside the world [0, ", world_size, ")");
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Which address Gloo's own sockets bind to (each rank listens there and
  // publishes it in the store for its peers). Not the hostname's address
  // (createDefaultDevice): containers and network namespaces often map the
  // hostname to an address peers cannot reach (127.0.0.1 here). The address
  // this machine uses to reach MASTER_ADDR is one the master — and so every
  // peer on that network — can reach back; with a loopback master it is
  // loopback, and a one-machine run stays off the network. GLOO_SOCKET_IFNAME
  // overrides it, as in torch.
  const auto names = split_commas(interfaces);
  if (!names.empty()) {
    for (const auto& name : names) {
      try {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "GLOO_SOCKET_IFNAME names interface '", name, "', which Gloo cannot use (rank ",
                    rank, "): ", message_of(e));
      }
    }
  } else {
    const std::string local = local_address_towards(master_addr, "MASTER_ADDR");
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
  }
  // The constructor connects the full mesh through the store: it blocks until
  // every rank has published its address and connected (bounded by `timeout`).
  c10::intrusive_ptr<c10d::ProcessGroupGloo> backend;
  try {
    backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", rank, " of ", world_size, " could not connect Gloo to its peers within ",
                seconds_text(timeout), " (MASTER_ADDR ", master_addr, "): ", message_of(e));
  }
  // LibTorch 2.x: a ProcessGroup dispatches each collective to the Backend
  // registered for its tensors' device type; Gloo serves CPU tensors.
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  return group;
}

c10::intrusive_ptr<c10d::Store> create_store(const ProcessGroupOptions& o) {
  const int rank = o.rank();
  c10::intrusive_ptr<c10d::Store> store;
  if (!o.store_file().empty()) {
    try {
      store = c10::make_intrusive<c10d::FileStore>(o.store_file(), o.world_size());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "cannot open ", describe_store(o), " (", who(o), "): ", message_of(e));
    }
    // FileStore's own default is 300 s; a rank that never arrives must fail
    // within the job's timeout like everything else.
    store->setTimeout(o.timeout());
  } else {
    const bool host = !o.agent_store() && rank == 0;
    const int port = o.master_port();
    TORCH_CHECK(port >= (host ? 0 : 1) && port <= 65535, "MASTER_PORT ", port, " must be in [",
                host ? 0 : 1, ", 65535] (", who(o), ")");
    c10d::TCPStoreOptions tcp;
    tcp.port = static_cast<uint16_t>(port);
    tcp.isServer = host;
    tcp.numWorkers = static_cast<size_t>(o.world_size());
    // Why not waitWorkers: ranks check in through the world-size key below,
    // with an error that says who is missing; c10d's wait only counts.
    tcp.waitWorkers = false;
    tcp.timeout = o.timeout();
    try {
      store = c10::make_intrusive<c10d::TCPStore>(o.master_addr(), tcp);
    } catch (const std::exception& e) {
      const std::string why = message_of(e);
      TORCH_CHECK(!host, "rank 0 could not host the rendezvous store on MASTER_PORT ", port,
                  " (MASTER_ADDR ", o.master_addr(), ", ", who(o), "): ", why);
      TORCH_CHECK(false, "could not reach ", describe_store(o), " within ", seconds_text(o.timeout()),
                  " (", who(o), "): ", why);
    }
  }
  if (!o.store_prefix().empty()) store = c10::make_intrusive<c10d::PrefixStore>(o.store_prefix(), store);
  return store;
}

namespace {

/// Errors in the options themselves, found before any store is opened.
void check_world_options(const ProcessGroupOptions& options) {
  const int rank = options.rank();
  const int world_size = options.world_size();
  const std::string& backend = options.backend();
  TORCH_CHECK(world_size >= 1, "create_process_group: WORLD_SIZE ", world_size, " must be >= 1");
  TORCH_CHECK(rank >= 0 && rank < world_size, "create_process_group: RANK ", rank,
              " is outside [0, WORLD_SIZE ", world_size, ")");
  TORCH_CHECK(backend == "gloo" || backend == "nccl", "create_process_group: unknown backend '",
              backend, "'; allowed values: 'gloo', 'nccl'");
  TORCH_CHECK(backend != "nccl" || built_with_cuda(),
              "backend 'nccl' needs LibTorch with CUDA; this build has only 'gloo'");
  // A CUDA build on a machine without a usable GPU (the wheel's LibTorch
  // anywhere): ProcessGroupNCCL must not even be constructed there.
  TORCH_CHECK(backend != "nccl" || torch::cuda::is_available(),
              "backend 'nccl' needs a CUDA device; none is visible (LibTorch built with CUDA, rank ", rank,
              "); use 'gloo'");
}

/// create_process_group after the store: checks the world size and connects.
c10::intrusive_ptr<c10d::ProcessGroup> connect_world(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const ProcessGroupOptions& options) {
  const int rank = options.rank();
  const int world_size = options.world_size();
  const std::string& backend = options.backend();

  // Rendezvous check: a rank launched with a different WORLD_SIZE would
  // otherwise hang in the mesh until the timeout, or worse, connect to the
  // wrong peers. get() blocks until rank 0 has set the key (bounded by the
  // store's timeout).
  if (rank == 0) {
    const std::string text = std::to_string(world_size);
    store->set(kWorldSizeKey, std::vector<uint8_t>(text.begin(), text.end()));
  }
  std::string rank0_world_size;
  try {
    rank0_world_size = to_text(store->get(kWorldSizeKey));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", rank, " did not hear from rank 0 in ", describe_store(options), " within ",
                seconds_text(options.timeout()), " (is rank 0 running, with the same store?): ", message_of(e));
  }
  TORCH_CHECK(rank0_world_size == std::to_string(world_size), "rank ", rank, " has WORLD_SIZE ",
              world_size, " but rank 0 has WORLD_SIZE ", rank0_world_size, " (", describe_store(options),
              ")");

  if (backend == "nccl") return create_nccl_group(store, rank, world_size, options.timeout());
  return create_gloo_group(store, rank, world_size, options.timeout(), options.master_addr(),
                           options.gloo_interfaces());
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const ProcessGroupOptions& options) {
  check_world_options(options);
  return connect_world(create_store(options), options);
}

Comm create_world_comm(const ProcessGroupOptions& options, torch::Device device) {
  check_world_options(options);
  auto store = create_store(options);
  auto group = connect_world(store, options);
  return Comm(group, device,
              subgroup_factory(store, options.backend(), options.timeout(), options.master_addr(),
                               options.gloo_interfaces()));
}

SubgroupFactory subgroup_factory(const c10::intrusive_ptr<c10d::Store>& store, const std::string& backend,
                                 std::chrono::milliseconds timeout, const std::string& master_addr,
                                 const std::string& interfaces) {
  TORCH_CHECK(store, "subgroup_factory: store is null");
  return [store, backend, timeout, master_addr, interfaces](const std::string& key, int rank, int size) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key, store);
    // Why no world-size check as for the world: the members and their count
    // come from Comm::split's partition, which every rank computed alike.
    if (backend == "nccl") return create_nccl_group(prefixed, rank, size, timeout);
    return create_gloo_group(prefixed, rank, size, timeout, master_addr, interfaces);
  };
}

}  // namespace strata
