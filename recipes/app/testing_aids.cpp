#include "strata/recipes/app/testing_aids.h"

#include "strata/trainer/trainer.h"

namespace strata::recipes {

void FailAtStep::on_train_batch_start(Trainer& trainer, TrainingModule&, int64_t step) {
  TORCH_CHECK(!(step == step_ && trainer.strategy().rank() == rank_), "injected failure at step ", step, " on rank ",
              rank_, " (STRATA_TEST_FAIL_AT_STEP)");
}

void OverflowAtStep::on_before_backward(Trainer& trainer, TrainingModule&, const torch::Tensor& loss) {
  const auto& strategy = trainer.strategy();
  if (trainer.global_step() + 1 != step_ || strategy.rank() != strategy.world_size() - 1) return;
  loss.register_hook([](const torch::Tensor& grad) { return grad * 1e6; });
}

}  // namespace strata::recipes
