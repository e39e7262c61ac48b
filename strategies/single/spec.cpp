// The "single" strategy as strata describes it (strategies/spec.h).
#include "strata/strategies/single/single_device.h"

namespace strata {

StrategySpec single_device_spec() {
  return StrategySpec("single", "nothing sharded, nothing communicated")
      .max_world_size(1)
      .tensor_parallel(true)
      .factory([](Comm comm, const StrategyArgs&, const StrategyContext& context) {
        return offload_optimizer_state_as_asked(std::make_unique<SingleDeviceStrategy>(std::move(comm)), context);
      })
      .check(optimizer_offload_problem)
      .memory([](const MemoryQuery& query) {
        auto m = replicated_memory(query);
        // zero_grad sets gradients to none: the activation peak at the start
        // of backward meets none (the distributed strategies keep buffers).
        m->grads_freed_between_steps = true;
        return m;
      })
      .communication([](const MemoryQuery&) { return std::optional<CommEstimate>(CommEstimate{}); })
      .plan({{.label = "single", .speed_rank = 0},
             {.label = "single+ac", .speed_rank = 5, .activation_checkpointing = 1},
             // Pure tensor parallelism: one data-parallel rank, the model split over the world.
             {.label = "single", .speed_rank = 55, .tensor_parallel = true},
             {.label = "single+ac", .speed_rank = 58, .activation_checkpointing = 1, .tensor_parallel = true}})
      .bench({{.tag = "bf16", .precision = "bf16-mixed", .about = "bf16-mixed against fp32"}})
      .pytorch_peer("local")
      .accelerate_types({"NO"});
}

}  // namespace strata
