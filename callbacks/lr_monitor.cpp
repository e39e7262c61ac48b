#include "strata/callbacks/lr_monitor.h"

#include "strata/trainer/trainer.h"

namespace strata {

LrMonitor::LrMonitor(LrMonitorOptions options) : options_(std::move(options)) {}

void LrMonitor::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                   const StepMetrics& metrics) {
  const torch::optim::Optimizer* optimizer = trainer.optimizer();
  if (optimizer == nullptr) return;
  for (const auto& [key, value] : learning_rates(*optimizer, options_.prefix())) trainer.log(key, value);
}

LogRow learning_rates(const torch::optim::Optimizer& optimizer, const std::string& prefix) {
  const auto& groups = optimizer.param_groups();
  if (groups.empty()) return {};
  // get_lr() is virtual on OptimizerOptions (SGD, Adam, AdamW, ... override it).
  const double first = groups.front().options().get_lr();
  LogRow row{{prefix + "lr", first}};
  bool differ = false;
  for (const auto& group : groups) differ = differ || group.options().get_lr() != first;
  if (differ) {
    for (size_t i = 0; i < groups.size(); ++i)
      row.emplace_back(prefix + "lr-group" + std::to_string(i), groups[i].options().get_lr());
  }
  return row;
}

}  // namespace strata
