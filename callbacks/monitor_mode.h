#pragma once
// MonitorMode: whether a monitored metric improves downwards or upwards
// (EarlyStopping, ModelCheckpoint's best-k).
namespace strata {

enum class MonitorMode { kMin, kMax };

/// True when `value` is better than `than` in `mode` (strictly).
inline bool better(MonitorMode mode, double value, double than) {
  return mode == MonitorMode::kMin ? value < than : value > than;
}

}  // namespace strata
