#pragma once
// OffloadedMomentsOptimizer: optimizer-state offload for the strategies whose
// parameters and gradients stay resident (single, ddp, oss, sdp): `--offload
// disk|cpu` with them (ZeRO-Offload's idea applied to what each of them
// holds). FSDP offloads its parameter shards and gradients too and has its
// own optimizer for that (fsdp/offload.h).
//
// The optimizer keeps AdamW's two moments of every parameter it steps in an
// OffloadTier, not in memory. A step streams them chunk by chunk through two
// staging sets of at most chunk_numel elements: while chunk i is stepped
// (against the resident parameter and gradient, in place), the I/O thread
// writes chunk i-1's moments back and reads chunk i+1's. Resident optimizer
// state is 0 bytes; staging is 4 × chunk_numel elements during a step.
//
// Whatever the strategy hands the optimizer is what gets stepped: ddp and
// single the whole parameters, oss/sdp the 1-D pieces of their shard (the
// strategy calls the OptimizerFactory with those groups). So it is built by
// decorating the factory (offloading_optimizer_factory below) and no strategy
// changes: the update is torch::optim::AdamW's (kernels/fused_adamw.h on
// CPU, torch's own tensor ops elsewhere) or plain SGD's, with each
// parameter's own step count and its group's options; a parameter without a
// gradient is skipped, as torch skips .grad == None. Training with it gives
// the parameters training without it gives.
//
// state() is empty (the moments are in the tier): model_state_bytes reports
// 0 optimizer bytes, state_bytes() what the tier holds. Checkpoints of
// offloaded state are not supported yet (save()/load() raise).
#include "strata/strategies/offload_tier.h"
#include "strata/strategies/optimizer_factory.h"

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace strata {

class OffloadedMomentsOptimizer : public ExactGroupsOptimizer {
 public:
  /// `groups` carry AdamWOptions (no amsgrad) or SGDOptions (no momentum);
  /// every parameter must be contiguous. The moments are allocated in
  /// `tier` (zero-filled, like torch's lazily created state).
  OffloadedMomentsOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                          std::shared_ptr<OffloadTier> tier, int64_t chunk_numel);

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// Bytes of optimizer state in the tier.
  int64_t state_bytes() const { return state_bytes_; }
  /// Elements per staged chunk, as resolved (<= chunk_numel, <= the largest parameter).
  int64_t chunk_numel() const { return chunk_numel_; }
  const OffloadTier& tier() const { return *tier_; }
  /// Checkpoints: the state of `param` (one of param_groups()' tensors) as
  /// pieces of parameter `name` (global `shape`, this tensor's elements from
  /// `lo`): exp_avg and exp_avg_sq streamed from the tier, and the step
  /// (with_step). Empty for SGD or a tensor not stepped here.
  std::vector<StatePiece> state_pieces_of(const torch::Tensor& param, const std::string& name,
                                          const std::vector<int64_t>& shape, int64_t lo, bool with_step);

 private:
  struct Entry {
    size_t group;
    size_t index;  // within the group
    OffloadTier::Region exp_avg, exp_avg_sq;
    int64_t step = 0;
  };
  struct Chunk {
    size_t entry;
    int64_t begin, numel;
  };
  struct Staging {
    torch::Tensor exp_avg, exp_avg_sq;
  };
  const torch::Tensor& param_of(const Entry& e) const { return param_groups()[e.group].params()[e.index]; }
  void step_chunk(const Chunk& chunk, const Staging& moments) const;

  bool adamw_ = true;
  std::shared_ptr<OffloadTier> tier_;
  std::vector<Entry> entries_;
  int64_t chunk_numel_ = 1;
  int64_t state_bytes_ = 0;
  IoQueue io_;
};

/// `factory` made to build an OffloadedMomentsOptimizer over the same groups
/// (with the options `factory`'s optimizer would have used), its moments in
/// `tier`. The tier is shared by every optimizer the factory builds.
OptimizerFactory offloading_optimizer_factory(OptimizerFactory factory, std::shared_ptr<OffloadTier> tier,
                                         int64_t chunk_numel);

}  // namespace strata
