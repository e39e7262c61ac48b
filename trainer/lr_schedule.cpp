#include "strata/trainer/lr_schedule.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace strata {

WarmupCosineSchedule::WarmupCosineSchedule(LrScheduleOptions options) : options_(options) {
  TORCH_CHECK_VALUE(options_.lr() > 0, "learning rate must be > 0 (got ", options_.lr(), ")");
  TORCH_CHECK_VALUE(options_.min_lr() >= 0 && options_.min_lr() <= options_.lr(),
                    "min_lr must be in [0, lr=", options_.lr(), "] (got ", options_.min_lr(), ")");
  TORCH_CHECK_VALUE(options_.warmup_steps() >= 0, "warmup_steps must be >= 0 (got ",
                    options_.warmup_steps(), ")");
  TORCH_CHECK_VALUE(options_.decay_steps() >= 1, "decay_steps must be >= 1 (got ",
                    options_.decay_steps(), ")");
}

double WarmupCosineSchedule::operator()(int64_t step) const {
  const auto& o = options_;
  if (step < o.warmup_steps()) {
    return o.lr() * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps() + 1);
  }
  if (step >= o.decay_steps()) return o.min_lr();
  const int64_t span = o.decay_steps() - o.warmup_steps();
  if (span <= 0) return o.min_lr();
  const double progress = static_cast<double>(step - o.warmup_steps()) / static_cast<double>(span);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.min_lr() + coeff * (o.lr() - o.min_lr());
}

}  // namespace strata
