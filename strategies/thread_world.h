#pragma once
// Threads as ranks: a whole Gloo world inside one process, for tests and the
// micro-benchmarks (the idea of torch.distributed's threaded test groups).
//
// Example:
//   strata::run_thread_world(3, [](strata::Comm& comm) {
//     auto t = torch::ones({4});
//     comm.all_reduce(t);
//     EXPECT_TRUE(t.equal(torch::full({4}, 3.0)));
//   });
#include "strata/strategies/comm.h"

#include <chrono>
#include <functional>

namespace strata {

/// Runs `fn` on `world_size` threads, each a rank with its own Gloo process
/// group over one shared c10d::HashStore, and joins them. If any rank throws,
/// the first exception thrown is rethrown here after every thread has joined;
/// the other ranks cannot hang on the failed one for longer than `timeout`
/// (the rendezvous and every collective fail after it). Sets SIGPIPE to
/// SIG_IGN for the process, as Python does for PyTorch's Gloo users: a write
/// to a rank that left must be an error, not the end of the process.
void run_thread_world(int world_size, const std::function<void(Comm&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace strata
