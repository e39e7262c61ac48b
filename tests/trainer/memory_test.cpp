// memory_test - Unit tests for trainer/memory.cpp
#include "strata/trainer/memory.h"

#include "strata/strategies/buffer_pool.h"

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
// ---- BufferPool (strategies/buffer_pool.h) ----

TEST(BufferPoolTest, ReusesAFreedBufferOfTheSameSizeOnly) {
  strata::BufferPool pool(c10::GetCPUAllocator(), /*max_free_per_size=*/4);
  void* first = nullptr;
  {
    auto t = pool.empty(1000, torch::kFloat32);
    EXPECT_EQ(t.numel(), 1000);
    EXPECT_TRUE(t.is_contiguous());
    t.fill_(3.0f);  // usable memory
    first = t.data_ptr();
  }
  EXPECT_EQ(pool.free_bytes(), 4000);
  auto same = pool.empty(1000, torch::kFloat32);
  EXPECT_EQ(same.data_ptr(), first) << "a freed buffer of the same size must be handed out again";
  EXPECT_EQ(pool.free_bytes(), 0);
  auto other = pool.empty(999, torch::kFloat32);  // another size: a new buffer
  EXPECT_NE(other.data_ptr(), first);
  EXPECT_EQ(pool.reused(), 1);
  EXPECT_EQ(pool.allocated(), 2);
}

TEST(BufferPoolTest, KeptBuffersCountAsTrackedMemoryUntilTrimmed) {
  strata::MemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  strata::BufferPool pool(c10::GetCPUAllocator(), /*max_free_per_size=*/2);
  {
    auto a = pool.empty(256, torch::kFloat32);
    auto b = pool.empty(256, torch::kFloat32);
    auto c = pool.empty(256, torch::kFloat32);
    EXPECT_EQ(tracker.current_bytes() - base, 3 * 1024);
  }
  // Two kept (max_free_per_size), the third released: still allocated memory.
  EXPECT_EQ(pool.free_bytes(), 2 * 1024);
  EXPECT_EQ(tracker.current_bytes() - base, 2 * 1024);
  pool.trim_to({{1024, 1}});
  EXPECT_EQ(pool.free_bytes(), 1024);
  EXPECT_EQ(tracker.current_bytes() - base, 1024);
  pool.trim_to({});
  EXPECT_EQ(tracker.current_bytes(), base);
}

TEST(BufferPoolTest, TrimToKeepsPerSizeWhatWasInUse) {
  strata::BufferPool pool(c10::GetCPUAllocator(), 8);
  std::unordered_map<size_t, size_t> at_peak;
  {
    auto a1 = pool.empty(100, torch::kFloat32);
    auto a2 = pool.empty(100, torch::kFloat32);
    auto b1 = pool.empty(50, torch::kFloat32);
    at_peak = pool.in_use();
    EXPECT_EQ(at_peak.at(400), 2u);
    EXPECT_EQ(at_peak.at(200), 1u);
    auto a3 = pool.empty(100, torch::kFloat32);  // after the peak: one more of 400 B
    auto c1 = pool.empty(10, torch::kFloat32);   // a size not in use at the peak
  }
  EXPECT_TRUE(pool.in_use().empty());
  EXPECT_EQ(pool.free_bytes(), 3 * 400 + 200 + 40);
  pool.trim_to(at_peak);  // 2 of 400 B, 1 of 200 B, none of 40 B
  EXPECT_EQ(pool.free_bytes(), 2 * 400 + 200);
  // Buffers in use count toward what is kept.
  auto held = pool.empty(100, torch::kFloat32);
  pool.trim_to(at_peak);
  EXPECT_EQ(pool.free_bytes(), 400 + 200);
}

TEST(BufferPoolTest, BuffersMayOutliveThePool) {
  strata::MemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  torch::Tensor survivor;
  {
    strata::BufferPool pool(c10::GetCPUAllocator(), 4);
    survivor = pool.empty(100, torch::kFloat64);
    auto kept = pool.empty(50, torch::kFloat64);
  }  // the pool releases `kept`; `survivor` is still in use
  EXPECT_EQ(tracker.current_bytes() - base, 800);
  survivor.fill_(1.0);
  survivor = torch::Tensor();  // released to the allocator, not to the gone pool
  EXPECT_EQ(tracker.current_bytes(), base);
}

TEST(BufferPoolTest, BuffersUnderTheMinimumAreNotKept) {
  strata::MemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  strata::BufferPool pool(c10::GetCPUAllocator(), 4, /*min_bytes=*/4096);
  { auto small = pool.empty(1000, torch::kFloat32); }  // 4000 B: straight back to the allocator
  EXPECT_EQ(pool.free_bytes(), 0);
  EXPECT_EQ(tracker.current_bytes(), base);
  { auto large = pool.empty(1024, torch::kFloat32); }  // 4096 B: kept
  EXPECT_EQ(pool.free_bytes(), 4096);
  EXPECT_EQ(pool.allocated(), 1);
}

