#include "strata/strategies/tp/parallel.h"

#include "strata/core/deferred_init.h"
#include "strata/strategies/tp/tp_comm.h"

#include <c10/util/Exception.h>

#include <mutex>

namespace strata::tp {

std::pair<int64_t, int64_t> split_range(int64_t n, int rank, int size) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "split_range: rank ", rank, " of ", size);
  return {n * rank / size, n * (rank + 1) / size};
}

RankRandomScope::RankRandomScope(const torch::Device& device, int rank)
    : generator_(at::globalContext().defaultGenerator(device)), device_(device) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  saved_ = generator_.get_state();
  // FNV-1a over the state's bytes (the same on every rank), then the rank.
  const auto bytes = saved_.contiguous();
  const auto* data = bytes.data_ptr<uint8_t>();
  uint64_t h = 14695981039346656037ULL;
  for (int64_t i = 0; i < bytes.numel(); ++i) h = (h ^ data[i]) * 1099511628211ULL;
  h ^= 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(rank + 1);
  h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ULL;
  generator_.set_current_seed(h ^ (h >> 29));
}

RankRandomScope::~RankRandomScope() {
  {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_);
  }
  // One draw of the shared stream (alike on every rank): the next region's seed differs.
  torch::NoGradGuard no_grad;
  torch::empty({1}, torch::TensorOptions(torch::kLong).device(device_)).random_(generator_);
}

std::optional<RankRandomScope> Parallel::rank_random(bool draws) const {
  // The dry run's meta tensors draw nothing (and meta has no generator).
  if (!on() || !draws || group_.device().is_meta()) return std::nullopt;
  return std::optional<RankRandomScope>(std::in_place, group_.device(), rank());
}

Parallel::Parallel(Comm group, bool sequence_parallel)
    : group_(std::move(group)), sequence_parallel_(sequence_parallel) {}

int64_t Parallel::local(int64_t n) const {
  TORCH_CHECK_VALUE(n % size() == 0, "tensor parallelism: ", n, " does not divide by the tensor-parallel size ",
                    size());
  return n / size();
}

