// parallel_dims_test - the mesh of every dimension (strategies/parallel_dims.h):
// the order of the dimensions (tensor innermost, pipeline outermost), the
// groups each dimension gives, and the one-line error for sizes that do not
// divide the world.
#include "strata/strategies/parallel_dims.h"
#include "strata/strategies/tp/mesh.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

namespace {

using strata::Dim;
using strata::ParallelDims;
using strata::ParallelSizes;
using Groups = std::vector<std::vector<int>>;

TEST(ParallelDimsTest, TensorInnermostPipelineOutermost) {
  const auto mesh = ParallelDims::of(8, ParallelSizes().pp(2).tp(2));
  EXPECT_EQ(mesh.size(Dim::dp_shard), 2);
  EXPECT_EQ(mesh.describe(), "pp 2 x dp 1x2 x cp 1 x tp 2");
  EXPECT_EQ(mesh.groups({Dim::tp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.groups({Dim::dp_replicate, Dim::dp_shard}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.groups({Dim::pp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // A stage's ranks: every data and tensor rank of one pipeline index.
  EXPECT_EQ(mesh.groups({Dim::dp_shard, Dim::tp}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(mesh.coord(r, Dim::pp) * 4 + mesh.coord(r, Dim::dp_shard) * 2 + mesh.coord(r, Dim::tp), r);
  }
}

TEST(ParallelDimsTest, HybridDataParallelismReplicatesOutsideTheShards) {
  // 8 ranks, replicate 2 x shard 4: hybrid FSDP's shard groups are consecutive.
  const auto mesh = ParallelDims::of(8, ParallelSizes().dp_replicate(2));
  EXPECT_EQ(mesh.groups({Dim::dp_shard}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.groups({Dim::dp_replicate}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(ParallelDimsTest, TheTensorParallelMeshIsItsTwoDimensionalCase) {
  const auto tp = strata::tp::MeshDims::of(8, 2);
  const auto mesh = ParallelDims::of(8, ParallelSizes().tp(2));
  EXPECT_EQ(tp.tp_groups(), mesh.groups({Dim::tp}));
  EXPECT_EQ(tp.dp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(ParallelDimsTest, SizesThatDoNotDivideTheWorldAreOneLine) {
  try {
    ParallelDims::of(8, ParallelSizes().pp(3).tp(2));
    FAIL() << "pp 3 x tp 2 accepted on 8 ranks";
  } catch (const c10::ValueError& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "the mesh pipeline 3 x data-replicate 1 x context 1 x tensor 2 = 6 does not divide the world size 8 "
              "(each size >= 1; the data-parallel shard size is world / their product)");
  }
  EXPECT_THROW(ParallelDims::of(8, ParallelSizes().tp(0)), c10::ValueError);
}

}  // namespace
