// The NCCL timeout switch in core/cuda_support: the part of NCCL group
// creation that needs no GPU to check.
#include "strata/core/cuda_support.h"
#include "tests/scoped_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {
using strata::testing::ScopedEnv;

/// Unsets every variable the switch looks at for the scope.
struct CleanNcclEnv {
  std::vector<std::unique_ptr<ScopedEnv>> vars;
  CleanNcclEnv() {
    for (const auto& name : strata::nccl_timeout_variables())
      vars.push_back(std::make_unique<ScopedEnv>(name.c_str(), nullptr));
  }
};

TEST(NcclTimeoutTest, AsyncErrorHandlingIsSwitchedOnUnlessTheUserChose) {
  {
    CleanNcclEnv clean;
    EXPECT_TRUE(strata::enable_nccl_timeouts());
    ASSERT_NE(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), nullptr);
    EXPECT_STREQ(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    EXPECT_FALSE(strata::enable_nccl_timeouts());  // set now: left alone
  }
  for (const auto& name : strata::nccl_timeout_variables()) {
    CleanNcclEnv clean;
    ScopedEnv user(name.c_str(), "0");  // the user's choice, even "off", under any name LibTorch reads
    EXPECT_FALSE(strata::enable_nccl_timeouts()) << name;
    EXPECT_STREQ(std::getenv(name.c_str()), "0") << name;
    if (name != "TORCH_NCCL_ASYNC_ERROR_HANDLING") {
      EXPECT_EQ(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), nullptr) << name;
    }
  }
}

TEST(NcclTimeoutTest, NamesAreTheOnesThisLibTorchReads) {
  if (!strata::built_with_cuda()) GTEST_SKIP() << "this LibTorch is CPU-only: ProcessGroupNCCL is not compiled in";
  EXPECT_EQ(strata::nccl_timeout_variables(), strata::nccl_timeout_variables_in_libtorch());
}

}  // namespace
