// precision_test - Unit tests for strategies/precision.cpp
#include "strata/core/precision.h"

#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>

namespace {
using strata::Precision;

TEST(PrecisionTest, ParsesAliasesAndRejectsUnknown) {
  EXPECT_EQ(strata::parse_precision("32"), Precision::kFp32);
  EXPECT_EQ(strata::parse_precision("bf16"), Precision::kBf16Mixed);
  EXPECT_EQ(strata::parse_precision("bf16-mixed"), Precision::kBf16Mixed);
  EXPECT_EQ(strata::parse_precision("16-mixed"), Precision::kFp16Mixed);
  EXPECT_EQ(strata::parse_precision("fp16"), Precision::kFp16Mixed);
  EXPECT_EQ(strata::to_string(Precision::kFp16Mixed), "16-mixed");
  try {
    strata::parse_precision("fp8");
    FAIL() << "fp8 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("'fp8'"), std::string::npos);
  }
}

TEST(AutocastGuardTest, Bf16MixedRunsMatmulInBf16AndRestores) {
  auto a = torch::randn({8, 8});
  {
    strata::AutocastGuard guard(Precision::kBf16Mixed);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
  {
    strata::AutocastGuard guard(Precision::kFp16Mixed);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kHalf);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  {
    strata::AutocastGuard guard(Precision::kFp32);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
  }
}
}  // namespace
