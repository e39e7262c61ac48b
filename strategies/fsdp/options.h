#pragma once
// FSDPOptions: how FSDPStrategy shards (torch.distributed.fsdp's knobs that
// strata implements).
#include "strata/strategies/fsdp/wrap.h"
#include "strata/strategies/offload_tier.h"

#include <torch/torch.h>

#include <string>

namespace strata {

enum class ShardingStrategy {
  kFullShard,    ///< params, grads, optimizer state sharded; reshard after forward
  kShardGradOp,  ///< as full_shard, but a unit stays gathered from its forward to its backward
  kNoShard,      ///< nothing sharded; gradients all-reduced (DDP through the FSDP machinery)
  kHybridShard,  ///< full_shard inside a node of node_size ranks, replicated across nodes (hybrid.h)
};

/// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard"; anything else is an error listing them.
ShardingStrategy parse_sharding_strategy(const std::string& name);
std::string to_string(ShardingStrategy strategy);

struct FSDPOptions {
  TORCH_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::kFullShard;
  /// Free a unit's full parameters after its forward (gather them again for
  /// its backward). Unset: the sharding strategy's own choice (full_shard
  /// and hybrid_shard: every unit but the last, which backward starts with,
  /// as torchtitan does; shard_grad_op, no_shard: none). true: every unit,
  /// the last included (FSDP2's reshard_after_forward=True). true contradicts
  /// shard_grad_op and no_shard (an error); full_shard + false behaves as
  /// shard_grad_op (hybrid_shard + false: the same inside each node).
  TORCH_ARG(c10::optional<bool>, reshard_after_forward) = c10::nullopt;
  /// At most two wrap units hold full parameters at once (the running one and
  /// the prefetched one): a prefetch that would exceed that is skipped.
  TORCH_ARG(bool, limit_all_gathers) = true;
  TORCH_ARG(WrapPolicy, wrap_policy) = WrapPolicy::kBlock;
  /// hybrid_shard only: ranks per node (LOCAL_WORLD_SIZE); consecutive global
  /// ranks form a node. Must divide the world size; 0 (unset) is an error
  /// with hybrid_shard.
  TORCH_ARG(int, node_size) = 0;
  /// The unused-parameter rule of ddp/oss/sdp (grad_sync.h): false, a
  /// parameter with no gradient in a step is an error naming it on every
  /// rank; true, it counts as zero, and one that NO rank used is skipped by
  /// the optimizer for that step (as torch skips .grad == None).
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Mixed precision, in the style of torch's MixedPrecision. param_dtype:
  /// the dtype units are all-gathered in (bf16: half the all-gather bytes);
  /// the shards, their gradients and the optimizer stay in the parameters'
  /// dtype (fp32 master weights). Unset: gather in the parameters' dtype.
  TORCH_ARG(c10::optional<torch::ScalarType>, param_dtype) = c10::nullopt;
  /// The dtype gradients are reduce-scattered (all-reduced: no_shard) in;
  /// the result is added to the fp32 shard gradient. Unset: the parameters'
  /// dtype (fp32 reduction even when param_dtype is bf16).
  TORCH_ARG(c10::optional<torch::ScalarType>, reduce_dtype) = c10::nullopt;
  /// Offload (ZeRO-Offload / ZeRO-Infinity): between uses, each unit's shard,
  /// its gradient and the optimizer state live in the tier, and the
  /// optimizer step streams them through a bounded staging buffer. Needs
  /// sharded units (not no_shard, at least 2 ranks per shard group).
  TORCH_ARG(OffloadKind, offload) = OffloadKind::kNone;
  /// disk: the directory holding the (unnamed) offload file; must exist.
  TORCH_ARG(std::string, offload_dir) = "";
  /// Elements per staged chunk of the streamed optimizer step: it holds two
  /// chunks of parameters, gradients and both AdamW moments (8 x 4 bytes per
  /// element with fp32 state: 8 MiB at the default, 1 MiB per transfer).
  TORCH_ARG(int64_t, offload_chunk_numel) = kDefaultOffloadChunkNumel;
};

/// Errors (naming the values) for offload options that cannot work: cpu
/// offload on a non-CUDA device, disk offload without a directory, offload
/// with no_shard or a shard group of one rank (`shard_group_size`).
void check_offload_options(const FSDPOptions& options, const torch::Device& device, int shard_group_size);

/// reshard_after_forward as the options resolve it; errors (naming the
/// values) for contradictory options.
bool resolve_reshard_after_forward(const FSDPOptions& options);

}  // namespace strata
