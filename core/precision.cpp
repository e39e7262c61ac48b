#include "strata/core/precision.h"

#include <ATen/autocast_mode.h>

namespace strata {

Precision parse_precision(const std::string& text) {
  if (text == "32" || text == "32-true" || text == "fp32") return Precision::kFp32;
  if (text == "bf16-mixed" || text == "bf16") return Precision::kBf16Mixed;
  if (text == "16-mixed" || text == "fp16-mixed" || text == "fp16") return Precision::kFp16Mixed;
  TORCH_CHECK_VALUE(false, "unknown precision '", text,
                    "'; allowed: 32, 32-true, fp32, bf16-mixed, bf16, 16-mixed, fp16-mixed, fp16");
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "32";
    case Precision::kBf16Mixed: return "bf16-mixed";
    case Precision::kFp16Mixed: return "16-mixed";
  }
  return "?";
}

std::optional<at::ScalarType> compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return std::nullopt;
    case Precision::kBf16Mixed: return at::kBFloat16;
    case Precision::kFp16Mixed: return at::kHalf;
  }
  return std::nullopt;
}

AutocastGuard::AutocastGuard(Precision precision, c10::DeviceType device) {
  const auto dtype = compute_dtype(precision);
  if (!dtype) return;
  TORCH_CHECK_VALUE(device == c10::kCPU || device == c10::kCUDA, to_string(precision),
                    " autocast supports cpu and cuda, not ", device);
  active_ = true;
  device_ = device;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The outermost guard drops the cached low-precision copies of the weights:
  // they are only valid until the optimizer changes the fp32 masters.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

}  // namespace strata
