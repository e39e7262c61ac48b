#pragma once
// Precision: "32" (fp32 everywhere), "bf16-mixed" or "16-mixed" (fp32 master
// weights, gradients and optimizer state; matmuls under autocast in bfloat16
// or float16 on the device that runs them, CPU or CUDA). 16-mixed needs loss
// scaling (trainer/loss_scaler.h): fp16's range is too small for gradients.
#include <torch/torch.h>

#include <optional>
#include <string>

namespace strata {

enum class Precision { kFp32, kBf16Mixed, kFp16Mixed };

/// "32"/"32-true"/"fp32" -> kFp32, "bf16-mixed"/"bf16" -> kBf16Mixed,
/// "16-mixed"/"fp16-mixed"/"fp16" -> kFp16Mixed; anything else is an error
/// naming the allowed values.
Precision parse_precision(const std::string& text);
std::string to_string(Precision precision);

/// The dtype matmuls compute in: bfloat16, float16, or nullopt for fp32.
std::optional<at::ScalarType> compute_dtype(Precision precision);

/// RAII: enables autocast to the precision's compute dtype for `device` (CPU
/// or CUDA) for the forward pass; a no-op under kFp32. Restores the previous
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
