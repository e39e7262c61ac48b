// loss_scaler_test - DynamicLossScaler's state machine against DeepSpeed's
// documented behaviour (trainer/loss_scaler.h).
#include "strata/trainer/loss_scaler.h"

#include <gtest/gtest.h>

namespace {
using strata::DynamicLossScaler;
using strata::LossScalerOptions;

TEST(LossScalerTest, DefaultsAreDeepSpeeds) {
  DynamicLossScaler scaler;
  EXPECT_TRUE(scaler.dynamic());
  EXPECT_EQ(scaler.scale(), 65536.0);  // 2^initial_scale_power, 16
  EXPECT_EQ(scaler.options().loss_scale_window(), 1000);
  EXPECT_EQ(scaler.options().hysteresis(), 2);
  EXPECT_EQ(scaler.options().min_loss_scale(), 1.0);
  EXPECT_FALSE(scaler.options().consecutive_hysteresis());
}

TEST(LossScalerTest, HysteresisDelaysTheHalvingAndEveryOverflowSkips) {
  DynamicLossScaler scaler(LossScalerOptions().initial_scale_power(10).hysteresis(2));
  EXPECT_TRUE(scaler.update(true, 1));   // tolerated: skipped, scale kept
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_FALSE(scaler.update(false, 2));
  EXPECT_TRUE(scaler.update(true, 3));   // hysteresis spent: halved
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_TRUE(scaler.update(true, 4));   // not restored by the clean step in between: halved again
  EXPECT_EQ(scaler.scale(), 256.0);
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(LossScalerTest, ConsecutiveHysteresisIsRestoredByACleanStep) {
  DynamicLossScaler scaler(LossScalerOptions().initial_scale_power(10).hysteresis(2).consecutive_hysteresis(true));
  scaler.update(true, 1);
  scaler.update(false, 2);
  scaler.update(true, 3);  // tolerated again
  EXPECT_EQ(scaler.scale(), 1024.0);
  scaler.update(true, 4);
  EXPECT_EQ(scaler.scale(), 512.0);
}

TEST(LossScalerTest, TheScaleDoublesAfterAWindowOfCleanSteps) {
  DynamicLossScaler scaler(LossScalerOptions().initial_scale_power(4).loss_scale_window(3).hysteresis(1));
  // From the start: the 3rd clean update doubles.
  scaler.update(false, 1);
  scaler.update(false, 2);
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(false, 3);
  EXPECT_EQ(scaler.scale(), 32.0);
  // After an overflow: 3 clean steps after it.
  scaler.update(true, 4);
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(false, 5);
  scaler.update(false, 6);
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(false, 7);
  EXPECT_EQ(scaler.scale(), 32.0);
}

TEST(LossScalerTest, TheMinimumIsAFloorAndAnOverflowThereIsAnErrorNamingTheStep) {
  DynamicLossScaler scaler(LossScalerOptions().initial_scale_power(2).hysteresis(1).min_loss_scale(2.0));
  scaler.update(true, 1);
  EXPECT_EQ(scaler.scale(), 2.0);
  try {
    scaler.update(true, 7);
    FAIL() << "no error at the minimum scale";
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    EXPECT_NE(text.find("step 7: fp16 gradients overflowed"), std::string::npos) << text;
    EXPECT_NE(text.find("minimum loss scale 2"), std::string::npos) << text;
  }
  // A minimum that is not a power of two is still the floor.
  DynamicLossScaler odd(LossScalerOptions().initial_scale_power(2).hysteresis(1).min_loss_scale(3.0));
  odd.update(true, 1);
  EXPECT_EQ(odd.scale(), 3.0);
}

TEST(LossScalerTest, AStaticScaleOnlySkips) {
  DynamicLossScaler scaler(LossScalerOptions().loss_scale(128.0));
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_TRUE(scaler.update(true, 1));
  for (int i = 0; i < 2000; ++i) scaler.update(false, 2 + i);
  EXPECT_EQ(scaler.scale(), 128.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(LossScalerTest, StateRoundTripsExactly) {
  DynamicLossScaler a(LossScalerOptions().initial_scale_power(8).loss_scale_window(4).hysteresis(2));
  for (bool overflow : {false, true, false, true, false, false}) a.update(overflow, 0);
  DynamicLossScaler b(LossScalerOptions().initial_scale_power(8).loss_scale_window(4).hysteresis(2));
  b.load_state_dict(a.state_dict(), "test");
  EXPECT_EQ(b.state_dict(), a.state_dict());
  // The same future: the same scales and decisions.
  for (bool overflow : {false, false, false, true, true, false}) {
    EXPECT_EQ(a.update(overflow, 0), b.update(overflow, 0));
    EXPECT_EQ(a.scale(), b.scale());
  }
  // This run's options bound what a checkpoint brings.
  DynamicLossScaler floor(LossScalerOptions().initial_scale_power(8).hysteresis(1).min_loss_scale(256));
  EXPECT_NE(floor.load_state_dict("scale=4 iteration=9 last_overflow=3 hysteresis_left=2 skipped=2", "test"), "");
  EXPECT_EQ(floor.scale(), 256.0);
  EXPECT_EQ(floor.state_dict(), "scale=256 iteration=9 last_overflow=3 hysteresis_left=1 skipped=2");
  DynamicLossScaler fixed(LossScalerOptions().loss_scale(64));
  fixed.load_state_dict("scale=4 iteration=9 last_overflow=3 hysteresis_left=2 skipped=2", "test");
  EXPECT_EQ(fixed.scale(), 64.0);
  EXPECT_EQ(fixed.skipped_steps(), 2);
  EXPECT_THROW(b.load_state_dict("scale=abc", "test"), c10::Error);
  EXPECT_THROW(b.load_state_dict(a.state_dict() + " extra=1", "test"), c10::Error);
}

TEST(LossScalerTest, BadOptionsNameTheValue) {
  auto message = [](const LossScalerOptions& o) {
    try {
      DynamicLossScaler scaler(o);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(LossScalerOptions().loss_scale(-1)).find("loss_scale must be >= 0"), std::string::npos);
  EXPECT_NE(message(LossScalerOptions().hysteresis(0)).find("hysteresis must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message(LossScalerOptions().loss_scale_window(0)).find("loss_scale_window must be >= 1"),
            std::string::npos);
  EXPECT_NE(message(LossScalerOptions().initial_scale_power(64)).find("[0, 63], got 64"), std::string::npos);
  EXPECT_NE(message(LossScalerOptions().initial_scale_power(2).min_loss_scale(8)).find("below min_loss_scale 8"),
            std::string::npos);
}

}  // namespace
