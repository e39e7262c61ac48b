#pragma once
// The process groups FSDP communicates over, per sharding strategy.
//
// Every strategy is "shard over one group, replicate over another":
//  - full_shard, shard_grad_op: shard over the world; no replication;
//  - no_shard: no sharding; the full gradient is all-reduced over the world;
//  - hybrid_shard (torch's HYBRID_SHARD): shard inside a node, replicate
//    across nodes. A node is node_size consecutive global ranks (LOCAL_WORLD_SIZE
//    under a launcher). The shard group is this rank's node; the replicate
//    group is the ranks with this rank's local index on every node. Parameters
//    are all-gathered and gradients reduce-scattered inside the node only;
//    each shard gradient is then all-reduced across nodes.
// hybrid_shard with one node (node_size == world) is full_shard, with nodes of
// one rank (node_size == 1) it is no_shard; both are accepted and make no
// subgroup.
#include "strata/strategies/comm.h"
#include "strata/strategies/fsdp/options.h"

namespace strata {

struct FsdpGroups {
  Comm shard;      ///< all-gathers parameters, reduce-scatters gradients
  Comm replicate;  ///< all-reduces what the shard group reduced (size 1: nothing)
};

/// One-line error naming both values unless node_size >= 1 divides world_size.
void check_hybrid_node_size(int node_size, int world_size);

/// The groups for `options` on `world`. hybrid_shard with 1 < node_size <
/// world splits `world` (collective: every rank calls this at the same point).
FsdpGroups make_fsdp_groups(const Comm& world, const FSDPOptions& options);

}  // namespace strata
