// The "ddp" strategy as strata describes it (strategies/spec.h).
#include "strata/strategies/ddp/ddp.h"

namespace strata {

StrategySpec ddp_spec() {
  return StrategySpec("ddp", "replicated model; bucketed gradient all-reduce overlapped with backward")
      .options({bucket_cap_mb_option().at_least(0), find_unused_parameters_option(),
                StrategyOption::boolean("overlap-comm", true,
                                        "all-reduce each bucket from the gradient hooks, overlapped with backward "
                                        "(false: every bucket after backward)")})
      .factory([](Comm comm, const StrategyArgs& args, const StrategyContext& context) {
        auto ddp = std::make_unique<DDPStrategy>(std::move(comm), DDPOptions()
                                                                      .bucket_cap_mb(args.real("bucket-cap-mb"))
                                                                      .find_unused_parameters(
                                                                          args.boolean("find-unused-parameters"))
                                                                      .overlap_comm(args.boolean("overlap-comm")));
        return offload_optimizer_state_as_asked(std::move(ddp), context);
      })
      .check(optimizer_offload_problem)
      .reference(true)
      .tensor_parallel(true)
      .memory(replicated_memory)
      .communication([](const MemoryQuery& q) {
        // Every gradient once per step (no_sync skips the other micro-batches), ring all-reduce.
        const double n = q.world_size;
        CommEstimate c;
        c.bytes[CollectiveKind::kAllReduce] = 2.0 * (n - 1) / n * 4.0 * double(q.model.trainable);
        return std::optional<CommEstimate>(c);
      })
      .plan({{.label = "ddp", .speed_rank = 10, .min_world_size = 2}})
      .bench({{.tag = "per-grad-after-bw",
               .flags = {"--bucket-cap-mb", "0", "--overlap-comm", "false"},
               .about = "one all-reduce per gradient after backward: what bucketing plus overlap buy"},
              {.tag = "1mib", .flags = {"--bucket-cap-mb", "1"}, .about = "1 MiB buckets (several per model)"},
              {.tag = "1mib-after-bw",
               .flags = {"--bucket-cap-mb", "1", "--overlap-comm", "false"},
               .reference = "1mib",
               .about = "the same buckets after backward: what the overlap alone buys"}})
      .pytorch_peer("DistributedDataParallel")
      .deepspeed_zero_stage(0)
      .accelerate_types({"MULTI_CPU", "MULTI_GPU"});
}

}  // namespace strata
