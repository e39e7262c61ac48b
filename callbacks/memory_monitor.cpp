#include "strata/callbacks/memory_monitor.h"

#include "strata/trainer/memory.h"
#include "strata/trainer/trainer.h"

#include <algorithm>

namespace strata {
namespace {

double to_mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

}  // namespace

MemoryMonitor::MemoryMonitor(MemoryMonitorOptions options) : options_(std::move(options)) {}

void MemoryMonitor::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                       const StepMetrics& metrics) {
  for (const auto& [key, value] : sample(trainer.memory())) trainer.log(key, value);
}

void MemoryMonitor::on_before_optimizer_step(Trainer& trainer, TrainingModule& module,
                                             torch::optim::Optimizer& optimizer) {
  grad_bytes_ = std::max(grad_bytes_, trainer.strategy().model_state_bytes(optimizer).grads);
}

void MemoryMonitor::on_fit_end(Trainer& trainer, TrainingModule& module) {
  const torch::optim::Optimizer* optimizer = trainer.optimizer();
  if (optimizer == nullptr) return;
  model_state_ = trainer.strategy().model_state_bytes(*optimizer);
  model_state_->grads = std::max(model_state_->grads, grad_bytes_);
}

LogRow MemoryMonitor::sample(const MemoryTracker* memory) {
  LogRow row;
  if (memory != nullptr) {
    peak_tensor_bytes_ = std::max(peak_tensor_bytes_, memory->peak_bytes());
    if (options_.log_tensor_memory()) {
      row.emplace_back("mem_current_mib", to_mib(memory->current_bytes()));
      row.emplace_back("mem_peak_mib", to_mib(memory->peak_bytes()));
    }
  }
  peak_rss_bytes_ = std::max(peak_rss_bytes_, strata::peak_rss_bytes());
  if (options_.log_rss()) row.emplace_back("rss_peak_mib", to_mib(peak_rss_bytes_));
  return row;
}

std::string MemoryMonitor::summary() const {
  std::string out;
  if (model_state_) {
    out += "model state: params " + format_bytes(model_state_->params) + " + grads " +
           format_bytes(model_state_->grads) + " + optimizer " + format_bytes(model_state_->optimizer) +
           " = " + format_bytes(model_state_->total()) + "; ";
  }
  out += "peak tensors " + format_bytes(peak_tensor_bytes_) + "; peak RSS " + format_bytes(peak_rss_bytes_);
  return out;
}

}  // namespace strata
