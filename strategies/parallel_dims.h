#pragma once
// The mesh of every parallel dimension, as torchtitan's ParallelDims: pipeline
// stages outermost, then data parallelism (replicate, then shard: hybrid
// FSDP's two levels), context parallelism (a place for it; size 1 today) and
// tensor parallelism innermost. So a tensor-parallel group is consecutive
// ranks (inside a node, with --nproc a multiple of tp) and pipeline stages
// are the furthest apart (across nodes).
//
//   rank = (((pp_i · R + r_i) · S + s_i) · C + c_i) · T + t_i
//
// Example (8 ranks, pp 2, tp 2: data-parallel shard 2):
//   auto mesh = strata::ParallelDims::of(8, ParallelSizes().pp(2).tp(2));
//   mesh.groups({Dim::tp})                        // {0,1} {2,3} {4,5} {6,7}
//   mesh.groups({Dim::dp_replicate, Dim::dp_shard})  // {0,2} {1,3} {4,6} {5,7}
//   mesh.groups({Dim::pp})                        // {0,4} {1,5} {2,6} {3,7}
#include <torch/arg.h>

#include <string>
#include <vector>

namespace strata {

enum class Dim { pp, dp_replicate, dp_shard, cp, tp };

/// The sizes given; the data-parallel shard size is what the world leaves.
struct ParallelSizes {
  TORCH_ARG(int, pp) = 1;
  TORCH_ARG(int, dp_replicate) = 1;
  TORCH_ARG(int, cp) = 1;
  TORCH_ARG(int, tp) = 1;
};

class ParallelDims {
 public:
  /// The mesh of `world` ranks; c10::ValueError naming every size and the
  /// world unless each is >= 1 and their product divides the world.
  static ParallelDims of(int world, const ParallelSizes& sizes);

  int world() const { return world_; }
  int size(Dim d) const { return sizes_[int(d)]; }
  /// Rank `rank`'s index along `d`.
  int coord(int rank, Dim d) const;
  /// The groups of ranks that differ only along `dims` (each in rank order),
  /// ordered by the other dimensions' indices, outer first: Comm::split's groups.
  std::vector<std::vector<int>> groups(const std::vector<Dim>& dims) const;
  /// "pp 2 x dp 1x2 x cp 1 x tp 2".
  std::string describe() const;

 private:
  int world_ = 1;
  int sizes_[5] = {1, 1, 1, 1, 1};
};

}  // namespace strata
