// OSS against single-process training, ranks as threads: AdamW parity
// at world sizes 1-4 (with accumulation and clipping too) and the SGD gradient
// scale check (tests/strategies/data_parallel_harness.h). What the data-parallel
// strategies share is tested in tests/strategies/data_parallel_test.cpp; the
// multi-process parity through the real launcher in tests/strategies/parity_test.cpp.
#include "tests/strategies/data_parallel_harness.h"

namespace {
using namespace strata::testing::data_parallel;

TEST(StrategyParityTest, OssMatchesSingleProcessAfterTenSteps) {
  for (int world : {1, 2, 3, 4}) expect_parity({"oss", world, 1, 0.0});
  expect_parity({"oss", 3, 2, 0.5});
}

TEST(GradientScaleTest, OssSgdAndGradNormsMatchSingleProcess) { expect_gradient_scale_parity("oss"); }
}  // namespace
