#include "strata/strategies/single/single_device.h"

namespace strata {

SingleDeviceStrategy::SingleDeviceStrategy(Comm comm) : Strategy(std::move(comm)) {
  TORCH_CHECK(world_size() == 1, "strategy 'single' runs one process, but the world has ",
              world_size(), " ranks; pick a strategy that runs several processes");
}

}  // namespace strata
