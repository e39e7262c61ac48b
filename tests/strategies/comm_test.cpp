// Comm against local references, with ranks as threads (strategies/thread_world.h).
// Every collective, sync and async, for world sizes 1..4, with sizes that do not
// divide evenly; Gloo's missing collectives go through Comm's emulation here.
#include "tests/error_text.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/process_group.h"
#include "strata/strategies/thread_world.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kRounds = 200;
constexpr int64_t kChunk4K = 1 << 12;

using strata::CollectiveKind;
using strata::Comm;
using strata::run_thread_world;

constexpr int kMaxWorld = 4;

/// Rank r's input: distinct per rank and per element, exact in float32, with
/// the maximum on a different rank for different elements (tests MAX).
torch::Tensor rank_input(int rank, int64_t numel, torch::Dtype dtype = torch::kFloat32) {
  auto i = torch::arange(numel, torch::kFloat64);
  auto v = (i * (rank + 1) + 10 * rank) * (((i + rank).remainder(2)) * 2 - 1);
  return v.to(dtype);
}

torch::Tensor reference_sum(int world, int64_t numel, torch::Dtype dtype = torch::kFloat32) {
  auto acc = torch::zeros({numel}, dtype);
  for (int r = 0; r < world; ++r) acc += rank_input(r, numel, dtype);
  return acc;
}

torch::Tensor reference_max(int world, int64_t numel) {
  auto acc = rank_input(0, numel);
  for (int r = 1; r < world; ++r) acc = torch::maximum(acc, rank_input(r, numel));
  return acc;
}

using strata::testing::what_of;

// --- world of one -------------------------------------------------------------

TEST(CommTest, DefaultCommIsWorldOfOneIdentity) {
  Comm comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_FALSE(comm.is_distributed());

  auto t = rank_input(0, 7);
  const auto before = t.clone();
  comm.all_reduce(t);
  comm.all_reduce(t, c10d::ReduceOp::MAX);
  comm.broadcast(t, 0);
  comm.reduce(t, 0);
  EXPECT_TRUE(t.equal(before));

  auto out = torch::zeros({5});
  const auto in = rank_input(0, 5);
  comm.all_gather_into(out, in);
  EXPECT_TRUE(out.equal(in));
  auto rs = torch::zeros({5});
  comm.reduce_scatter(rs, in);
  EXPECT_TRUE(rs.equal(in));
  comm.barrier();

  auto w = comm.all_reduce_async(t);
  EXPECT_FALSE(w.pending());
  w.wait();
  EXPECT_EQ(comm.bytes().total_sent(), 0);
  for (int64_t c : comm.bytes().calls) EXPECT_EQ(c, 0);
}

TEST(CommTest, WorldOfOneStillValidatesShapes) {
  Comm comm;
  auto out = torch::zeros({4});
  const auto in = torch::zeros({5});
  const auto msg = what_of([&] { comm.all_gather_into(out, in); });
  EXPECT_NE(msg.find("output numel 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("input numel 5"), std::string::npos) << msg;
  auto t = torch::zeros({3});
  EXPECT_THROW(comm.broadcast(t, 1), c10::Error);  // root outside a world of one
}

TEST(CommTest, PendingWorkDefaultIsComplete) {
  strata::PendingWork w;
  EXPECT_FALSE(w.pending());
  w.wait();
  w.wait();
}

// --- every collective, every world size -----------------------------------------

TEST(CommTest, AllReduceSumMatchesReference) {
  for (int world = 1; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      auto t = rank_input(comm.rank(), 7);
      comm.all_reduce(t);
      EXPECT_TRUE(t.equal(reference_sum(world, 7))) << t;

      auto a = rank_input(comm.rank(), 7);
      auto w = comm.all_reduce_async(a);
      EXPECT_EQ(w.pending(), world > 1);
      w.wait();
      EXPECT_FALSE(w.pending());
      EXPECT_TRUE(a.equal(reference_sum(world, 7))) << a;
    });
  }
}

TEST(CommTest, AllReduceMaxMatchesReference) {
  for (int world = 1; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      auto t = rank_input(comm.rank(), 7).view({7, 1});  // any contiguous shape
      comm.all_reduce(t, c10d::ReduceOp::MAX);
      EXPECT_TRUE(t.view({7}).equal(reference_max(world, 7))) << t;

      auto a = rank_input(comm.rank(), 7);
      comm.all_reduce_async(a, c10d::ReduceOp::MAX).wait();
      EXPECT_TRUE(a.equal(reference_max(world, 7))) << a;
    });
  }
}

