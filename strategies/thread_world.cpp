#include "strata/strategies/thread_world.h"

#include "strata/strategies/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <csignal>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

void run_thread_world(int world_size, const std::function<void(Comm&)>& fn,
                      std::chrono::milliseconds timeout) {
  TORCH_CHECK(world_size >= 1, "run_thread_world: world size ", world_size, " must be >= 1");
  // A rank that leaves early (a test's failing rank) closes its Gloo pairs;
  // a peer's next write to one must fail with EPIPE, not end the process
  // with SIGPIPE (Gloo writes without MSG_NOSIGNAL; Python, which PyTorch's
  // Gloo users run under, ignores SIGPIPE from the start). Measured: 1 run in
  // 6 of FlightRecorderTest.ASkippedCollectiveIsAMismatchInTheDumps died so.
  std::signal(SIGPIPE, SIG_IGN);
  auto store = c10::make_intrusive<c10d::HashStore>();
  // The rendezvous waits on this store; without it a rank that never arrives
  // would hold the others for HashStore's default of 300 s.
  store->setTimeout(timeout);

  std::mutex mutex;
  std::exception_ptr first_error;  // guarded by mutex
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        // Scoped so the group is destroyed inside the thread: its destructor
        // waits for the group's pending work, and a rank that threw closes its
        // connections, which makes its peers' collectives fail fast.
        // With a subgroup factory over the same HashStore, so strategies can
        // split the world (FSDP's hybrid_shard) as in a launched job.
        Comm comm(create_gloo_group(store, rank, world_size, timeout), torch::kCPU,
                  subgroup_factory(store, "gloo", timeout));
        fn(comm);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  // Why join all before rethrowing: the threads reference `fn`, the store and
  // the locals above; every rank ends within `timeout` of a failure.
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace strata
