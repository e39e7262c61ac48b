#include "strata/callbacks/early_stopping.h"

#include "strata/trainer/trainer.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace strata {
namespace {

std::string format(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  return buf;
}

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  TORCH_CHECK(options_.monitor() == "val_loss" || options_.monitor() == "val_accuracy",
              "EarlyStopping: monitor must be \"val_loss\" or \"val_accuracy\", got \"",
              options_.monitor(), "\"");
  TORCH_CHECK(options_.patience() >= 1, "EarlyStopping: patience must be >= 1, got ",
              options_.patience());
  TORCH_CHECK(options_.min_delta() >= 0.0 && std::isfinite(options_.min_delta()),
              "EarlyStopping: min_delta must be finite and >= 0, got ", options_.min_delta());
}

void EarlyStopping::on_fit_start(Trainer& trainer, TrainingModule& module) {
  best_.reset();
  wait_ = 0;
  reason_.clear();
}

void EarlyStopping::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                       const StepMetrics& metrics) {
  if (options_.check_finite() && !std::isfinite(metrics.loss))
    stop(trainer, "train loss is " + format(metrics.loss) + " at step " + std::to_string(metrics.step));
}

void EarlyStopping::on_validation_end(Trainer& trainer, TrainingModule& module,
                                      const ValidationMetrics& metrics) {
  const std::string& key = options_.monitor();
  const bool want_accuracy = key == "val_accuracy";
  TORCH_CHECK(!want_accuracy || metrics.accuracy.has_value(),
              "EarlyStopping: monitor \"val_accuracy\" but the validation at step ", metrics.step,
              " reported no accuracy (the data does not define one)");
  const double value = want_accuracy ? *metrics.accuracy : metrics.loss;
  const std::string at = " at step " + std::to_string(metrics.step);
  if (!std::isfinite(value)) {
    if (options_.check_finite()) stop(trainer, key + " is " + format(value) + at);
    return;
  }
  const bool minimize = options_.mode() == MonitorMode::kMin;
  const bool improved = !best_ || (minimize ? value < *best_ - options_.min_delta()
                                            : value > *best_ + options_.min_delta());
  if (improved) {
    best_ = value;
    wait_ = 0;
    return;
  }
  if (++wait_ >= options_.patience()) {
    stop(trainer, key + " did not improve by more than " + format(options_.min_delta()) + " in " +
                      std::to_string(wait_) + " validations (best " + format(*best_) + ", last " +
                      format(value) + at + ")");
  }
}

std::string EarlyStopping::state_dict() const {
  char best[64] = "none";
  if (best_) std::snprintf(best, sizeof(best), "%.17g", *best_);  // reads back as the same double
  return std::string("best ") + best + "\nwait " + std::to_string(wait_) + "\n";
}

void EarlyStopping::load_state_dict(const std::string& state) {
  std::istringstream in(state);
  std::string best_key, best, wait_key;
  int64_t wait = -1;
  in >> best_key >> best >> wait_key >> wait;
  TORCH_CHECK(in && best_key == "best" && wait_key == "wait" && wait >= 0,
              "EarlyStopping: saved state '", state, "' is not 'best <value|none> wait <n>'");
  best_.reset();
  if (best != "none") best_ = std::stod(best);
  wait_ = wait;
}

void EarlyStopping::stop(Trainer& trainer, std::string reason) {
  if (stopped()) return;  // keep the first reason
  reason_ = std::move(reason);
  trainer.request_stop(reason_);
}

}  // namespace strata
