#pragma once
// BlockCacheTrim: trims a BlockCache (trainer/block_cache.h) at the end of
// every optimizer step, so that it keeps only the blocks the step reuses.
//
// Example (what strata-gpt does):
//   auto cache = std::make_shared<strata::BlockCache>();
//   strata::MemoryTracker memory(cache);
//   callbacks.push_back(std::make_shared<strata::BlockCacheTrim>(cache));
#include "strata/trainer/block_cache.h"
#include "strata/trainer/callback.h"

#include <memory>
#include <string>

namespace strata {

class BlockCacheTrim : public Callback {
 public:
  explicit BlockCacheTrim(std::shared_ptr<BlockCache> cache) : cache_(std::move(cache)) {}
  std::string name() const override { return "BlockCacheTrim"; }
  void on_train_step_end(Trainer&, TrainingModule&, int64_t) override { cache_->trim(); }

 private:
  std::shared_ptr<BlockCache> cache_;
};

}  // namespace strata
