#pragma once
// What tensor parallelism sends per optimizer step, from what a model's
// forward does at its plan's boundaries (parallel.h): the model counts them
// (the GPT: recipes/models/gpt.h, tensor_parallel_boundaries), this turns the
// counts into bytes in CommBytes' conventions (ring all-reduce 2(T-1)/T·S,
// all-gather and reduce-scatter (T-1)/T·S of the whole tensor S). The
// planner adds them to the data-parallel strategy's own (its spec's
// communication model, over its group). Under bf16- and 16-mixed the
// row-parallel products cross in the compute dtype, the column-parallel
// inputs and the embedding's lookup in fp32.
#include "strata/strategies/spec.h"

#include <cstdint>

namespace strata::tp {

/// One micro-batch's boundary crossings, in elements.
struct Boundaries {
  /// Elements of one whole-sequence activation at the boundaries (B·S·C).
  int64_t activation = 0;
  /// Activations summed over the group in forward (row-parallel outputs and
  /// the vocabulary-parallel lookup)...
  int64_t forward_sums = 0;
  /// ...and in backward (the gradients of column-parallel inputs, the head's
  /// included). Under sequence parallelism each forward sum is a
  /// reduce-scatter and its backward an all-gather, each column-parallel
  /// input an all-gather and its gradient a reduce-scatter.
  int64_t backward_sums = 0;
  /// Of forward_sums, those whose values are fp32 whatever the precision (a
  /// lookup in an fp32 table: autocast casts matmul inputs, not embeddings).
  /// The rest cross in the compute dtype (row-parallel products), and
  /// column-parallel inputs in fp32 (LayerNorm outputs under autocast).
  int64_t fp32_forward_sums = 0;
  /// Forward sums that activation checkpointing runs again in backward.
  int64_t recomputed_sums = 0;
  /// Of forward_sums and backward_sums, those through which no gradient
  /// flows back (a frozen model's first layers, under LoRA): their backward
  /// half sends nothing. The forward ones are the fp32 ones first (the
  /// embedding comes first in a forward).
  int64_t forward_sums_without_gradient = 0;
  int64_t backward_sums_without_gradient = 0;
  /// Narrow crossings of the same kinds (LoRA adapters beside split Linears:
  /// r features), of `adapter_activation` elements each (B·S·r).
  int64_t adapter_activation = 0;
  int64_t adapter_forward_sums = 0;
  int64_t adapter_backward_sums = 0;
  int64_t adapter_recomputed_sums = 0;
  /// Under sequence parallelism a recompute also gathers the column
  /// adapters' r features again (without it their region is a copy): as many
  /// as adapter_recomputed_sums where each column adapter has a row partner
  /// (the GPT's pairs), else their own count (a Llama's q, v beside down).
  int64_t adapter_recomputed_gathers = 0;
  /// Positions of a vocabulary-parallel loss: 3 fp32 numbers each (the max,
  /// the sum of exponentials, the target logit), all-reduced.
  int64_t loss_positions = 0;
  /// Sequence parallelism: elements of the replicated parameters used on
  /// split activations, whose fp32 gradients are all-reduced in backward.
  int64_t sequence_parallel_params = 0;
};

/// Activations one rank keeps, relative to an unsplit replica: Megatron's
/// count (Korthikanti et al., 2022, without the attention-score terms,
/// which strata's attention does not keep): per block 34 units of which 24
/// are inside the parallel layers (split) and 10 outside (LayerNorms,
/// dropout, residuals). Under sequence parallelism those 10 split too but
/// for the column-parallel inputs, which strata keeps gathered (4 units;
/// Megatron re-gathers them in backward instead): (4 + 30/T) / 34.
/// Measured on gpt-mini, block 128, batch 16, T = 2: peaks 0.98-1.03x the
/// prediction under single, ddp, oss, sdp and fsdp (1/T alone: 1.09-1.14x).
double activation_scale(int size, bool sequence_parallel);

/// Bytes one rank of a tensor-parallel group of `size` sends per optimizer
/// step of `micro_batches` micro-batches, with `compute_bytes` per element of
/// the compute dtype (4 in fp32, 2 under bf16- or 16-mixed), plus the global
/// norm's one fp64 all-reduce.
CommEstimate communication(const Boundaries& b, int size, bool sequence_parallel, int64_t compute_bytes,
                           int64_t micro_batches);

}  // namespace strata::tp