TEST(CommTest, BroadcastCopiesRootToEveryRank) {
  for (int world = 1; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      for (int root = 0; root < world; ++root) {
        auto t = rank_input(comm.rank(), 7);
        comm.broadcast(t, root);
        EXPECT_TRUE(t.equal(rank_input(root, 7))) << "root " << root << ": " << t;

        auto a = rank_input(comm.rank(), 7);
        comm.broadcast_async(a, root).wait();
        EXPECT_TRUE(a.equal(rank_input(root, 7))) << "async root " << root << ": " << a;
      }
    });
  }
}

TEST(CommTest, ReduceSumsOntoRoot) {
  for (int world = 1; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      for (int root = 0; root < world; ++root) {
        auto t = rank_input(comm.rank(), 7);
        comm.reduce(t, root);
        if (comm.rank() == root) {
          EXPECT_TRUE(t.equal(reference_sum(world, 7))) << t;
        }

        auto a = rank_input(comm.rank(), 7);
        comm.reduce_async(a, root, c10d::ReduceOp::MAX).wait();
        if (comm.rank() == root) {
          EXPECT_TRUE(a.equal(reference_max(world, 7))) << a;
        }
      }
    });
  }
}

TEST(CommTest, AllGatherIntoPlacesRankChunkAtItsOffset) {
  constexpr int64_t kChunk = 5;
  for (int world = 1; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      auto expected = torch::empty({world * kChunk});
      for (int r = 0; r < world; ++r) expected.narrow(0, r * kChunk, kChunk).copy_(rank_input(r, kChunk));

      auto out = torch::full({world * kChunk}, -1.0f);
      comm.all_gather_into(out, rank_input(comm.rank(), kChunk));
      EXPECT_TRUE(out.equal(expected)) << out;

      // Async, with a 2-D output: only numel and contiguity matter.
      auto out2 = torch::full({world, kChunk}, -1.0f);
      auto w = comm.all_gather_into_async(out2, rank_input(comm.rank(), kChunk));
      w.wait();
      EXPECT_TRUE(out2.view({-1}).equal(expected)) << out2;
    });
  }
}

TEST(CommTest, ReduceScatterSumsChunkOwnedByRank) {
  constexpr int64_t kChunk = 5;
  for (int world = 1; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      const auto full = reference_sum(world, world * kChunk);
      const auto expected = full.narrow(0, comm.rank() * kChunk, kChunk);

      auto out = torch::full({kChunk}, -1.0f);
      comm.reduce_scatter(out, rank_input(comm.rank(), world * kChunk));
      EXPECT_TRUE(out.equal(expected)) << out;

      auto out2 = torch::full({kChunk}, -1.0f);
      auto w = comm.reduce_scatter_async(out2, rank_input(comm.rank(), world * kChunk));
      w.wait();  // the local sum runs here
      EXPECT_TRUE(out2.equal(expected)) << out2;
    });
  }
}

TEST(CommTest, ReduceScatterReceivesIntoTheGivenWorkspace) {
  constexpr int64_t kChunk = 5;
  for (int world = 2; world <= kMaxWorld; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      const auto in = rank_input(comm.rank(), world * kChunk);
      auto workspace = torch::full({world * kChunk}, -1.0f);
      auto out = torch::full({kChunk}, -1.0f);
      comm.reduce_scatter_async(out, in, workspace).wait();
      EXPECT_TRUE(out.equal(reference_sum(world, world * kChunk).narrow(0, comm.rank() * kChunk, kChunk))) << out;
      // The emulation's all-to-all landed in the caller's buffer: row r is
      // rank r's copy of this rank's chunk (two ranks: the own row is read
      // from the input and not written).
      for (int r = 0; r < world; ++r) {
        if (world == 2 && r == comm.rank()) {
          EXPECT_TRUE(workspace.narrow(0, r * kChunk, kChunk).eq(-1.0f).all().item<bool>()) << workspace;
          continue;
        }
        EXPECT_TRUE(workspace.narrow(0, r * kChunk, kChunk)
                        .equal(rank_input(r, world * kChunk).narrow(0, comm.rank() * kChunk, kChunk)))
            << "row " << r << ": " << workspace;
      }
      auto small = torch::zeros({kChunk});
      const auto msg = what_of([&] { comm.reduce_scatter_async(out, in, small).wait(); });
      EXPECT_NE(msg.find("workspace numel 5 != input numel " + std::to_string(world * kChunk)), std::string::npos)
          << msg;
    });
  }
}