torch::Tensor Parallel::column(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const {
  return torch::linear(column_input(x), weight, bias);
}

torch::Tensor Parallel::column_input(const torch::Tensor& x) const {
  if (!on()) return x;
  // Every rank needs the whole input: under SP it gathers the sequence
  // (backward: reduce-scatter of the input gradient), else copy_to_tp
  // (backward: all-reduce, each rank having the gradient of its features only).
  return sequence_parallel() ? gather_from_sp(x, group_, 1) : copy_to_tp(x, group_);
}

torch::Tensor Parallel::row(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const {
  if (!on()) return torch::linear(x, weight, bias);
  const torch::Tensor partial = torch::linear(x, weight);
  // Each rank's product is a partial sum over its input features.
  torch::Tensor out = sequence_parallel() ? reduce_scatter_to_sp(partial, group_, 1) : reduce_from_tp(partial, group_);
  // The bias once, after the sum; in the product's dtype (autocast: bf16),
  // as the unsplit Linear's addmm adds it.
  return bias.defined() ? out + replicated(bias).to(out.scalar_type()) : out;
}

torch::Tensor Parallel::embedding(const torch::Tensor& idx, const torch::Tensor& weight, int64_t vocab) const {
  if (!on()) return torch::embedding(weight, idx);
  const auto [lo, hi] = split_range(vocab, rank(), size());
  TORCH_CHECK(weight.size(0) == hi - lo, "vocab-parallel embedding: rank ", rank(), " holds ", weight.size(0),
              " rows, expected ", hi - lo, " (rows ", lo, "..", hi, " of ", vocab, ")");
  const auto mine = idx.ge(lo).logical_and(idx.lt(hi));
  const auto local_idx = torch::where(mine, idx - lo, torch::zeros_like(idx));
  const auto rows = torch::embedding(weight, local_idx) * mine.unsqueeze(-1).to(weight.scalar_type());
  // Each id's row lives on exactly one rank: the sum over ranks is the lookup.
  return sequence_parallel() ? reduce_scatter_to_sp(rows, group_, 1) : reduce_from_tp(rows, group_);
}

torch::Tensor Parallel::replicated(const torch::Tensor& param) const {
  return sequence_parallel() ? copy_to_tp(param, group_) : param;
}

torch::Tensor Parallel::replicated_on_parts(const torch::Tensor& param) const {
  // Why a sum: each rank's gradient covers only its heads' values.
  return on() ? copy_to_tp(param, group_) : param;
}

torch::Tensor Parallel::sequence_part(const torch::Tensor& x) const {
  if (!sequence_parallel()) return x;
  TORCH_CHECK_VALUE(x.size(1) % size() == 0, "sequence parallelism: sequence length ", x.size(1),
                    " does not divide by the tensor-parallel size ", size());
  const int64_t part = x.size(1) / size();
  return x.narrow(1, rank() * part, part);
}

namespace {

/// Per position: log Σ_v exp(l_v) − l_target over the whole vocabulary.
struct ParallelLogits {
  torch::Tensor loss;    ///< [N], 0 where the target is ignored
  torch::Tensor scored;  ///< [N] bool
  torch::Tensor logits;  ///< this rank's logits, [N, V_r] in fp32
};

ParallelLogits parallel_losses(const torch::Tensor& logits_any, const torch::Tensor& target_any,
                               const Parallel& p, int64_t vocab) {
  const auto logits = logits_any.reshape({-1, logits_any.size(-1)}).to(torch::kFloat32);
  const auto target = target_any.reshape({-1});
  const auto [lo, hi] = split_range(vocab, p.rank(), p.size());
  TORCH_CHECK(logits.size(1) == hi - lo, "vocab-parallel cross-entropy: rank ", p.rank(), " has ", logits.size(1),
              " logits per position, expected ", hi - lo, " (columns ", lo, "..", hi, " of ", vocab, ")");
  Comm group = p.group();
  // The shift only keeps exp() in range: any value works, so no gradient.
  auto max = std::get<0>(logits.detach().max(1));
  // Sync point: every rank shifts by the same (global) max.
  group.all_reduce(max, c10d::ReduceOp::MAX);
  const auto shifted = logits - max.unsqueeze(1);
  // The sums over ranks: reduce_from_tp (identity backward: every rank's loss,
  // hence every upstream gradient, is the same).
  const auto sum_exp = reduce_from_tp(shifted.exp().sum(1), group);
  const auto scored = target.ne(-1);
  const auto mine = target.ge(lo).logical_and(target.lt(hi));
  const auto column = torch::where(mine, target - lo, torch::zeros_like(target)).unsqueeze(1);
  const auto picked = reduce_from_tp(shifted.gather(1, column).squeeze(1) * mine.to(torch::kFloat32), group);
  const auto loss = (sum_exp.log() - picked) * scored.to(torch::kFloat32);
  return {loss, scored, logits};
}

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           const Parallel& parallel, int64_t vocab) {
  const auto l = parallel_losses(logits, target, parallel, vocab);
  // torch's mean over scored positions (NaN when none is scored, as torch's).
  return l.loss.sum() / l.scored.sum().to(torch::kFloat32);
}

ValidationStep vocab_parallel_validation(const torch::Tensor& logits, const Batch& batch, const Parallel& parallel,
                                         int64_t vocab) {
  const auto l = parallel_losses(logits, batch.target, parallel, vocab);
  const int64_t lo = split_range(vocab, parallel.rank(), parallel.size()).first;
  auto [best, where] = l.logits.max(1);
  const int n = parallel.size();
  // Sync point: each rank's best logit and its global id, for the argmax over the vocabulary.
  auto values = torch::empty({n, best.size(0)}, best.options());
  auto ids = torch::empty({n, best.size(0)}, where.options());
  Comm group = parallel.group();
  group.all_gather_into(values, best.contiguous());
  group.all_gather_into(ids, (where + lo).contiguous());
  // argmax picks the first maximum: the lowest rank, hence the lowest id.
  const auto winner = values.argmax(0, /*keepdim=*/true);
  const auto predicted = ids.gather(0, winner).squeeze(0).view_as(batch.target);
  const auto scored = l.scored.view_as(batch.target);
  const auto right = predicted.eq(batch.target).logical_or(scored.logical_not());
  ValidationStep out;
  out.loss_sum = scalar_value(l.loss.sum());
  out.tokens = static_cast<int64_t>(scalar_value(scored.sum()));
  out.correct_samples = static_cast<int64_t>(scalar_value(right.all(/*dim=*/1).sum()));
  out.samples = batch.input.size(0);
  return out;
}

}  // namespace strata::tp
