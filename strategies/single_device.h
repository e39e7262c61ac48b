#pragma once
// SingleDeviceStrategy ("single"): one process, nothing sharded, nothing
// communicated. Every base-class default is already right for it.
#include "strategies/strategy.h"

namespace strata {

class SingleDeviceStrategy : public Strategy {
 public:
  explicit SingleDeviceStrategy(Comm comm = Comm());
  std::string name() const override { return "single"; }
};

}  // namespace strata
