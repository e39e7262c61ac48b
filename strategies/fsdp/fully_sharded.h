#pragma once
// FSDPStrategy ("fsdp", alias "zero3"): fully sharded data parallel (ZeRO-3).
//
// Sharded: parameters, gradients and optimizer state. Each wrap unit (wrap.h:
// GPT's blocks, plus a root unit for the parameters in no block) is one
// FsdpUnit (unit.h) whose parameters are one FlatParam (flat_param.h; frozen
// ones a second); every rank keeps a 1/N shard of each. Per step:
//  - forward: a unit's shards are all-gathered just before it runs (the next
//    unit's gather is prefetched while it runs) and freed after it;
//  - backward: when the gradient reaches a unit's output, its shards are
//    all-gathered again (prefetching the unit backward reaches next); when
//    its last parameter gradient is accumulated, the unit's full gradient is
//    reduce-scattered (mean over ranks) into this rank's shard gradient and
//    the full parameters and gradient are freed;
//  - the optimizer steps only this rank's shards.
// Communicated per step: all-gather before forward and before backward (2Ψ)
// and reduce-scatter of gradients (Ψ): 3Ψ, against DDP's 2Ψ. The root unit
// is gathered once per micro-batch and kept until its gradients are reduced
// (its parameters are used both first and last), so it costs 2Ψ_root.
// Model state per rank with fp32 AdamW: 16Ψ'/N (+ padding) between steps,
// plus at most two units' full parameters and gradients while running
// (limit_all_gathers) and the root's.
//
// How it hooks in without module hooks (docs/design.md, "FSDP without module
// hooks"): a unit runner (the unit seam) gathers / reshards around each unit
// and wraps its output in an autograd Function whose backward does the
// pre-backward gather; post-hooks on the parameters' AccumulateGrad nodes
// (GradReadiness, one bucket per unit) start the reduce-scatter; the
// strategy's training_step gathers the root. Install FSDP after activation
// checkpointing (FSDP(checkpoint(block))): FSDP's runner is then outermost
// and the recompute finds the unit gathered. Installed the other way round
// (checkpoint(FSDP(block))) it works too, with as many all-gathers: the
// recompute (FSDP's runner, called during backward) gathers the unit and
// keeps it for the unit's backward that follows at once.
//
// Setup builds the units one at a time: each FlatParam takes its unit's
// parameters, and the unit is resharded before the next is built. A module
// built deferred (core/deferred_init.h, TrainingModule::init_parameter) is
// materialised that way too: the unit's parameters become views of its new
// full buffer, the module initialises them in place, rank 0's buffer is
// broadcast and the shard cut, so no rank ever holds more than its shards so
// far plus one unit's full parameters, and a model that only fits sharded
// starts at all.
//
// Mixed precision (FSDPOptions param_dtype / reduce_dtype, set by strata-gpt
// from --precision bf16-mixed / --reduce-dtype): units are all-gathered in
// bf16 (half the bytes) and upcast into fp32 full parameters (their values
// bf16-rounded; the gathered memory stays fp32), gradients are reduced in
// reduce_dtype and added to the fp32 shard gradients; the optimizer steps
// fp32 shards. summon_full_params() always gathers the exact fp32 values.
//
// Limits: a unit's output is a view made by that Function; modifying it in
// place raises torch's "view created inside a custom Function" error (clone
// it first). After setup() the module's parameters hold 0 elements except
// while a unit runs: read them through summon_full_params(). Parameters that
// get no gradient follow ddp's rule (grad_sync.h): an error naming them on
// every rank, unless find_unused_parameters. Under no_sync() each unit keeps
// its full gradient locally (no reduce-scatter) until the synchronised
// backward, as torch's FSDP does: more memory, less communication.
//
// Frozen parameters (requires_grad false: LoRA's base weights) are sharded
// too, in a second, gather-only FlatParam per unit (and root): gathered,
// prefetched and resharded with the unit's trainable part, in the same
// compute dtype, but never reduced and never given to the optimizer (torch
// FSDP2's per-parameter sharding; FSDP1 needed use_orig_params). A unit of
// frozen parameters only is gathered and never reduced. In backward the
// frozen part is read by the input-gradient computations (a frozen Linear's
// x-gradient needs its weight), which may run after the trainable part's
// last gradient is accumulated: it is resharded once the gradient w.r.t. the
// unit's INPUT has arrived (an identity Function on the input, when the
// input needs one) and the trainable part is done; the root's frozen part
// stays gathered until backward ends. That rule needs what the unit reads to
// come through its input (a unit that closes over another tensor needing a
// gradient, e.g. one computed from the root, could have its frozen part
// freed too early), and each unit to run once per micro-batch (checked). A
// unit's frozen parameters share one dtype, as its trainable ones do.
//
// Under a pipeline (begin_scheduled_step): every unit of the stage is
// gathered once per step and kept, and the micro-batches' full gradients
// accumulate until the schedule ends, when each unit is reduce-scattered
// once; torchtitan turns reshard_after_forward off under pp for the same
// reason (a stage's micro-batches run forwards and backwards interleaved).
// Memory during the step: the stage's full parameters and gradients, a
// pipeline rank's share of the model; between steps, shards.
//
// Offload (FSDPOptions::offload, fsdp/offload.h): every unit's shard, shard
// gradient and optimizer state live in an OffloadTier (disk files or pinned
// host memory) between uses; a gather reads the shard just before sending
// it, reduced gradients are added into the tier, and the optimizer step is
// streamed through a bounded staging buffer (FsdpOffloadedOptimizer).
#include "strata/strategies/fsdp/flat_param.h"
#include "strata/strategies/fsdp/offload.h"
#include "strata/strategies/fsdp/options.h"
#include "strata/strategies/fsdp/unit.h"
#include "strata/strategies/grad_sync.h"
#include "strata/strategies/spec.h"
#include "strata/strategies/strategy.h"

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

