// memory_test - Unit tests for trainer/memory.cpp
#include "trainer/memory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

namespace {

TEST(MemoryTrackerTest, PeakEqualsSumOfLiveTensors) {
  strata::MemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  tracker.reset_peak();
  {
    auto a = torch::empty({1000}, torch::kFloat32);   // 4000 B
    auto b = torch::empty({500}, torch::kFloat64);    // 4000 B
    EXPECT_EQ(tracker.current_bytes() - base, 8000);
    {
      auto c = torch::empty({250}, torch::kInt64);    // 2000 B
      EXPECT_EQ(tracker.current_bytes() - base, 10000);
    }
    EXPECT_EQ(tracker.current_bytes() - base, 8000);
    auto view = a.narrow(0, 0, 10);  // a view allocates nothing
    EXPECT_EQ(tracker.current_bytes() - base, 8000);
  }
  EXPECT_EQ(tracker.current_bytes(), base);
  EXPECT_EQ(tracker.peak_bytes() - base, 10000);
}

TEST(MemoryTrackerTest, RestoresPreviousAllocatorOnDestruction) {
  auto* before = c10::GetCPUAllocator();
  {
    strata::MemoryTracker tracker;
    EXPECT_NE(c10::GetCPUAllocator(), before);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
}

TEST(MemoryTrackerTest, TensorsMayOutliveTheTracker) {
  // Tensors allocated under a tracker and freed after it is destroyed. Each
  // round builds a new tracker, whose allocator and counters likely reuse the
  // heap blocks the previous one freed: a release that followed a dangling
  // pointer would corrupt the new tracker's count (or crash).
  std::vector<torch::Tensor> survivors;
  for (int round = 0; round < 8; ++round) {
    strata::MemoryTracker tracker;
    const int64_t base = tracker.current_bytes();
    auto mine = torch::empty({1024}, torch::kFloat32);
    survivors.clear();  // allocated under the previous tracker, freed under this one
    EXPECT_EQ(tracker.current_bytes() - base, 1024 * 4) << "round " << round;
    survivors.push_back(torch::empty({4096}, torch::kFloat32));
    EXPECT_EQ(tracker.current_bytes() - base, (1024 + 4096) * 4) << "round " << round;
  }
  survivors.clear();  // after the last tracker is gone
}

TEST(MemoryTest, FormatsBytesAndReadsRss) {
  EXPECT_EQ(strata::format_bytes(512), "512 B");
  EXPECT_EQ(strata::format_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
  EXPECT_GT(strata::peak_rss_bytes(), 0);
  EXPECT_GE(strata::peak_rss_bytes(), strata::current_rss_bytes());
}
}  // namespace
