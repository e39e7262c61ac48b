#pragma once
// Tensor parallelism's four communication operators, differentiable
// (Megatron-LM's mappings; torchtitan's ColwiseParallel / RowwiseParallel /
// SequenceParallel place the same ones). Each is a collective over the
// tensor-parallel group `comm` in forward and its conjugate in backward:
//
//   copy_to_tp            identity          | all-reduce (sum) of the gradient
//   reduce_from_tp        all-reduce (sum)  | identity
//   gather_from_sp        all-gather on dim | reduce-scatter on dim
//   reduce_scatter_to_sp  reduce-scatter    | all-gather on dim
//
// A column-parallel Linear reads copy_to_tp(x) (every rank's input gradient
// is the sum over the ranks' output shards); a row-parallel one ends with
// reduce_from_tp(partial). With sequence parallelism the pair becomes
// gather_from_sp before the column-parallel Linear and reduce_scatter_to_sp
// after the row-parallel one, so LayerNorm and dropout run on 1/T of the
// sequence. A world of one: every operator is the identity.
//
// Example (rank r of T holds W1's rows and W2's columns for its heads):
//   auto h = torch::linear(copy_to_tp(x, tp), w1_shard);       // [B, T, 4C/T]
//   auto y = reduce_from_tp(torch::linear(gelu(h), w2_shard), tp);
#include "strata/strategies/comm.h"

#include <torch/torch.h>

namespace strata::tp {

/// Identity forward; backward all-reduces (sums) the gradient over `comm`.
torch::Tensor copy_to_tp(const torch::Tensor& x, const Comm& comm);

/// Forward all-reduces (sums) `x` over `comm`; backward passes the gradient
/// through.
torch::Tensor reduce_from_tp(const torch::Tensor& x, const Comm& comm);

/// Forward concatenates every rank's `x` along `dim`, rank order (all-gather);
/// backward reduce-scatters the gradient along `dim`: each rank gets the sum
/// over ranks of its own slice.
torch::Tensor gather_from_sp(const torch::Tensor& x, const Comm& comm, int64_t dim);

/// Forward sums `x` over `comm` and keeps this rank's slice of `dim`
/// (reduce-scatter; x.size(dim) must divide by comm.size()); backward
/// all-gathers the gradient along `dim`.
torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, const Comm& comm, int64_t dim);

}  // namespace strata::tp
