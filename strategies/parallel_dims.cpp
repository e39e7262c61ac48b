#include "strata/strategies/parallel_dims.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>

namespace strata {

ParallelDims ParallelDims::of(int world, const ParallelSizes& s) {
  const int given = s.pp() * s.dp_replicate() * s.cp() * s.tp();
  TORCH_CHECK_VALUE(world >= 1 && s.pp() >= 1 && s.dp_replicate() >= 1 && s.cp() >= 1 && s.tp() >= 1 &&
                        world % given == 0,
                    "the mesh pipeline ", s.pp(), " x data-replicate ", s.dp_replicate(), " x context ", s.cp(),
                    " x tensor ", s.tp(), " = ", given, " does not divide the world size ", world,
                    " (each size >= 1; the data-parallel shard size is world / their product)");
  ParallelDims m;
  m.world_ = world;
  m.sizes_[int(Dim::pp)] = s.pp();
  m.sizes_[int(Dim::dp_replicate)] = s.dp_replicate();
  m.sizes_[int(Dim::dp_shard)] = world / given;
  m.sizes_[int(Dim::cp)] = s.cp();
  m.sizes_[int(Dim::tp)] = s.tp();
  return m;
}

int ParallelDims::coord(int rank, Dim d) const {
  // Dimensions inner to `d` (later in the enum) stride below it.
  int stride = 1;
  for (int i = int(Dim::tp); i > int(d); --i) stride *= sizes_[i];
  return (rank / stride) % sizes_[int(d)];
}

std::vector<std::vector<int>> ParallelDims::groups(const std::vector<Dim>& dims) const {
  // Key: the indices along the other dimensions, outer first.
  std::map<std::vector<int>, std::vector<int>> by_key;
  for (int r = 0; r < world_; ++r) {
    std::vector<int> key;
    for (int d = int(Dim::pp); d <= int(Dim::tp); ++d)
      if (std::find(dims.begin(), dims.end(), Dim(d)) == dims.end()) key.push_back(coord(r, Dim(d)));
    by_key[key].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [key, ranks] : by_key) out.push_back(std::move(ranks));
  return out;
}

std::string ParallelDims::describe() const {
  return c10::str("pp ", size(Dim::pp), " x dp ", size(Dim::dp_replicate), "x", size(Dim::dp_shard), " x cp ",
                  size(Dim::cp), " x tp ", size(Dim::tp));
}

}  // namespace strata
