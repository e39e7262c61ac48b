#include "strata/strategies/tp/mesh.h"

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
  std::vector<std::vector<int>> groups(dp);
  for (int r = 0; r < world; ++r) groups[dp_rank(r)].push_back(r);
  return groups;
}

std::vector<std::vector<int>> MeshDims::dp_groups() const {
  std::vector<std::vector<int>> groups(tp);
  for (int r = 0; r < world; ++r) groups[tp_rank(r)].push_back(r);
  return groups;
}

std::string MeshDims::gpt_problem(int64_t n_head, int64_t n_embd) const {
  if (n_head % tp != 0) {
    return c10::str("tensor-parallel size ", tp, " must divide n_head ", n_head, ": each rank computes whole heads");
  }
  if ((4 * n_embd) % tp != 0) {
    return c10::str("tensor-parallel size ", tp, " must divide the MLP's width 4 x n_embd = ", 4 * n_embd);
  }
  return "";
}

}  // namespace strata::tp
