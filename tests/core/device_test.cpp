// device_test - device choice, placement and the CUDA seam on this build:
// resolve_device / backend_for, Comm and Strategy devices, to_device, the
// CUDA half of AutocastGuard, and cuda_support's CPU-only errors.
#include "strata/core/cuda_support.h"
#include "strata/core/device.h"
#include "strata/core/precision.h"
#include "strata/strategies/process_group.h"
#include "strata/strategies/single/single_device.h"
#include "tests/error_text.h"
#include "strata/trainer/memory.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

namespace {
using strata::testing::what_of;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DeviceTest, ResolvesCpuAutoAndCuda) {
  EXPECT_EQ(strata::resolve_device("cpu", 0), torch::Device(torch::kCPU));
  EXPECT_EQ(strata::resolve_device("cpu", 7), torch::Device(torch::kCPU));  // no GPU per rank needed
  const bool cuda = torch::cuda::is_available();
  EXPECT_EQ(strata::resolve_device("auto", 0), cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU));
  if (cuda) {
    EXPECT_EQ(strata::resolve_device("cuda", 0), torch::Device(torch::kCUDA, 0));
    const int count = static_cast<int>(torch::cuda::device_count());
    const auto msg = what_of([&] { strata::resolve_device("cuda", count); });
    EXPECT_TRUE(contains(msg, "LOCAL_RANK " + std::to_string(count) + " has no CUDA device")) << msg;
  } else {
    const auto msg = what_of([] { strata::resolve_device("cuda", 0); });
    EXPECT_TRUE(contains(msg, "--device cuda: no CUDA device is usable")) << msg;
    EXPECT_TRUE(contains(msg, "--device cpu")) << msg;
  }
  const auto bad = what_of([] { strata::resolve_device("gpu", 0); });
  EXPECT_TRUE(contains(bad, "unknown device 'gpu'; allowed: auto, cpu, cuda")) << bad;
  EXPECT_TRUE(contains(what_of([] { strata::resolve_device("cpu", -1); }), "LOCAL_RANK -1"));
}

TEST(DeviceTest, BackendFollowsTheDevice) {
  EXPECT_EQ(strata::backend_for(torch::Device(torch::kCPU)), "gloo");
  EXPECT_EQ(strata::backend_for(torch::Device(torch::kCUDA, 1)), "nccl");
}

TEST(DeviceTest, StrategyTrainsOnItsCommsDevice) {
  EXPECT_EQ(strata::Comm().device(), torch::Device(torch::kCPU));
  // A device that needs no hardware: the Comm only carries it.
  strata::Comm meta(torch::Device(torch::kMeta));
  EXPECT_EQ(meta.device(), torch::Device(torch::kMeta));
  strata::SingleDeviceStrategy strategy(meta);
  EXPECT_EQ(strategy.device(), torch::Device(torch::kMeta));
}

TEST(DeviceTest, ToDeviceMovesBothTensorsAndKeepsThemWhenAlreadyThere) {
  strata::Batch batch{torch::arange(6).view({2, 3}), torch::arange(6).view({2, 3}) - 1};
  auto same = strata::to_device(batch, torch::Device(torch::kCPU));
  EXPECT_TRUE(same.input.is_same(batch.input));
  EXPECT_TRUE(same.target.is_same(batch.target));
  auto moved = strata::to_device(batch, torch::Device(torch::kMeta));
  EXPECT_EQ(moved.input.device(), torch::Device(torch::kMeta));
  EXPECT_EQ(moved.target.device(), torch::Device(torch::kMeta));
  EXPECT_EQ(moved.input.sizes(), batch.input.sizes());
}

TEST(DeviceTest, CudaAutocastGuardSetsAndRestoresTheCudaFlags) {
  // ATen keeps CUDA autocast state even in CPU-only builds, so the guard's
  // CUDA branch is checkable here; CPU autocast must stay untouched.
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  const auto before = at::autocast::get_autocast_dtype(at::kCUDA);
  {
    strata::AutocastGuard guard(strata::Precision::kBf16Mixed, c10::kCUDA);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCUDA));
    EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCUDA), at::kBFloat16);
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCUDA), before);
  const auto msg = what_of([] { strata::AutocastGuard guard(strata::Precision::kBf16Mixed, c10::kMeta); });
  EXPECT_TRUE(contains(msg, "supports cpu and cuda")) << msg;
}

TEST(DeviceTest, CudaSeamSaysWhyOnACpuOnlyBuild) {
  if (strata::built_with_cuda()) GTEST_SKIP() << "LibTorch has CUDA here: the CPU-only errors do not apply";
  EXPECT_FALSE(torch::cuda::is_available());
  for (const auto& msg : {what_of([] { strata::set_cuda_device(0); }),
                          what_of([] { strata::create_nccl_group({}, 0, 1, std::chrono::seconds(1)); }),
                          what_of([] { strata::cuda_allocated_bytes(0); })}) {
    EXPECT_TRUE(contains(msg, "needs LibTorch with CUDA; this build's LibTorch is CPU-only")) << msg;
  }
  strata::MemoryTracker memory;
  EXPECT_TRUE(contains(what_of([&] { memory.measure_device(torch::Device(torch::kCUDA, 0)); }), "CPU-only"));
  EXPECT_TRUE(contains(what_of([&] { memory.measure_device(torch::Device(torch::kMeta)); }), "allowed: cpu, cuda"));
  const auto msg = what_of([] {
    strata::create_process_group(strata::ProcessGroupOptions(0, 1).backend("nccl"));
  });
  EXPECT_TRUE(contains(msg, "backend 'nccl' needs LibTorch with CUDA")) << msg;
}

TEST(DeviceTest, CudaBuildWithoutAVisibleGpuSaysSo) {
  if (!strata::built_with_cuda()) GTEST_SKIP() << "this LibTorch is CPU-only (CudaSeamSaysWhyOnACpuOnlyBuild covers it)";
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible here: the no-GPU errors do not apply";
  EXPECT_EQ(strata::resolve_device("auto", 0), torch::Device(torch::kCPU));
  auto msg = what_of([] { strata::resolve_device("cuda", 0); });
  EXPECT_TRUE(contains(msg, "--device cuda: no CUDA device is usable (LibTorch built with CUDA: yes, devices visible: 0)"))
      << msg;
  msg = what_of([] { strata::set_cuda_device(0); });
  EXPECT_TRUE(contains(msg, "cuda:0 does not exist: 0 CUDA device(s) visible")) << msg;
}

}  // namespace
