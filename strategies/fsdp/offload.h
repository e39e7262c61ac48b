#pragma once
// FsdpOffloadedOptimizer: FSDP's optimizer step when the sharded state is
// offloaded (FSDPOptions::offload; ZeRO-Offload / ZeRO-Infinity).
//
// Between steps every unit's fp32 shard, its gradient and the optimizer
// state (AdamW's two moments) live in an OffloadTier, not in memory. The step
// runs where the state lives (on the host), streamed chunk by chunk through a
// bounded staging buffer: two sets of {params, grads, exp_avg, exp_avg_sq} of
// at most chunk_numel elements each. While chunk i is being stepped, the I/O
// thread (IoQueue) writes chunk i-1 back and reads chunk i+1 in, so resident
// memory does not grow with the model and the I/O overlaps the arithmetic.
//
// The update is torch::optim::AdamW's (kernels/fused_adamw.h: one fused pass
// with torch's fp32 roundings) or plain SGD's, applied per parameter piece (the part of one parameter in this
// rank's shard): each piece keeps its own step count and its parameter's
// group options (lr set by the Trainer each step, weight decay by group), as
// torch keeps per-parameter state; a piece whose parameter no rank used is
// skipped (set_skipped), as torch skips .grad == None. So training with
// offload gives the parameters training without it gives.
//
// The param_groups hold the module's parameters (their data is empty between
// units' runs): they carry the options the Trainer adjusts. state() is empty
// (the state is in the tier); checkpoints reach it through state_pieces_of
// (torch's save()/load() archives raise an error saying so).
#include "strata/strategies/fsdp/flat_param.h"
#include "strata/strategies/offload_tier.h"
#include "strata/strategies/optimizer_factory.h"

#include <torch/torch.h>

#include <memory>
#include <unordered_set>
#include <vector>

namespace strata {

class FsdpOffloadedOptimizer : public ExactGroupsOptimizer {
 public:
  /// `groups`: the module's parameters with AdamWOptions or SGDOptions (no
  /// momentum); `units`: the offloaded FlatParams whose pieces they step;
  /// `tier` holds the moments too. Both must outlive the optimizer.
  FsdpOffloadedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                     std::vector<FlatParam*> units, OffloadTier& tier, int64_t chunk_numel);

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// Parameters (the module's, by TensorImpl) the next step leaves alone.
  void set_skipped(std::unordered_set<const void*> params) { skipped_ = std::move(params); }
  /// Bytes of optimizer state in the tier.
  int64_t state_bytes() const { return state_bytes_; }
  /// Elements per staged chunk, as resolved (<= chunk_numel, <= the largest shard).
  int64_t chunk_numel() const { return chunk_numel_; }
  /// Bytes of the staging buffers a step allocates (and frees after it).
  int64_t staging_bytes() const;
  /// Checkpoints: the state of the piece of units[unit]'s shard from element
  /// `begin` (a parameter's part of it) as pieces of parameter `name`
  /// (global `shape`, from element `lo`): exp_avg and exp_avg_sq streamed
  /// from the tier, and the step (with_step). Empty for SGD or a part this
  /// optimizer does not step.
  std::vector<StatePiece> state_pieces_of(size_t unit, int64_t begin, const std::string& name,
                                          const std::vector<int64_t>& shape, int64_t lo, bool with_step);

 private:
  /// A run of one unit's shard owned by one parameter (a ShardPiece).
  struct Piece {
    size_t unit;          // index into units_
    int64_t begin;        // first element within the unit's shard
    int64_t numel;
    size_t group;         // index into param_groups()
    const void* param;    // the module parameter (TensorImpl), for set_skipped
    int64_t step = 0;     // optimizer steps taken so far (torch's per-parameter state)
  };
  struct Staging {
    torch::Tensor param, grad, exp_avg, exp_avg_sq;
  };
  struct Chunk {
    size_t unit;
    int64_t begin, numel;
  };
  void read_chunk(const Chunk& chunk, const Staging& buffers) const;
  void write_chunk(const Chunk& chunk, const Staging& buffers) const;
  void step_chunk(const Chunk& chunk, const Staging& buffers, const std::vector<size_t>& pieces) const;

  bool adamw_ = true;
  std::vector<FlatParam*> units_;
  OffloadTier& tier_;
  std::vector<OffloadTier::Region> exp_avg_, exp_avg_sq_;  // per unit (AdamW only)
  std::vector<Piece> pieces_;                                // in unit, then shard order
  std::unordered_set<const void*> skipped_;
  int64_t chunk_numel_ = 0;
  int64_t state_bytes_ = 0;
  IoQueue io_;
};

}  // namespace strata
