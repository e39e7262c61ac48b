#pragma once
// tp::Parallel: what a tensor-parallel model's forward calls at the plan's
// boundaries (plan.h), Megatron-LM's parallel layers as functions. A
// default-constructed Parallel is off: every call is the plain op, so one
// forward serves both.
//
// Without sequence parallelism activations between the parallel layers are
// whole on every rank: column() reads them through copy_to_tp (backward sums
// the input gradient over ranks) and row() ends with an all-reduce. With it
// (Megatron's sequence parallelism), activations outside the parallel layers
// are split along the sequence (dim 1): column() all-gathers them first and
// row() reduce-scatters its sum, so LayerNorm, dropout and the residual adds
// run on 1/T of the tokens and the bytes sent stay the same.
//
// Example (a Megatron MLP):
//   auto h = torch::gelu(tp.column(x, fc->weight, fc->bias));   // [B, S, 4C/T]
//   return tp.row(h, proj->weight, proj->bias);                   // [B, S, C] (S/T with SP)
#include "strata/core/training_module.h"
#include "strata/strategies/comm.h"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace strata::tp {

/// While alive, the default generator of `device` draws this rank's own
/// stream (Megatron's model-parallel RNG region, without a tracker to keep):
/// its seed mixes the generator's state on entry, the same on every rank,
/// with `rank`. On exit the generator gets its state back and advances by one
/// draw, so the next region differs. It keeps no state of its own: a
/// recompute (activation checkpointing restores the default generators)
/// draws the same masks, and checkpoints need nothing more.
class RankRandomScope {
 public:
  RankRandomScope(const torch::Device& device, int rank);
  ~RankRandomScope();
  RankRandomScope(const RankRandomScope&) = delete;
  RankRandomScope& operator=(const RankRandomScope&) = delete;

 private:
  at::Generator generator_;
  torch::Tensor saved_;
  torch::Device device_;
};

/// Elements [begin, end) of a block of `n` that rank `rank` of `size` holds:
/// [rank·n/size, (rank+1)·n/size), so uneven splits differ by one at most.
std::pair<int64_t, int64_t> split_range(int64_t n, int rank, int size);

class Parallel {
 public:
  /// Off: a world of one, every call the plain op.
  Parallel() = default;
  /// Over `group` (this rank's tensor-parallel ranks).
  Parallel(Comm group, bool sequence_parallel);

  bool on() const { return group_.size() > 1; }
  int size() const { return group_.size(); }
  int rank() const { return group_.rank(); }
  bool sequence_parallel() const { return on() && sequence_parallel_; }
  const Comm& group() const { return group_; }

  /// This rank's share of `n` equal parts (heads): n / size(); n must divide.
  int64_t local(int64_t n) const;

  /// Column-parallel Linear: `x` whole (sequence parallel: this rank's part
  /// of dim 1, gathered first) times this rank's weight rows, plus its bias
  /// part: this rank's output features.
  torch::Tensor column(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const;
  /// The whole input column-parallel Linears read, made once for all of
  /// those that share `x` (a Llama's q, k and v; its gate and up): one
  /// crossing instead of one per Linear. column(x, w, b) is
  /// torch::linear(column_input(x), w, b).
  torch::Tensor column_input(const torch::Tensor& x) const;

  /// Row-parallel Linear: `x` this rank's input features times its weight
  /// columns, summed over ranks (sequence parallel: reduce-scattered along
  /// dim 1), plus the whole bias.
  torch::Tensor row(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const;

  /// Vocabulary-parallel lookup: `idx` whole, `weight` this rank's rows
  /// split_range(vocab) of the table; each rank looks up the ids it holds
  /// (zeros elsewhere) and the sum over ranks is every id's row, whole
  /// (sequence parallel: this rank's part of dim 1).
  torch::Tensor embedding(const torch::Tensor& idx, const torch::Tensor& weight, int64_t vocab) const;

  /// A replicated parameter used on activations split along the sequence:
  /// its gradient then covers only this rank's tokens, so it is summed over
  /// ranks in backward (copy_to_tp) and stays the same on every rank.
  /// Without sequence parallelism the parameter itself.
  torch::Tensor replicated(const torch::Tensor& param) const;

  /// A replicated parameter used on values the ranks hold different parts
  /// of, such as a per-head norm over this rank's heads (Qwen3's q/k norms):
  /// its gradient is this rank's share, summed over the group in backward
  /// (copy_to_tp), with or without sequence parallelism. Off: the parameter.
  torch::Tensor replicated_on_parts(const torch::Tensor& param) const;

  /// This rank's part of dim 1 under sequence parallelism, else `x`.
  torch::Tensor sequence_part(const torch::Tensor& x) const;

  /// Dropout on values that differ across the group (a rank's heads; under
  /// sequence parallelism its tokens) must not draw the same masks on every
  /// rank: hold the result around it. Empty (the shared stream, nothing
  /// drawn) when off or when `draws` is false (no dropout, or evaluation).
  /// Dropout on values every rank holds alike stays outside, so its masks
  /// agree.
  std::optional<RankRandomScope> rank_random(bool draws) const;

 private:
  Comm group_;
  bool sequence_parallel_ = false;
};

/// Next-token cross-entropy, the mean over scored positions (target -1 is
/// ignored), of logits split along the vocabulary: `logits` [..., V_r] are
/// this rank's columns split_range(vocab) of the whole, `target` whole. The
/// whole logits are never gathered: each rank sends three numbers per
/// position (its max, its sum of exponentials, its target logit). Computed in
/// fp32; its gradient is the softmax minus the one-hot on each rank's
/// columns, with no communication in backward.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           const Parallel& parallel, int64_t vocab);

/// Validation sums (core/training_module.h) from vocabulary-split logits:
/// the summed loss, and exact-match samples by the argmax over the whole
/// vocabulary (ties to the lowest id, as torch's argmax).
ValidationStep vocab_parallel_validation(const torch::Tensor& logits, const Batch& batch, const Parallel& parallel,
                                         int64_t vocab);

}  // namespace strata::tp
