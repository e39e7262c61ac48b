#include "strata/strategies/step_runner.h"

#include "strata/strategies/strategy.h"

#include <chrono>

namespace strata {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
}  // namespace

ValidationStep StepRunner::validation_step(Strategy& strategy, TrainingModule& module, const Batch& batch) {
  return strategy.validation_step(module, batch);
}

std::vector<double> SequentialSteps::forward_backward(Strategy& strategy, TrainingModule& module,
                                                      const std::vector<Batch>& batches, const StepContext& context,
                                                      MicroBatchTimes& times) {
  const Comm& comm = strategy.comm();
  const auto& hooks = context.hooks;
  auto phase = [&hooks](const char* what) {
    if (hooks.phase) hooks.phase(what);
  };
  const auto count = static_cast<int64_t>(batches.size());
  std::vector<double> losses;
  for (int64_t micro = 0; micro < count; ++micro) {
    // Gradients of all but the last micro-batch only accumulate locally.
    std::optional<NoSyncGuard> no_sync;
    if (micro + 1 < count) no_sync.emplace(strategy.no_sync());
    phase("forward");
    const auto forward_start = Clock::now();
    const double forward_wait = comm.wait_seconds();
    torch::Tensor loss;
    {
      AutocastGuard autocast(context.precision, strategy.device().type());
      loss = strategy.training_step(module, batches[size_t(micro)]);
    }
    times.forward_s += seconds_since(forward_start) - (comm.wait_seconds() - forward_wait);
    // The dry run's losses are meta tensors: no value.
    losses.push_back(loss.is_meta() ? 0.0 : loss.item<double>());
    if (hooks.before_backward) hooks.before_backward(loss);
    phase("backward");
    const auto backward_start = Clock::now();
    const double backward_wait = comm.wait_seconds();
    strategy.backward(loss * (context.loss_scale / static_cast<double>(count)));
    const double wall = seconds_since(backward_start);
    times.backward_s += wall;
    times.backward_compute_s += wall - (comm.wait_seconds() - backward_wait);
    if (hooks.after_backward) hooks.after_backward();
  }
  return losses;
}

}  // namespace strata
