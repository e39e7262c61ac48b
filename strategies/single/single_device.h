#pragma once
// SingleDeviceStrategy ("single"): one process, nothing sharded, nothing
// communicated. Every base-class default is already right for it.
#include "strata/strategies/spec.h"
#include "strata/strategies/strategy.h"

namespace strata {

class SingleDeviceStrategy : public Strategy {
 public:
  explicit SingleDeviceStrategy(Comm comm = Comm());
  std::string name() const override { return "single"; }
};

/// How "single" registers (strategies/spec.h): one process, no options;
/// --offload keeps the optimizer state in the tier.
StrategySpec single_device_spec();

}  // namespace strata
