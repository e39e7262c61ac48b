// The "oss" strategy (ZeRO-1) as strata describes it (strategies/spec.h).
#include "strata/strategies/oss/oss.h"

namespace strata {

std::vector<StrategyOption> shard_options() {
  return {bucket_cap_mb_option().above(0), find_unused_parameters_option()};
}

ShardOptions shard_options_from(const StrategyArgs& args) {
  return ShardOptions()
      .bucket_cap_mb(args.real("bucket-cap-mb"))
      .find_unused_parameters(args.boolean("find-unused-parameters"));
}

std::optional<MemoryEstimate> sharded_optimizer_memory(const MemoryQuery& q, bool shard_grads) {
  const int64_t t = q.model.trainable, shard = ceil_div(t, q.world_size);
  MemoryEstimate m;
  m.params = 4 * q.model.params;
  m.grads = 4 * (shard_grads ? shard : t);
  m.optimizer = q.optimizer_bytes_per_param * shard;
  // Flat staging buffers alive outside the activation phase: 8 bytes per
  // trainable parameter, measured exactly (peak - model state, where
  // activations are small: gpt-mini at block 32, batch 1) for oss and sdp
  // over 2 ranks with 1 and 4 micro-batches, and over a pipeline stage's 2
  // and 4 ranks (a scheduled step holds nothing more). 10 when first
  // calibrated, before Gloo's all-gather wrote straight into its output.
  m.staging = 8 * t;
  return with_optimizer_offload(m, q);
}

std::optional<CommEstimate> sharded_optimizer_comm(const MemoryQuery& q, CollectiveKind gradient_collective) {
  // Gradients to their owners (Ψ), updated parameters from them (Ψ).
  const double n = q.world_size, bytes = 4.0 * double(q.model.trainable);
  CommEstimate c;
  c.bytes[gradient_collective] = (n - 1) / n * bytes;
  c.bytes[CollectiveKind::kAllGather] = (n - 1) / n * bytes;
  return c;
}

StrategySpec oss_spec() {
  return StrategySpec("oss", "ZeRO-1: optimizer state sharded; grads reduce-scattered after backward")
      .aliases({"zero1"})
      .options(shard_options())
      .factory(shard_factory<OSSStrategy>())
      .check(optimizer_offload_problem)
      .tensor_parallel(true)
      .memory([](const MemoryQuery& q) { return sharded_optimizer_memory(q, /*shard_grads=*/false); })
      .communication([](const MemoryQuery& q) { return sharded_optimizer_comm(q, CollectiveKind::kReduceScatter); })
      .plan({{.label = "oss", .speed_rank = 20, .min_world_size = 2}})
      .pytorch_peer("ZeroRedundancyOptimizer")
      .deepspeed_zero_stage(1);
}

}  // namespace strata
