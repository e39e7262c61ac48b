// The NCCL timeout switch in core/cuda_support: the part of NCCL group
// creation that needs no GPU to check. (Its call site, create_nccl_group, is
// compiled against the CUDA headers by the cuda_support_compiles test.)
#include "core/cuda_support.h"
#include "tests/scoped_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace {
using strata::testing::ScopedEnv;

TEST(NcclTimeoutTest, AsyncErrorHandlingIsSwitchedOnUnlessTheUserChose) {
  {
    ScopedEnv async("NCCL_ASYNC_ERROR_HANDLING", nullptr);
    ScopedEnv blocking("NCCL_BLOCKING_WAIT", nullptr);
    EXPECT_TRUE(strata::enable_nccl_timeouts());
    ASSERT_NE(std::getenv("NCCL_ASYNC_ERROR_HANDLING"), nullptr);
    EXPECT_STREQ(std::getenv("NCCL_ASYNC_ERROR_HANDLING"), "1");
    EXPECT_FALSE(strata::enable_nccl_timeouts());  // set now: left alone
  }
  {
    ScopedEnv async("NCCL_ASYNC_ERROR_HANDLING", "0");  // the user's choice, even "off"
    ScopedEnv blocking("NCCL_BLOCKING_WAIT", nullptr);
    EXPECT_FALSE(strata::enable_nccl_timeouts());
    EXPECT_STREQ(std::getenv("NCCL_ASYNC_ERROR_HANDLING"), "0");
  }
  {
    ScopedEnv async("NCCL_ASYNC_ERROR_HANDLING", nullptr);
    ScopedEnv blocking("NCCL_BLOCKING_WAIT", "1");
    EXPECT_FALSE(strata::enable_nccl_timeouts());
    EXPECT_EQ(std::getenv("NCCL_ASYNC_ERROR_HANDLING"), nullptr);
  }
}

}  // namespace
