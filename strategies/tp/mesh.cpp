#include "strata/strategies/tp/mesh.h"

#include "strata/strategies/parallel_dims.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace strata::tp {

MeshDims MeshDims::of(int world, int tp) {
  TORCH_CHECK_VALUE(world >= 1, "tensor-parallel mesh: world size ", world, " must be >= 1");
  TORCH_CHECK_VALUE(tp >= 1 && world % tp == 0, "tensor-parallel size ", tp, " must be >= 1 and divide the world size ",
                    world, " (data-parallel groups of world / tp ranks)");
  MeshDims m;
  m.world = world;
  m.tp = tp;
  m.dp = world / tp;
  return m;
}

std::vector<std::vector<int>> MeshDims::tp_groups() const {
  return ParallelDims::of(world, ParallelSizes().tp(tp)).groups({Dim::tp});
}

std::vector<std::vector<int>> MeshDims::dp_groups() const {
  return ParallelDims::of(world, ParallelSizes().tp(tp)).groups({Dim::dp_replicate, Dim::dp_shard});
}

}  // namespace strata::tp