TEST(BufferPoolTest, ANegativeSizeIsAnError) {
  strata::BufferPool pool(c10::GetCPUAllocator(), 1);
  EXPECT_THROW(pool.empty(-1, torch::kFloat32), c10::Error);
}

}  // namespace

namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(BlockCacheTest, ReusesAFreedBlockOfTheSameSizeAndKeepsTensorBytesExact) {
  auto cache = std::make_shared<strata::BlockCache>();
  strata::MemoryTracker tracker(cache);
  const int64_t base = tracker.current_bytes();
  void* first = nullptr;
  {
    auto a = torch::empty({2 * kMiB / 4}, torch::kFloat32);  // 2 MiB: cached
    first = a.data_ptr();
    EXPECT_EQ(tracker.current_bytes() - base, 2 * kMiB);
  }
  EXPECT_EQ(tracker.current_bytes(), base);  // a cached block is no tensor
  EXPECT_GE(cache->stats().cached_bytes, 2 * kMiB);
  auto b = torch::empty({2 * kMiB / 4}, torch::kFloat32);
  EXPECT_EQ(b.data_ptr(), first);  // the same block, no fresh pages
  EXPECT_EQ(cache->stats().hits, 1);
  EXPECT_EQ(cache->stats().cached_bytes, 0);
  // A small tensor never reaches the cache.
  { auto small = torch::empty({1024}, torch::kFloat32); }
  EXPECT_EQ(cache->stats().cached_bytes, 0);
  EXPECT_EQ(cache->stats().misses, 1);
  // A medium one does (glibc's heap would fault it in afresh, block_cache.h).
  void* medium = nullptr;
  { auto m = torch::empty({256 * 1024 / 4}, torch::kFloat32); medium = m.data_ptr(); }
  EXPECT_GE(cache->stats().cached_bytes, 256 * 1024);
  auto again = torch::empty({256 * 1024 / 4}, torch::kFloat32);
  EXPECT_EQ(again.data_ptr(), medium);
  EXPECT_EQ(cache->stats().hits, 2);
}

TEST(BlockCacheTest, TakesNoBlockMoreThanAnEighthLarger) {
  auto cache = std::make_shared<strata::BlockCache>();
  strata::MemoryTracker tracker(cache);
  { auto big = torch::empty({8 * kMiB / 4}, torch::kFloat32); }
  auto smaller = torch::empty({4 * kMiB / 4}, torch::kFloat32);  // half: a new block
  EXPECT_EQ(cache->stats().hits, 0);
  EXPECT_EQ(cache->stats().misses, 2);
  auto close = torch::empty({(8 * kMiB - 64 * 1024) / 4}, torch::kFloat32);  // within 1/8: reused
  EXPECT_EQ(cache->stats().hits, 1);
}

TEST(BlockCacheTest, TrimFreesWhatAWholeStepDidNotReuse) {
  auto cache = std::make_shared<strata::BlockCache>();
  strata::MemoryTracker tracker(cache);
  { auto once = torch::empty({3 * kMiB / 4}, torch::kFloat32); }  // step 0 only
  for (int step = 0; step < 3; ++step) {
    auto every_step = torch::empty({2 * kMiB / 4}, torch::kFloat32);
    every_step.reset();
    cache->trim();  // end of step
    // The block every step reuses stays; the one-off goes at the end of step 1.
    const int64_t expected = step == 0 ? 5 * kMiB : 2 * kMiB;
    EXPECT_NEAR(static_cast<double>(cache->stats().cached_bytes), static_cast<double>(expected), 1024.0)
        << "after step " << step;
  }
  EXPECT_GE(cache->stats().trimmed_bytes, 3 * kMiB);
  EXPECT_EQ(cache->stats().hits, 2);  // steps 1 and 2 reused step 0's block
}

TEST(BlockCacheTest, TensorsOutliveTrackerAndCache) {
  torch::Tensor survivor;
  {
    auto cache = std::make_shared<strata::BlockCache>();
    strata::MemoryTracker tracker(cache);
    survivor = torch::ones({2 * kMiB / 4}, torch::kFloat32);
  }
  // The allocation holds the cache: freeing it now gives the block back to a
  // cache only it keeps alive, which then frees it.
  EXPECT_EQ(survivor.sum().item<float>(), 2 * kMiB / 4);
  survivor.reset();
}

}  // namespace
