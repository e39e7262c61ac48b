#pragma once
// Precision: "32" (fp32 everywhere) or "bf16-mixed" (fp32 master weights,
// gradients and optimizer state; matmuls under autocast in bfloat16 on the
// device that runs them, CPU or CUDA).
#include <torch/torch.h>

#include <string>

namespace strata {

enum class Precision { kFp32, kBf16Mixed };

/// "32"/"32-true"/"fp32" -> kFp32, "bf16-mixed"/"bf16" -> kBf16Mixed; anything
/// else is an error naming the allowed values.
Precision parse_precision(const std::string& text);
std::string to_string(Precision precision);

/// RAII: enables autocast to bfloat16 for `device` (CPU or CUDA) for the
/// forward pass under kBf16Mixed; a no-op under kFp32. Restores the previous
/// state and clears the autocast weight cache on exit, so cast copies of the
/// weights never outlive one forward.
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision precision, c10::DeviceType device = c10::kCPU);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::kCPU;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace strata
