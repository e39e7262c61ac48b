#pragma once
// ParameterRanges: what a TrainingModule whose initial values come from files
// (a transformers directory given as --init-from) may also implement, so
// that a sharding strategy reads each rank's part of each parameter straight
// from the files: FSDP fills its flat shards piece by piece and never
// materialises a unit whole nor broadcasts it, so no rank ever holds more of
// the model than its shards (recipes/models/spec.h's SourcedModule
// implements it; strategies/fsdp asks with dynamic_cast).
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace strata {

class ParameterRanges {
 public:
  virtual ~ParameterRanges() = default;
  /// Whether parameter `name`'s initial value can be read in parts (false:
  /// the module initialises it, e.g. a LoRA adapter no file holds). Every
  /// rank must answer alike: the answer decides which collectives run.
  virtual bool reads_ranges(const std::string& name) const = 0;
  /// Elements [begin, end) of parameter `name`'s initial value, flattened in
  /// row-major order, into `out` (1-D, end - begin elements, any device).
  virtual void read_range(const std::string& name, int64_t begin, int64_t end, const torch::Tensor& out) const = 0;
};

}  // namespace strata
