#include "core/precision.h"

#include <ATen/autocast_mode.h>

namespace strata {

Precision parse_precision(const std::string& text) {
  if (text == "32" || text == "32-true" || text == "fp32") return Precision::kFp32;
  if (text == "bf16-mixed" || text == "bf16") return Precision::kBf16Mixed;
  TORCH_CHECK_VALUE(false, "unknown precision '", text,
                    "'; allowed: 32, 32-true, fp32, bf16-mixed, bf16");
}

std::string to_string(Precision precision) {
  return precision == Precision::kFp32 ? "32" : "bf16-mixed";
}

AutocastGuard::AutocastGuard(Precision precision, c10::DeviceType device) {
  if (precision != Precision::kBf16Mixed) return;
  TORCH_CHECK_VALUE(device == c10::kCPU || device == c10::kCUDA, "bf16-mixed autocast supports cpu and cuda, not ",
                    device);
  active_ = true;
  device_ = device;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The outermost guard drops the cached bf16 copies of the weights: they are
  // only valid until the optimizer changes the fp32 masters.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

}  // namespace strata
