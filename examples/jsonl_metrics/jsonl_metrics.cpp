#include "jsonl_metrics.h"

#include <strata/trainer/trainer.h>

#include <cmath>
#include <cstdio>

namespace jsonl {

void JsonlMetrics::on_fit_start(strata::Trainer& trainer, strata::TrainingModule&) {
  if (!trainer.strategy().is_global_zero()) return;  // every hook runs on every rank
  out_.open(path_, std::ios::app);
  TORCH_CHECK_VALUE(out_.good(), "JsonlMetrics: cannot write '", path_, "'");
}

void JsonlMetrics::on_log(strata::Trainer& trainer, int64_t step, const strata::LogRow& row) {
  if (!out_.is_open()) return;
  out_ << "{\"step\": " << step;
  for (const auto& [key, value] : row) {
    char number[32];
    // JSON has no NaN or infinity: null stands for them.
    if (std::isfinite(value)) std::snprintf(number, sizeof(number), "%.9g", value);
    out_ << ", \"" << key << "\": " << (std::isfinite(value) ? number : "null");
  }
  out_ << "}" << std::endl;  // flushed: a crash keeps every line written
}

}  // namespace jsonl
