#include "strata/trainer/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace strata {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options) : options_(options) {
  const auto& o = options_;
  TORCH_CHECK_VALUE(o.loss_scale() >= 0.0 && std::isfinite(o.loss_scale()),
                    "loss_scale must be >= 0 (0: dynamic), got ", o.loss_scale());
  TORCH_CHECK_VALUE(o.initial_scale_power() >= 0 && o.initial_scale_power() <= 63,
                    "initial_scale_power must be in [0, 63], got ", o.initial_scale_power());
  TORCH_CHECK_VALUE(o.loss_scale_window() >= 1, "loss_scale_window must be >= 1, got ", o.loss_scale_window());
  TORCH_CHECK_VALUE(o.hysteresis() >= 1, "hysteresis must be >= 1, got ", o.hysteresis());
  TORCH_CHECK_VALUE(o.min_loss_scale() > 0.0 && std::isfinite(o.min_loss_scale()),
                    "min_loss_scale must be > 0, got ", o.min_loss_scale());
  scale_ = dynamic() ? std::ldexp(1.0, static_cast<int>(o.initial_scale_power())) : o.loss_scale();
  TORCH_CHECK_VALUE(!dynamic() || scale_ >= o.min_loss_scale(), "the initial loss scale 2^",
                    o.initial_scale_power(), " = ", scale_, " is below min_loss_scale ", o.min_loss_scale());
  hysteresis_left_ = o.hysteresis();
}

bool DynamicLossScaler::update(bool overflow, int64_t step) {
  if (overflow) ++skipped_;
  if (!dynamic()) return overflow;  // a static scale only skips
  if (overflow) {
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;  // tolerated: skip without lowering the scale
    } else {
      TORCH_CHECK(scale_ > options_.min_loss_scale(), "step ", step,
                  ": fp16 gradients overflowed (inf/NaN) at the minimum loss scale ", scale_,
                  " (min_loss_scale); they are not finite even unscaled: lower the learning rate, or train with "
                  "--precision bf16-mixed or 32");
      scale_ = std::max(scale_ / 2.0, options_.min_loss_scale());
    }
    last_overflow_ = iteration_;
  } else {
    if (options_.consecutive_hysteresis()) hysteresis_left_ = options_.hysteresis();
    if ((iteration_ - last_overflow_) % options_.loss_scale_window() == 0) {
      hysteresis_left_ = options_.hysteresis();
      scale_ *= 2.0;
    }
  }
  ++iteration_;
  return overflow;
}

std::string DynamicLossScaler::state_dict() const {
  std::ostringstream out;
  out.precision(17);
  out << "scale=" << scale_ << " iteration=" << iteration_ << " last_overflow=" << last_overflow_
      << " hysteresis_left=" << hysteresis_left_ << " skipped=" << skipped_;
  return out.str();
}

std::string DynamicLossScaler::load_state_dict(const std::string& text, const std::string& where) {
  std::istringstream in(text);
  double scale = 0.0;
  int64_t iteration = -1, last_overflow = -2, hysteresis_left = 0, skipped = -1;
  char sep = 0;
  auto field = [&](const char* name, auto& value) {
    std::string key;
    return static_cast<bool>(std::getline(in >> std::ws, key, '=')) && key == name && static_cast<bool>(in >> value);
  };
  const bool ok = field("scale", scale) && field("iteration", iteration) && field("last_overflow", last_overflow) &&
                  field("hysteresis_left", hysteresis_left) && field("skipped", skipped) && !(in >> sep);
  TORCH_CHECK(ok && scale > 0.0 && iteration >= 0 && last_overflow >= -1 && hysteresis_left >= 1 && skipped >= 0,
              where, ": loss scaler state '", text, "' is not one DynamicLossScaler::state_dict() writes");
  iteration_ = iteration;
  last_overflow_ = last_overflow;
  skipped_ = skipped;
  // This run's options win where they bound the saved state.
  std::ostringstream note;
  hysteresis_left_ = std::min(hysteresis_left, options_.hysteresis());
  if (!dynamic()) {
    if (scale != scale_) note << "the saved loss scale " << scale << " is replaced by this run's static " << scale_;
    return note.str();
  }
  scale_ = std::max(scale, options_.min_loss_scale());
  if (scale_ != scale) note << "the saved loss scale " << scale << " is below min_loss_scale: it restarts at " << scale_;
  return note.str();
}

}  // namespace strata