TEST(CommTest, AllGatherIntoMovesBfloat16BitsUnchanged) {
  constexpr int64_t kChunk = 7;
  run_thread_world(3, [](Comm& comm) {
    const int world = comm.size();
    // Values bf16 cannot hold exactly as fp16 (large and tiny): the bits
    // travel, not the numbers.
    auto in = (rank_input(comm.rank(), kChunk) * 1e30).to(torch::kBFloat16);
    auto out = torch::zeros({world * kChunk}, torch::kBFloat16);
    comm.all_gather_into(out, in);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(out.narrow(0, r * kChunk, kChunk).equal((rank_input(r, kChunk) * 1e30).to(torch::kBFloat16)))
          << "rank " << r;
    }
  });
}

TEST(CommTest, SendRecvDeliversUnevenPiecesToOneRankInTagOrder) {
  run_thread_world(3, [](Comm& comm) {
    // Rank r sends r+1 pieces of r+2 elements each (bf16: raw bytes travel),
    // all with distinct tags, to rank 0.
    auto piece = [](int r, int k) { return (rank_input(r, r + 2) + 100 * k).to(torch::kBFloat16); };
    if (comm.rank() == 0) {
      std::vector<strata::PendingWork> recvs;
      std::vector<torch::Tensor> got;
      for (int r = 1; r < comm.size(); ++r) {
        for (int k = 0; k <= r; ++k) {
          got.push_back(torch::zeros({r + 2}, torch::kBFloat16));
          recvs.push_back(comm.recv_async(got.back(), r, k));
        }
      }
      for (auto& w : recvs) w.wait();
      size_t i = 0;
      for (int r = 1; r < comm.size(); ++r) {
        for (int k = 0; k <= r; ++k, ++i) EXPECT_TRUE(got[i].equal(piece(r, k))) << "rank " << r << " piece " << k;
      }
      EXPECT_EQ(comm.bytes()[CollectiveKind::kSend], 0);
    } else {
      std::vector<strata::PendingWork> sends;
      int64_t bytes = 0;
      for (int k = 0; k <= comm.rank(); ++k) {
        const auto t = piece(comm.rank(), k);
        bytes += t.numel() * 2;
        sends.push_back(comm.send_async(t, 0, k));
      }
      for (auto& w : sends) w.wait();
      EXPECT_EQ(comm.bytes()[CollectiveKind::kSend], bytes);
    }
    auto t = torch::zeros({2});
    auto msg = what_of([&] { comm.send_async(t, comm.rank()); });
    EXPECT_NE(msg.find("destination rank " + std::to_string(comm.rank()) + " must be another rank"), std::string::npos)
        << msg;
    msg = what_of([&] { comm.recv_async(t, 3); });
    EXPECT_NE(msg.find("source rank 3 must be another rank of the world [0, 3)"), std::string::npos) << msg;
  });
}

TEST(CommTest, ReduceScatterSumsIntegerTensorsExactly) {
  constexpr int64_t kChunk = 5;
  run_thread_world(3, [](Comm& comm) {
    const int world = comm.size();
    auto in = rank_input(comm.rank(), world * kChunk, torch::kInt64) * 1000003;
    auto out = torch::zeros({kChunk}, torch::kInt64);
    comm.reduce_scatter(out, in);
    const auto expected = (reference_sum(world, world * kChunk, torch::kInt64) * 1000003)
                              .narrow(0, comm.rank() * kChunk, kChunk);
    EXPECT_TRUE(out.equal(expected)) << out;
  });
}

TEST(CommTest, ManyAsyncCollectivesInFlightCompleteCorrectly) {
  constexpr int64_t kChunk = 5;
  run_thread_world(3, [](Comm& comm) {
    const int world = comm.size();
    auto ar = rank_input(comm.rank(), 7);
    auto bc = rank_input(comm.rank(), 7);
    auto ag = torch::zeros({world * kChunk});
    const auto ag_in = rank_input(comm.rank(), kChunk);
    auto rs = torch::zeros({kChunk});
    const auto rs_in = rank_input(comm.rank(), world * kChunk);
    // Issued back to back (same order on every rank), waited in reverse.
    std::vector<strata::PendingWork> works;
    works.push_back(comm.all_reduce_async(ar));
    works.push_back(comm.broadcast_async(bc, 2));
    works.push_back(comm.all_gather_into_async(ag, ag_in));
    works.push_back(comm.reduce_scatter_async(rs, rs_in));
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();

    EXPECT_TRUE(ar.equal(reference_sum(world, 7)));
    EXPECT_TRUE(bc.equal(rank_input(2, 7)));
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(ag.narrow(0, r * kChunk, kChunk).equal(rank_input(r, kChunk))) << "rank " << r;
    EXPECT_TRUE(rs.equal(reference_sum(world, world * kChunk).narrow(0, comm.rank() * kChunk, kChunk)));
  });
}

