#pragma once
// The 2D mesh of data × tensor parallelism (torchtitan's ParallelDims), validated:
// world = dp × tp, tensor-parallel ranks innermost, so that a TP group is
// consecutive ranks (one machine's, with --nproc a multiple of tp: TP inside
// a node, data parallelism across nodes).
//
//   rank r: tp_rank = r % tp, dp_rank = r / tp
//   TP group of dp_rank d: ranks d·tp … d·tp + tp − 1
//   DP group of tp_rank t: ranks t, t + tp, t + 2·tp, …
//
// Example (4 ranks, tp 2):
//   auto mesh = strata::tp::MeshDims::of(/*world=*/4, /*tp=*/2);
//   Comm tp_comm = world.split("tp", mesh.tp_groups());  // {0,1} {2,3}
//   Comm dp_comm = world.split("dp", mesh.dp_groups());  // {0,2} {1,3}
#include <cstdint>
#include <string>
#include <vector>

namespace strata::tp {

struct MeshDims {
  int world = 1;
  int dp = 1;
  int tp = 1;

  /// The mesh of `world` ranks with tensor-parallel size `tp`; throws a
  /// c10::ValueError naming both unless tp >= 1 divides world.
  static MeshDims of(int world, int tp);

  int tp_rank(int rank) const { return rank % tp; }
  int dp_rank(int rank) const { return rank / tp; }

  /// Every TP group (consecutive ranks), in dp-rank order: Comm::split's groups.
  std::vector<std::vector<int>> tp_groups() const;
  /// Every DP group (ranks tp apart), in tp-rank order.
  std::vector<std::vector<int>> dp_groups() const;
};

}  // namespace strata::tp