class FSDPStrategy : public Strategy, private ShardedState {
 public:
  /// limit_all_gathers: wrap units holding full parameters at once.
  static constexpr int kMaxUnitsGathered = 2;
  /// Reduce-scatters in flight before the autograd thread waits for the
  /// oldest: bounds the full gradients held while overlapping with backward.
  /// One suffices: a unit's reduce-scatter finishes during the next unit's
  /// backward (gpt-mini x2 measured no slower than with two), and each one
  /// fewer holds a full gradient and a receive buffer less.
  static constexpr size_t kMaxReductionsInFlight = 1;

  FSDPStrategy(Comm comm, FSDPOptions options = {});
  std::string name() const override { return "fsdp"; }

  void setup(TrainingModule& module) override;
  std::unique_ptr<torch::optim::Optimizer> setup_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const OptimizerFactory& factory) override;
  torch::Tensor training_step(TrainingModule& module, const Batch& batch) override;
  ValidationStep validation_step(TrainingModule& module, const Batch& batch) override;
  void backward(const torch::Tensor& loss) override;
  void reduce_gradients() override;
  /// Gathers every unit (and prepares its full gradient, `training`) and
  /// keeps them so until end_scheduled_step(): a pipeline's schedule runs
  /// several micro-batches' forwards and backwards in any order, which the
  /// per-unit gather and reshard (one micro-batch in flight) cannot follow.
  /// Backwards accumulate full gradients; end_scheduled_step() then launches
  /// every unit's reduce-scatter (reduce_gradients() waits) and reshards.
  void begin_scheduled_step(bool training) override;
  void end_scheduled_step() override;
  void optimizer_step(torch::optim::Optimizer& optimizer) override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;
  bool optimizer_sharded() const override { return shard_world_ > 1; }
  std::string describe() const override;

  const FSDPOptions& options() const { return options_; }
  /// reshard_after_forward as resolved from the options.
  bool reshard_after_forward() const { return reshard_after_forward_; }
  /// The most wrap units (the root not counted: it is gathered all step)
  /// that held full parameters at the same time during training so far.
  int max_units_gathered() const { return max_units_gathered_; }
  const FlatParam* root() const { return root_; }

  /// RAII from summon_full_params(): reshards every unit when destroyed.
  class FullParams {
   public:
    FullParams(FSDPStrategy* strategy, bool writeback) : strategy_(strategy), writeback_(writeback) {}
    FullParams(FullParams&& other) noexcept : strategy_(other.strategy_), writeback_(other.writeback_) {
      other.strategy_ = nullptr;
    }
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;
    FullParams& operator=(FullParams&&) = delete;
    ~FullParams();

   private:
    FSDPStrategy* strategy_;
    bool writeback_;
  };
  /// Gathers every unit's full parameters into the module (a collective:
  /// every rank must call it) until the returned guard dies: for evaluation,
  /// export, checkpoints, tests. Writes to the parameters are kept only with
  /// `writeback` (each rank keeps its own shard's part of what it wrote, so
  /// every rank must write the same values, e.g. load the same checkpoint).
  FullParams summon_full_params(bool writeback = false);

 protected:
  /// The units' shard pieces (the optimizer's tensors), whole or resharded
  /// alike; under hybrid_shard only the first replica saves them.
  std::vector<ParamPiece> param_pieces(StateUse use) const override;
  std::vector<ParamPiece> optimizer_param_pieces(StateUse use) const override;
  /// The base's, but none on a replica (hybrid_shard: node 0's shards count).
  /// Offloaded, each piece's `values` is one element: its gradient's 2-norm
  /// (local_grad_norms takes 2-norms; the gradient itself is in the tier).
  std::vector<ParamPiece> grad_pieces_for_norm() const override;
  /// The frozen units' shard pieces, by name (a replica's first rank saves).
  std::vector<NamedPiece> frozen_pieces(StateUse use) const override;
  /// Offloaded: every unit's shard (trainable and frozen) and its moments,
  /// streamed from the tier (param_pieces and frozen_pieces are then empty).
  std::vector<StatePiece> offloaded_state_pieces(torch::optim::Optimizer& optimizer, StateUse use) override;

 private:
  // ShardedState: what the base routes here (see strategy.h).
  /// summon_full_params(writeback), type-erased for the Trainer.
  std::shared_ptr<void> gather_full_params(bool writeback) override;
  ModelStateBytes held_state_bytes(const torch::optim::Optimizer& optimizer) const override;
  /// max_units_gathered, offload and buffer-pool numbers.
  std::map<std::string, double> sharding_report() const override;
  std::vector<torch::Tensor> shard_grad_norms() const override;
  void scale_shard_grads(double coef) override;

  struct Reduction {
    FlatParam* unit = nullptr;
    torch::Tensor input;   // the full gradient (kept alive until the collective ends)
    torch::Tensor output;  // reduce-scatter: this rank's part; all-reduce: the gradient itself
    PendingWork work;
  };
  // setup()'s steps.
  /// Attaches, materialises frozen parameters, broadcasts rank 0's state,
  /// makes the shard/replicate groups, the CPU buffer pool and the tier.
  void prepare_module(TrainingModule& module);
  /// One FsdpUnit per wrap unit (and the root), its FlatParams each built,
  /// initialised, resharded (and offloaded) before the next.
  void build_units(TrainingModule& module, std::vector<GradAccumulatorPtr>& accumulators);
  /// `members` index `ps` / `names` (trainable: params(); frozen: the
  /// module's frozen parameters, each tensor once).
  std::unique_ptr<FlatParam> make_part(TrainingModule& module, const std::string& unit_name,
                                       const std::vector<torch::Tensor>& ps, const std::vector<std::string>& names,
                                       const std::vector<size_t>& members, std::vector<GradAccumulatorPtr>& accumulators);
  /// One readiness bucket per unit, in the order backward finishes them.
  void install_gradient_hooks();

  torch::Tensor run_unit(int64_t module_unit, const torch::Tensor& x, const UnitFn& forward);
  /// run_unit's input under grad for a unit with a frozen part: x, or x behind
  /// the hook that reports its gradient (input_backward_done).
  torch::Tensor hook_frozen_input(int64_t module_unit, int index, const torch::Tensor& x, bool recompute);
  /// run_unit's end: frees the unit's gathered parameters unless backward
  /// needs them (see there).
  void reshard_after_unit_forward(int index, bool grad, bool recompute);
  void begin_forward();
  void gather(int index);  // units_[index], both parts
  void prefetch(int index);
  void pre_backward(int index);
  void post_backward(size_t bucket);
  /// The gradient w.r.t. the unit's input has arrived: its frozen part may go.
  void input_backward_done(int index);
  /// The units' trainable parts (wrap units in forward order, then the
  /// root's): the optimizer's units, in its order. And their frozen parts.
  std::vector<FlatParam*> trainable_parts() const;
  std::vector<FlatParam*> frozen_parts() const;
  void launch_reduction(FlatParam& unit);
  void finish_oldest_reduction();
  void reshard_all();
  /// The step's housekeeping, idempotent: reductions finished, everything
  /// resharded, the buffer pool trimmed to the step's peak.
  void end_step();
  /// A 1-D buffer of `numel` elements (uninitialised), from the pool if any.
  torch::Tensor scratch(int64_t numel, const torch::TensorOptions& options);
  int wrap_units_holding_full() const;
  std::vector<torch::Tensor> pieces_unused_everywhere() const;
  /// Every unit's shard pieces as pieces of params() (see param_pieces).
  std::vector<ParamPiece> shard_pieces(StateUse use, bool detach) const;

  FSDPOptions options_;
  bool reshard_after_forward_ = true;
  // reshard_after_forward unset (full_shard, hybrid_shard): every unit but
  // the last is freed after its forward.
  bool keep_last_unit_ = false;
  // Inside a training step with grad enabled: its backward will come.
  bool backward_follows_ = false;
  Comm shard_comm_;      // all-gathers and reduce-scatters (hybrid.h: FsdpGroups)
  Comm replicate_comm_;  // all-reduces the shard gradients (no_shard: full ones)
  int shard_world_ = 1;
  int shard_rank_ = 0;
  bool set_up_ = false;
  // CPU: reuses the units' gathered, gradient and reduce-scatter buffers
  // (buffer_pool.h); null on CUDA, whose caching allocator does it.
  std::unique_ptr<BufferPool> pool_;
  // The pool's buffers in use when backward reached its first unit (the
  // step's activation peak), per size: what optimizer_step() trims it to.
  std::unordered_map<size_t, size_t> pool_at_peak_;
  bool peak_noted_ = false;
  // The units: wrap units in forward order, then the root (when it has
  // parameters). Each owns its trainable and frozen parts (unit.h).
  std::vector<std::unique_ptr<FsdpUnit>> units_;
  int num_wrap_units_ = 0;                         // units_[0, num_wrap_units_) are wrap units
  FlatParam* root_ = nullptr;                      // the root's trainable part
  // The three ways into units_: by the module's unit index (run_unit), by
  // readiness bucket (post_backward) and by hooked parameter (unused ones).
  std::vector<int> index_of_unit_;                 // module unit -> units_ index, -1: no params
  std::vector<FsdpUnit*> unit_of_bucket_;          // GradReadiness bucket -> its unit
  GradSync grad_sync_;                             // hooks + the unused-parameter rule
  std::vector<std::pair<const FlatParam*, size_t>> hooked_param_;  // GradSync param -> (trainable part, its param)
  std::deque<Reduction> in_flight_;
  bool sync_backward_ = true;
  bool in_backward_ = false;  // inside backward(): a unit run now is a recompute
  bool held_step_ = false;    // begin_scheduled_step(): every unit stays gathered
  int max_units_gathered_ = 0;
  std::unique_ptr<OffloadTier> tier_;                  // offload: holds every unit's state
  FsdpOffloadedOptimizer* offloaded_optimizer_ = nullptr;  // offload: owned by the caller of setup_optimizer
};

/// How "fsdp" (alias zero3) registers (strategies/spec.h): its options
/// (--sharding-strategy, --reshard-after-forward, --limit-all-gathers,
/// --wrap-policy, --reduce-dtype, --find-unused-parameters); --offload moves
/// shards, gradients and optimizer state to the tier; --precision's compute
/// dtype is the all-gather dtype.
StrategySpec fsdp_spec();

}  // namespace strata
