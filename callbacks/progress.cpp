#include "strata/callbacks/progress.h"

#include "strata/trainer/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace strata {
namespace {

std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, value);
  return buf;
}

/// Losses with 4 decimals, large values (tokens/s, MiB) as integers, the rest
/// with 4 significant digits.
std::string format_value(const std::string& key, double value) {
  if (key.find("loss") != std::string::npos) return format("%.4f", value);
  if (key == "lr" || key.rfind("lr-", 0) == 0) return format("%.2e", value);
  if (std::isfinite(value) && std::fabs(value) >= 1000.0) return format("%.0f", value);
  return format("%.4g", value);
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  }
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options, std::ostream& out)
    : options_(std::move(options)), out_(&out) {
  TORCH_CHECK(options_.refresh_hz() > 0.0, "ProgressBar: refresh_hz must be > 0, got ",
              options_.refresh_hz());
  TORCH_CHECK(options_.bar_width() >= 1, "ProgressBar: bar_width must be >= 1, got ",
              options_.bar_width());
  switch (options_.mode()) {
    case ProgressMode::kPlain: live_ = false; break;
    case ProgressMode::kLive: live_ = true; break;
    case ProgressMode::kAuto: live_ = out_ == &std::cout && isatty(fileno(stdout)) != 0; break;
  }
}

void ProgressBar::on_fit_start(Trainer& trainer, TrainingModule& module) {
  max_steps_ = trainer.options().max_steps();
  steps_seen_ = 0;
  timed_tokens_ = 0;
  timed_seconds_ = 0.0;
  last_draw_ = {};
}

void ProgressBar::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                     const StepMetrics& metrics) {
  if (!trainer.strategy().is_global_zero()) return;
  if (max_steps_ == 0) max_steps_ = trainer.options().max_steps();
  loss_ = metrics.loss;
  lr_ = metrics.lr;
  last_step_seconds_ = metrics.step_seconds;
  if (++steps_seen_ > 1) {  // the first step pays for warm-up: keep it out of rates
    timed_tokens_ += metrics.tokens;
    timed_seconds_ += metrics.step_seconds;
  }
  if (live_) draw_live(metrics.step, metrics.step >= max_steps_);
}

void ProgressBar::on_validation_end(Trainer& trainer, TrainingModule& module,
                                    const ValidationMetrics& metrics) {
  if (!trainer.strategy().is_global_zero()) return;
  end_live_line();
  *out_ << "validation step " << metrics.step << " | val_loss " << format("%.4f", metrics.loss);
  if (metrics.accuracy) *out_ << " | val_accuracy " << format("%.4f", *metrics.accuracy);
  *out_ << '\n' << std::flush;
}

void ProgressBar::on_log(Trainer& trainer, int64_t step, const LogRow& row) {
  if (!trainer.strategy().is_global_zero() || live_) return;
  // Validation values were printed by on_validation_end; a row holding
  // nothing else (the one logged right after a validation) prints no line.
  auto is_val = [](const std::string& key) { return key.rfind("val_", 0) == 0; };
  if (std::all_of(row.begin(), row.end(), [&](const auto& kv) { return is_val(kv.first); })) return;
  std::string line = "step " + std::to_string(step) + "/" + std::to_string(max_steps_);
  auto find = [&row](const std::string& key) -> const double* {
    for (auto it = row.rbegin(); it != row.rend(); ++it)
      if (it->first == key) return &it->second;
    return nullptr;
  };
  if (const double* v = find("loss")) line += " | loss " + format_value("loss", *v);
  if (const double* v = find("lr")) line += " | lr " + format_value("lr", *v);
  const double* tps = find("tokens_per_s");
  const double rate = tps ? *tps : tokens_per_s();
  if (rate > 0.0) line += " | " + format("%.0f", rate) + " tok/s";
  for (size_t i = 0; i < row.size(); ++i) {
    const auto& key = row[i].first;
    if (key == "step" || key == "loss" || key == "lr" || key == "tokens_per_s" || is_val(key)) continue;
    if (find(key) != &row[i].second) continue;  // a key logged twice: print the last value once
    line += " | " + key + " " + format_value(key, row[i].second);
  }
  const std::string remaining = eta(step);
  if (!remaining.empty()) line += " | eta " + remaining;
  *out_ << line << '\n' << std::flush;
}

void ProgressBar::on_fit_end(Trainer& trainer, TrainingModule& module) {
  if (!trainer.strategy().is_global_zero() || !live_) return;
  end_live_line();
}

void ProgressBar::on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) {
  if (trainer.strategy().is_global_zero()) end_live_line();  // the error starts on a fresh line
}

void ProgressBar::draw_live(int64_t step, bool force) {
  const auto now = std::chrono::steady_clock::now();
  const std::chrono::duration<double> since = now - last_draw_;
  if (!force && line_open_ && since.count() < 1.0 / options_.refresh_hz()) return;
  last_draw_ = now;
  const int64_t width = options_.bar_width();
  const double frac = max_steps_ > 0 ? std::clamp(double(step) / double(max_steps_), 0.0, 1.0) : 0.0;
  const auto filled = static_cast<int64_t>(frac * double(width));
  std::string bar(static_cast<size_t>(width), ' ');
  std::fill_n(bar.begin(), filled, '=');
  if (filled < width) bar[static_cast<size_t>(filled)] = '>';
  const int digits = static_cast<int>(std::to_string(max_steps_).size());
  char head[96];
  std::snprintf(head, sizeof(head), "step %*lld/%lld [", digits, static_cast<long long>(step),
                static_cast<long long>(max_steps_));
  std::string line = head + bar + "] " + format("%3.0f", frac * 100.0) + "%";
  line += " | loss " + format("%.4f", loss_) + " | lr " + format("%.2e", lr_);
  if (tokens_per_s() > 0.0) line += " | " + format("%.0f", tokens_per_s()) + " tok/s";
  const std::string remaining = eta(step);
  if (!remaining.empty()) line += " | eta " + remaining;
  const size_t width_now = line.size();
  if (line.size() < last_width_) line.append(last_width_ - line.size(), ' ');  // erase leftovers
  last_width_ = width_now;
  *out_ << '\r' << line << std::flush;
  line_open_ = true;
}

void ProgressBar::end_live_line() {
  if (!line_open_) return;
  *out_ << '\n' << std::flush;
  line_open_ = false;
  last_width_ = 0;
}

double ProgressBar::tokens_per_s() const {
  return timed_seconds_ > 0.0 ? double(timed_tokens_) / timed_seconds_ : 0.0;
}

std::string ProgressBar::eta(int64_t step) const {
  if (steps_seen_ == 0 || max_steps_ <= step) return "";
  const int64_t timed_steps = steps_seen_ - 1;
  const double per_step = timed_steps > 0 ? timed_seconds_ / double(timed_steps) : last_step_seconds_;
  return format_duration(per_step * double(max_steps_ - step));
}

}  // namespace strata
