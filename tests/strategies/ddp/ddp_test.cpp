// DDP against single-process training, ranks as threads: AdamW parity
// at world sizes 1-3 (with accumulation and clipping too) and the SGD gradient
// scale check (tests/strategies/data_parallel_harness.h). What the data-parallel
// strategies share is tested in tests/strategies/data_parallel_test.cpp; the
// multi-process parity through the real launcher in tests/strategies/parity_test.cpp.
#include "tests/strategies/data_parallel_harness.h"

namespace {
using namespace strata::testing::data_parallel;

TEST(StrategyParityTest, DdpMatchesSingleProcessAfterTenSteps) {
  for (int world : {1, 2, 3}) expect_parity({"ddp", world, 1, 0.0});
  expect_parity({"ddp", 2, 2, 0.5});
}

TEST(GradientScaleTest, DdpSgdAndGradNormsMatchSingleProcess) { expect_gradient_scale_parity("ddp"); }
}  // namespace
