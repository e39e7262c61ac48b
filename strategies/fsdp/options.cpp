#include "strata/strategies/fsdp/options.h"

namespace strata {

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (name == "full_shard") return ShardingStrategy::kFullShard;
  if (name == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (name == "no_shard") return ShardingStrategy::kNoShard;
  if (name == "hybrid_shard") return ShardingStrategy::kHybridShard;
  TORCH_CHECK_VALUE(false, "unknown FSDP sharding strategy '", name,
                    "'; available: full_shard, shard_grad_op, no_shard, hybrid_shard");
}

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard: return "full_shard";
    case ShardingStrategy::kShardGradOp: return "shard_grad_op";
    case ShardingStrategy::kNoShard: return "no_shard";
    case ShardingStrategy::kHybridShard: return "hybrid_shard";
  }
  return "unknown";
}

void check_offload_options(const FSDPOptions& options, const torch::Device& device, int shard_group_size) {
  const auto kind = options.offload();
  if (kind == OffloadKind::kNone) return;
  check_offload_kind(kind, options.offload_dir(), device);
  TORCH_CHECK_VALUE(options.sharding_strategy() != ShardingStrategy::kNoShard,
                    "--offload ", to_string(kind), " needs sharded parameters; --sharding-strategy no_shard keeps "
                    "every parameter whole on every rank (use full_shard, shard_grad_op or hybrid_shard)");
  TORCH_CHECK_VALUE(shard_group_size > 1, "--offload ", to_string(kind),
                    " needs sharded parameters: at least 2 ranks per shard group (got ", shard_group_size, ")");
  TORCH_CHECK_VALUE(options.offload_chunk_numel() > 0, "offload_chunk_numel must be > 0 (got ",
                    options.offload_chunk_numel(), ")");
}

bool resolve_reshard_after_forward(const FSDPOptions& options) {
  const auto strategy = options.sharding_strategy();
  // no_shard all-reduces, and Gloo (LibTorch 1.13) cannot sum bf16.
  TORCH_CHECK_VALUE(!(options.reduce_dtype() && strategy == ShardingStrategy::kNoShard),
                    "FSDPOptions: reduce_dtype=", *options.reduce_dtype(), " needs sharded gradients "
                    "(full_shard or shard_grad_op), not sharding_strategy=no_shard");
  const auto& requested = options.reshard_after_forward();
  const bool frees_after_forward =
      strategy == ShardingStrategy::kFullShard || strategy == ShardingStrategy::kHybridShard;
  TORCH_CHECK_VALUE(!(requested && *requested && !frees_after_forward),
                    "FSDPOptions: reshard_after_forward=true contradicts sharding_strategy=",
                    to_string(strategy), " (only full_shard and hybrid_shard free parameters after "
                    "forward; leave reshard_after_forward unset or use full_shard)");
  return requested ? *requested : frees_after_forward;
}

}  // namespace strata
