#include "strata/strategies/fsdp/hybrid.h"

#include <vector>

namespace strata {

void check_hybrid_node_size(int node_size, int world_size) {
  TORCH_CHECK_VALUE(node_size >= 1, "hybrid_shard needs the node size (LOCAL_WORLD_SIZE, ranks per node); got ",
                    node_size);
  TORCH_CHECK_VALUE(world_size % node_size == 0, "hybrid_shard: node size (LOCAL_WORLD_SIZE) ", node_size,
                    " does not divide WORLD_SIZE ", world_size,
                    "; every node must run the same number of consecutive ranks");
}

FsdpGroups make_fsdp_groups(const Comm& world, const FSDPOptions& options) {
  const Comm one(world.device());
  switch (options.sharding_strategy()) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp: return {world, one};
    case ShardingStrategy::kNoShard: return {one, world};
    case ShardingStrategy::kHybridShard: break;
  }
  const int n = world.size();
  const int local = options.node_size();
  check_hybrid_node_size(local, n);
  if (local == n) return {world, one};  // one node: full_shard
  if (local == 1) return {one, world};  // nodes of one rank: no_shard
  const int nodes = n / local;
  // Node k holds ranks [k*local, (k+1)*local): the shard group.
  std::vector<std::vector<int>> by_node(nodes);
  // Local index i on every node: the replicate group (its rank = node index).
  std::vector<std::vector<int>> by_index(local);
  for (int r = 0; r < n; ++r) {
    by_node[r / local].push_back(r);
    by_index[r % local].push_back(r);
  }
  // Why this order on every rank: each split is collective and blocks until
  // the group's members have connected; all ranks make the shard groups first,
  // then the replicate groups, so no rank waits on a peer busy elsewhere.
  FsdpGroups groups{world.split("hybrid/shard", by_node), world.split("hybrid/replicate", by_index)};
  TORCH_CHECK(groups.shard.rank() == world.rank() % local && groups.replicate.rank() == world.rank() / local,
              "hybrid_shard: rank ", world.rank(), " got shard rank ", groups.shard.rank(), " and replicate rank ",
              groups.replicate.rank(), " for node size ", local);
  return groups;
}

}  // namespace strata
