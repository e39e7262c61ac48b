// fsdp_hybrid_test - FSDP hybrid_shard (shard inside a node, replicate across
// nodes) on thread-ranks: Comm::split, parity with single-process training at
// world 4 as 2 nodes of 2, 4 nodes of 1 and 1 node of 4 (with accumulation and
// clipping), the bytes each group carries, and bad node sizes.
#include "tests/strategies/fsdp/fsdp_harness.h"

#include "strata/strategies/fsdp/hybrid.h"

#include <gtest/gtest.h>

namespace {
using strata::CollectiveKind;
using strata::Comm;
using strata::FSDPOptions;
using strata::ShardingStrategy;
using namespace strata::testing;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

TEST(CommSplitTest, SubgroupsReduceOnlyAmongTheirMembersAndShareTheCounters) {
  strata::run_thread_world(4, [](Comm& world) {
    const Comm pairs = world.split("pairs", {{0, 1}, {2, 3}});
    const Comm strided = world.split("strided", {{0, 2}, {1, 3}});
    EXPECT_EQ(pairs.size(), 2);
    EXPECT_EQ(pairs.rank(), world.rank() % 2);
    EXPECT_EQ(strided.rank(), world.rank() / 2);
    auto t = torch::full({2}, static_cast<float>(world.rank()));
    Comm p = pairs;
    p.all_reduce(t);
    const float pair_sum = world.rank() < 2 ? 0 + 1 : 2 + 3;
    EXPECT_TRUE(t.equal(torch::full({2}, pair_sum))) << "rank " << world.rank() << ": " << t;
    auto u = torch::full({2}, static_cast<float>(world.rank()));
    Comm s = strided;
    s.all_reduce(u);
    const float strided_sum = world.rank() % 2 == 0 ? 0 + 2 : 1 + 3;
    EXPECT_TRUE(u.equal(torch::full({2}, strided_sum))) << "rank " << world.rank() << ": " << u;
    // Two ring all-reduces of 8 bytes over 2 ranks: 2 * (2(2-1)/2 * 8), in the world's counters.
    EXPECT_EQ(world.bytes()[CollectiveKind::kAllReduce], 16);
    EXPECT_EQ(world.bytes().calls[static_cast<int>(CollectiveKind::kAllReduce)], 2);
  });
}

TEST(CommSplitTest, BadPartitionsAreErrorsNamingTheRank) {
  Comm one;
  EXPECT_EQ(one.split("self", {{0}}).size(), 1);  // a world of one needs no factory
  EXPECT_NE(message_of([&] { one.split("x", {{0, 1}}); }).find("rank 1 in group 0 is outside the world [0, 1)"),
            std::string::npos);
  EXPECT_NE(message_of([&] { one.split("x", {{}}); }).find("group 0 is empty"), std::string::npos);
  strata::run_thread_world(2, [](Comm& world) {
    EXPECT_NE(message_of([&] { world.split("x", {{0}}); }).find("rank 1 of 2 is in no group"), std::string::npos);
    EXPECT_NE(message_of([&] { world.split("x", {{0, 1}, {1}}); }).find("rank 1 is in more than one group"),
              std::string::npos);
  });
}

/// Six AdamW steps at world 4 with `node_size` ranks per node, against one
/// process on the same global batch: parameters within 1e-5, every step's
/// gradient norm within 1e-5 relative (the norm must count each shard once,
/// not once per node).
std::vector<Trained> expect_hybrid_parity(int node_size, int64_t accum, double clip) {
  SCOPED_TRACE("hybrid_shard node_size=" + std::to_string(node_size) + " accum=" + std::to_string(accum) +
               " clip=" + std::to_string(clip));
  const int world = 4;
  const int64_t per_rank_batch = 2, steps = 6;
  const auto reference = train_single(gpt_nano(), fsdp_test_options(per_rank_batch * world, accum, clip, steps));
  FsdpRun run;
  run.world = world;
  run.options = FSDPOptions().sharding_strategy(ShardingStrategy::kHybridShard).node_size(node_size);
  const auto got = train_fsdp(gpt_nano(), fsdp_test_options(per_rank_batch, accum, clip, steps), run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 1e-5);
  EXPECT_EQ(reference.grad_norms.size(), got[0].grad_norms.size());
  for (size_t s = 0; s < std::min(reference.grad_norms.size(), got[0].grad_norms.size()); ++s) {
    EXPECT_NEAR(got[0].grad_norms[s], reference.grad_norms[s], 1e-5 * reference.grad_norms[s]) << "step " << s + 1;
  }
  return got;
}

TEST(FsdpHybridTest, TwoNodesOfTwoMatchSingleProcessWithAccumulationAndClipping) {
  // Clipping at 0.5 is active (gpt-nano's norm starts above 1).
  expect_hybrid_parity(2, 2, 0.5);
  expect_hybrid_parity(2, 1, 0.0);
}

TEST(FsdpHybridTest, NodesOfOneAndOneNodeOfFourMatchSingleProcess) {
  expect_hybrid_parity(1, 2, 0.5);  // = no_shard: every rank holds everything
  expect_hybrid_parity(4, 2, 0.5);  // = full_shard over the world
}

TEST(FsdpHybridTest, GathersStayInsideTheNodeAndTheReplicateAllReduceCarriesTheShardGradients) {
  const auto options = fsdp_test_options(2, 2, 0.5, 4);
  auto train_with = [&](ShardingStrategy sharding, int world, int node_size) {
    FsdpRun run;
    run.world = world;
    run.options = FSDPOptions().sharding_strategy(sharding).node_size(node_size);
    return train_fsdp(gpt_nano(), options, run)[0].result.comm_bytes;
  };
  const auto hybrid = train_with(ShardingStrategy::kHybridShard, 4, 2);
  const auto full2 = train_with(ShardingStrategy::kFullShard, 2, 0);
  const auto full4 = train_with(ShardingStrategy::kFullShard, 4, 0);
  // The node's all-gathers and reduce-scatters are exactly a 2-rank full_shard's.
  EXPECT_EQ(hybrid[CollectiveKind::kAllGather], full2[CollectiveKind::kAllGather]);
  EXPECT_EQ(hybrid.calls[static_cast<int>(CollectiveKind::kAllGather)],
            full2.calls[static_cast<int>(CollectiveKind::kAllGather)]);
  EXPECT_EQ(hybrid[CollectiveKind::kReduceScatter], full2[CollectiveKind::kReduceScatter]);
  EXPECT_LT(hybrid[CollectiveKind::kAllGather], full4[CollectiveKind::kAllGather]);
  // Beyond the world's own all-reduces (grad norm, logged metrics: as
  // full_shard at 4 ranks), the replicate all-reduce of each shard gradient
  // over 2 nodes sends 2(2-1)/2 = 1 shard per unit per step: the bytes a
  // 2-rank reduce-scatter sends ((2-1) shards).
  const auto extra = hybrid[CollectiveKind::kAllReduce] - full4[CollectiveKind::kAllReduce];
  EXPECT_EQ(extra, full2[CollectiveKind::kReduceScatter]);
  EXPECT_GT(extra, 0);
  std::cout << "[bytes] hybrid 2x2: all_gather " << hybrid[CollectiveKind::kAllGather] << ", reduce_scatter "
            << hybrid[CollectiveKind::kReduceScatter] << ", all_reduce " << hybrid[CollectiveKind::kAllReduce]
            << " (replicate " << extra << "); full_shard x4: all_gather " << full4[CollectiveKind::kAllGather]
            << ", reduce_scatter " << full4[CollectiveKind::kReduceScatter] << std::endl;
}

TEST(FsdpHybridTest, NodeSizeThatDoesNotDivideTheWorldIsAOneLineError) {
  const auto msg = message_of([] { strata::check_hybrid_node_size(3, 4); });
  EXPECT_NE(msg.find("node size (LOCAL_WORLD_SIZE) 3 does not divide WORLD_SIZE 4"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  const auto hybrid = FSDPOptions().sharding_strategy(ShardingStrategy::kHybridShard);
  EXPECT_NE(message_of([&] { strata::FSDPStrategy(Comm(), hybrid); }).find("needs the node size"), std::string::npos);
  EXPECT_NE(message_of([&] { strata::FSDPStrategy(Comm(), FSDPOptions(hybrid).node_size(2)); })
                .find("node size (LOCAL_WORLD_SIZE) 2 does not divide WORLD_SIZE 1"),
            std::string::npos);
  EXPECT_NO_THROW(strata::FSDPStrategy(Comm(), FSDPOptions(hybrid).node_size(1)));
  EXPECT_EQ(strata::parse_sharding_strategy("hybrid_shard"), ShardingStrategy::kHybridShard);
}

}  // namespace
