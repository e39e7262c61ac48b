// lr_schedule_test - Unit tests for trainer/lr_schedule.cpp
#include "strata/trainer/lr_schedule.h"

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

namespace {
using strata::LrScheduleOptions;
using strata::WarmupCosineSchedule;

TEST(WarmupCosineScheduleTest, WarmsUpLinearlyThenDecaysToMinLr) {
  WarmupCosineSchedule s(LrScheduleOptions(1.0).warmup_steps(4).decay_steps(14).min_lr(0.1));
  EXPECT_DOUBLE_EQ(s(0), 0.2);
  EXPECT_DOUBLE_EQ(s(3), 0.8);
  EXPECT_DOUBLE_EQ(s(4), 1.0);                    // cosine starts at the peak
  EXPECT_NEAR(s(9), 0.1 + 0.5 * 0.9, 1e-12);      // half way: midpoint
  EXPECT_DOUBLE_EQ(s(14), 0.1);
  EXPECT_DOUBLE_EQ(s(1000), 0.1);
  for (int64_t k = 5; k < 14; ++k) EXPECT_LT(s(k), s(k - 1)) << "step " << k;
}

TEST(WarmupCosineScheduleTest, RejectsBadOptions) {
  EXPECT_THROW(WarmupCosineSchedule(LrScheduleOptions(0.0)), c10::Error);
  EXPECT_THROW(WarmupCosineSchedule(LrScheduleOptions(1.0).min_lr(2.0)), c10::Error);
  EXPECT_THROW(WarmupCosineSchedule(LrScheduleOptions(1.0).warmup_steps(-1)), c10::Error);
}
}  // namespace