TEST(CommTest, DroppedPendingWorkStillCompletes) {
  run_thread_world(2, [](Comm& comm) {
    auto out = torch::zeros({5});
    const auto in = rank_input(comm.rank(), 10);
    { auto w = comm.reduce_scatter_async(out, in); }  // destructor waits and sums
    EXPECT_TRUE(out.equal(reference_sum(2, 10).narrow(0, comm.rank() * 5, 5))) << out;
  });
}

// A buffer the caller lets go once wait() has returned is freed then, on the
// caller's thread: the process group holds no reference of its own that its
// worker thread drops a moment later. (FSDP allocates the next unit's
// reduce-scatter buffers right after waiting on the last one; when Gloo still
// held them, a rank's peak memory varied by a unit's gradient from run to
// run.) Checked many times over, since without the guarantee it is a race.
TEST(CommTest, BuffersAreFreedWhenTheCallerLetsGoAfterTheWait) {
  for (int world = 2; world <= 3; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_thread_world(world, [world](Comm& comm) {
      int still_held = 0;
      for (int round = 0; round < kRounds; ++round) {
        std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> buffers;
        {
          auto full = torch::ones({world * kChunk4K});
          auto shard = torch::ones({kChunk4K});
          auto workspace = torch::empty({world * kChunk4K});
          auto summed = torch::ones({kChunk4K});
          for (const auto* t : {&full, &shard, &workspace, &summed}) {
            buffers.emplace_back(t->storage().getWeakStorageImpl());
          }
          comm.all_gather_into_async(full, shard).wait();
          comm.reduce_scatter_async(shard, full, workspace).wait();
          comm.all_reduce_async(summed).wait();
        }
        for (const auto& b : buffers) still_held += b.expired() ? 0 : 1;
      }
      EXPECT_EQ(still_held, 0) << "buffers outlived the caller's last reference, over " << kRounds << " rounds";
    });
  }
}

// A handle given another collective finishes its own first, as its
// destructor would: the local sum runs, and the tensors it was given views of
// stay alive until then.
TEST(CommTest, AssigningToAPendingWorkFinishesItFirst) {
  run_thread_world(2, [](Comm& comm) {
    auto out = torch::zeros({5});
    auto w = comm.reduce_scatter_async(out, rank_input(comm.rank(), 10));  // its input: a temporary
    auto summed = torch::ones({3});
    w = comm.all_reduce_async(summed);
    EXPECT_TRUE(out.equal(reference_sum(2, 10).narrow(0, comm.rank() * 5, 5))) << out;
    w.wait();
    EXPECT_TRUE(summed.equal(torch::full({3}, 2.0f))) << summed;
  });
}

TEST(CommTest, BarrierCompletesOnEveryRank) {
  for (int world = 1; world <= kMaxWorld; ++world) {
    std::atomic<int> passed{0};
    run_thread_world(world, [&](Comm& comm) {
      comm.barrier();
      comm.barrier();
      passed.fetch_add(1);
    });
    EXPECT_EQ(passed.load(), world);
  }
}

// --- byte counters -------------------------------------------------------------

TEST(CommTest, ByteCountersFollowBandwidthOptimalFormulas) {
  // N = 4, S = 8 float32 = 32 bytes; all-gather / reduce-scatter chunk 5 floats
  // (20 bytes) so their full size is 80 bytes.
  run_thread_world(4, [](Comm& comm) {
    auto t = torch::ones({8});
    comm.all_reduce(t);                   // 2 * 3/4 * 32 = 48
    comm.broadcast(t, 1);                 // 32 * 3/4 = 24
    comm.reduce(t, 2);                    // 32 * 3/4 = 24
    auto ag = torch::zeros({20});
    comm.all_gather_into(ag, torch::ones({5}));  // 3/4 * 80 = 60
    auto rs = torch::zeros({5});
    comm.reduce_scatter(rs, torch::ones({20}));  // 3/4 * 80 = 60
    comm.all_reduce_async(t).wait();      // 48 more
    comm.barrier();                       // 0

    const auto b = comm.bytes();
    EXPECT_EQ(b[CollectiveKind::kAllReduce], 96);
    EXPECT_EQ(b[CollectiveKind::kBroadcast], 24);
    EXPECT_EQ(b[CollectiveKind::kReduce], 24);
    EXPECT_EQ(b[CollectiveKind::kAllGather], 60);
    EXPECT_EQ(b[CollectiveKind::kReduceScatter], 60);
    EXPECT_EQ(b[CollectiveKind::kBarrier], 0);
    EXPECT_EQ(b.total_sent(), 96 + 24 + 24 + 60 + 60);
    EXPECT_EQ(b.calls[static_cast<int>(CollectiveKind::kAllReduce)], 2);
    EXPECT_EQ(b.calls[static_cast<int>(CollectiveKind::kBarrier)], 1);
    EXPECT_EQ(b.calls[static_cast<int>(CollectiveKind::kReduceScatter)], 1);

    // Copies share the counters; reset clears them for every copy.
    Comm copy = comm;
    copy.all_reduce(t);
    EXPECT_EQ(comm.bytes()[CollectiveKind::kAllReduce], 96 + 48);
    comm.reset_bytes();
    EXPECT_EQ(copy.bytes().total_sent(), 0);
    EXPECT_EQ(copy.bytes().calls[static_cast<int>(CollectiveKind::kAllReduce)], 0);
  });
}

