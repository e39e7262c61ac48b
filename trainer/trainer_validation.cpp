// The Trainer's scoring of held-out data: validation during fit() (a
// bounded number of batches spread over the held-out set) and evaluate()
// (all of it, each sample once), both summed over ranks.
#include "strata/trainer/trainer.h"

#include "strata/core/precision.h"

#include <algorithm>

namespace strata {

ValidationMetrics Trainer::validate(TrainingModule& module, const DataSource& data) {
  const int64_t per_batch = options_.batch_size() * strategy_->world_size();
  const int64_t available = (data.num_val_samples() + per_batch - 1) / per_batch;
  return score(module, data, std::min(options_.limit_val_batches(), available));
}

ValidationMetrics Trainer::evaluate(TrainingModule& module, const DataSource& data) {
  module_ = &module;
  setup(module);
  strategy_->comm().set_flight_phase("resume");
  // The weights at its step (any step: nothing trains); its data position is not used.
  if (!options_.resume_from().empty()) load_resume_state();
  strategy_->comm().set_flight_phase("evaluate");
  const int64_t per_batch = options_.batch_size() * strategy_->world_size();
  return score(module, data, (data.num_val_samples() + per_batch - 1) / per_batch);
}

ValidationMetrics Trainer::score(TrainingModule& module, const DataSource& data, int64_t batches) {
  torch::NoGradGuard no_grad;
  module.module().eval();
  const ShardInfo shard{strategy_->rank(), strategy_->world_size()};
  const int64_t per_batch = options_.batch_size() * strategy_->world_size();
  // What is used spreads over the whole held-out set (DataSource::spread_val_batch).
  const int64_t used = batches * per_batch;
  const int64_t count = data.num_val_samples();
  double loss_sum = 0.0, tokens = 0.0, correct = 0.0, samples = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch batch = data.spread_val_batch(i, options_.batch_size(), shard, used);
    // A last batch past the held-out set wraps to its first samples: those
    // rows score nothing, so each sample counts once.
    const int64_t first = (i * shard.world_size + shard.rank) * options_.batch_size();
    // (Such a row counts as neither a sample nor a correct one.)
    const int64_t rows = batch.target.size(0), repeated = std::clamp<int64_t>(first + rows - count, 0, rows);
    if (repeated > 0) {
      batch.target = batch.target.clone();
      batch.target.narrow(0, rows - repeated, repeated).fill_(-1);
    }
    ValidationStep out;
    {
      AutocastGuard autocast(options_.precision(), strategy_->device().type());
      out = strategy_->step_runner().validation_step(*strategy_, module, to_device(std::move(batch), strategy_->device()));
    }
    loss_sum += out.loss_sum;
    tokens += static_cast<double>(out.tokens);
    correct += static_cast<double>(out.correct_samples - repeated);
    samples += static_cast<double>(out.samples - repeated);
  }
  // On the device: the comm's collectives work there (NCCL: CUDA tensors only).
  auto totals = torch::tensor({loss_sum, tokens, correct, samples}, torch::kFloat64).to(strategy_->device());
  // Sync point: every rank scored a disjoint shard of the held-out set; the
  // metrics (and decisions based on them, like early stopping) use the total.
  strategy_->comm().all_reduce(totals);
  totals = totals.cpu();
  module.module().train();
  ValidationMetrics metrics;
  metrics.step = step_;
  metrics.loss = totals[0].item<double>() / std::max(1.0, totals[1].item<double>());
  metrics.samples = static_cast<int64_t>(totals[3].item<double>());
  metrics.tokens = static_cast<int64_t>(totals[1].item<double>());
  if (data.has_accuracy()) {
    metrics.accuracy = totals[2].item<double>() / std::max(1.0, totals[3].item<double>());
  }
  return metrics;
}

}  // namespace strata