TEST(CommTest, ByteCountersForThreeRanks) {
  // N = 3, S = 12 float64 = 96 bytes: all-reduce 2*2/3*96 = 128; broadcast 64;
  // all-gather of 4 doubles (full 96 bytes): 64.
  run_thread_world(3, [](Comm& comm) {
    auto t = torch::ones({12}, torch::kFloat64);
    comm.all_reduce(t);
    comm.broadcast(t, 0);
    auto ag = torch::zeros({12}, torch::kFloat64);
    comm.all_gather_into(ag, torch::ones({4}, torch::kFloat64));
    const auto b = comm.bytes();
    EXPECT_EQ(b[CollectiveKind::kAllReduce], 128);
    EXPECT_EQ(b[CollectiveKind::kBroadcast], 64);
    EXPECT_EQ(b[CollectiveKind::kAllGather], 64);
  });
}

TEST(CommTest, CollectiveNamesAreStable) {
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kAllReduce), "all_reduce");
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kBroadcast), "broadcast");
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kReduce), "reduce");
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kAllGather), "all_gather");
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kBarrier), "barrier");
  EXPECT_STREQ(strata::collective_name(CollectiveKind::kSend), "send");
}

// --- argument checks --------------------------------------------------------------

TEST(CommTest, MismatchedArgumentsThrowWithTheValues) {
  // Every rank makes the same mistake, so every rank throws before any
  // communication and nobody waits on a collective.
  run_thread_world(2, [](Comm& comm) {
    auto out = torch::zeros({9});
    auto msg = what_of([&] { comm.all_gather_into(out, torch::zeros({5})); });
    EXPECT_NE(msg.find("output numel 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world size 2"), std::string::npos) << msg;

    auto rs = torch::zeros({5});
    msg = what_of([&] { comm.reduce_scatter(rs, torch::zeros({11})); });
    EXPECT_NE(msg.find("input numel 11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("output numel 5"), std::string::npos) << msg;

    auto dbl = torch::zeros({10}, torch::kFloat64);
    msg = what_of([&] { comm.all_gather_into(dbl, torch::zeros({5})); });
    EXPECT_NE(msg.find("Double"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Float"), std::string::npos) << msg;

    auto strided = torch::zeros({4, 4}).t();
    msg = what_of([&] { comm.all_reduce(strided); });
    EXPECT_NE(msg.find("contiguous"), std::string::npos) << msg;
    EXPECT_NE(msg.find("strides [1, 4]"), std::string::npos) << msg;

    auto t = torch::zeros({3});
    msg = what_of([&] { comm.reduce(t, 2); });
    EXPECT_NE(msg.find("root 2"), std::string::npos) << msg;

    EXPECT_EQ(comm.bytes().total_sent(), 0);  // nothing was sent or counted
    comm.barrier();  // and the world is still usable
  });
}

// --- failure handling --------------------------------------------------------------

TEST(CommTest, ThreadWorldRethrowsAndDoesNotHangWhenARankThrows) {
  const auto start = std::chrono::steady_clock::now();
  const auto msg = what_of([] {
    run_thread_world(
        2,
        [](Comm& comm) {
          if (comm.rank() == 1) throw std::runtime_error("rank 1 gave up");
          auto t = torch::ones({7});
          comm.all_reduce(t);  // its peer is gone: must fail, not hang
        },
        std::chrono::seconds(3));
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_NE(msg, "<no exception>");
  EXPECT_LT(elapsed, std::chrono::seconds(9));
}

}  // namespace
