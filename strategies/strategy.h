#pragma once
// Strategy: every distributed decision of the training loop.
//
// The Trainer calls, per step:
//   for micro in accumulation: { guard = no_sync() on all but last; backward(loss) }
//   reduce_gradients(); clip_grad_norm(max); optimizer_step(opt); zero_grad(opt)
// A subclass overrides only what it changes; its class comment says what it
// shards and what it communicates.
#include "strata/strategies/comm.h"
#include "strata/strategies/optimizer_factory.h"
#include "strata/strategies/state_pieces.h"
#include "strata/strategies/step_runner.h"
#include "strata/core/training_module.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace strata {

/// Bytes of model state this rank really holds (unique storages).
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

class Strategy;
class OffloadTier;

/// RAII: while alive, backward() accumulates gradients locally without
/// communicating (gradient accumulation on all but the last micro-batch).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(Strategy* strategy);
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard();

 private:
  Strategy* strategy_;
  bool previous_ = true;
};

/// What a strategy whose module tensors do not hold this rank's state
/// between steps answers in the base's place (FSDP: 0-element parameters
/// outside a gather, state in flat shards, maybe offloaded). The base's
/// full_params, model_state_bytes, report and the clip's norms and scaling
/// route here when a subclass registered one (Strategy::set_sharded_state);
/// no other strategy carries these methods. The names differ from
/// Strategy's so that lookups through the subclass stay unambiguous.
class ShardedState {
 public:
  virtual ~ShardedState() = default;
  /// Strategy::full_params: gathers the full parameters until the handle dies.
  virtual std::shared_ptr<void> gather_full_params(bool writeback) = 0;
  /// Strategy::model_state_bytes: what the shards (and the tier) hold.
  virtual ModelStateBytes held_state_bytes(const torch::optim::Optimizer& optimizer) const = 0;
  /// Strategy::report.
  virtual std::map<std::string, double> sharding_report() const = 0;
  /// 2-norms of this rank's shard gradients (offloaded ones recorded when written).
  virtual std::vector<torch::Tensor> shard_grad_norms() const = 0;
  /// Multiplies the shard gradients by `coef` (offloaded ones when next read).
  virtual void scale_shard_grads(double coef) = 0;
};

/// A dimension that splits the model itself across ranks, beside the
/// strategy's data parallelism (tensor parallelism: strategies/tp). The
/// strategy then runs over this rank's data-parallel group (comm()): it
/// shards, syncs and feeds data there, and asks this for what involves the
/// other dimension. Set with Strategy::set_model_parallel() before setup; the
/// strategies whose spec says tensor_parallel() accept one.
class ModelParallel {
 public:
  virtual ~ModelParallel() = default;
  /// Every rank of the job (is_global_zero() is rank 0 of it).
  virtual const Comm& world() const = 0;
  /// Whether this rank adds parameter `name`'s gradient to the global norm:
  /// a split one on every rank (each holds a part), a replicated one on one
  /// rank of the group (every rank holds the same).
  virtual bool counts_gradient(const std::string& name) const = 0;
  /// Sums the ranks' squared-norm contributions `sq` over the group.
  virtual void sum_over_group(torch::Tensor& sq) = 0;
  /// Strategy::full_params: the whole parameters in the module until the
  /// handle dies (collective over the group).
  virtual std::shared_ptr<void> gather_full_params(TrainingModule& module, bool writeback) = 0;
  /// Checkpoints (Strategy::state_pieces): `pieces` name and shape the
  /// parameters as this rank's module holds them; returns them as pieces of
  /// the whole tensors (a split parameter's part maps to its runs in the
  /// whole), so a checkpoint loads at any size of this dimension. kSave:
  /// pieces of replicated tensors are kept on one rank of the group only.
  virtual std::vector<StatePiece> to_global(std::vector<StatePiece> pieces, StateUse use) const = 0;
};

class Strategy {
 public:
  explicit Strategy(Comm comm);
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  /// Registry name (StrategySpec::name).
  virtual std::string name() const = 0;

  const Comm& comm() const { return comm_; }
  Comm& comm() { return comm_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  /// Rank 0 of the whole job (with a ModelParallel, of its world).
  bool is_global_zero() const { return model_parallel_ ? model_parallel_->world().rank() == 0 : comm_.rank() == 0; }

  /// Runs this strategy over its data-parallel group beside `parallel`
  /// (see ModelParallel). Before setup().
  void set_model_parallel(std::shared_ptr<ModelParallel> parallel) { model_parallel_ = std::move(parallel); }
  const ModelParallel* model_parallel() const { return model_parallel_.get(); }
  /// How a step's micro-batches run (step_runner.h): SequentialSteps unless
  /// set (a pipeline's schedule). Before setup().
  void set_step_runner(std::shared_ptr<StepRunner> runner);
  StepRunner& step_runner() const { return *step_runner_; }
  /// Every rank of the job: world_size(), times the model-parallel ranks
  /// beside it (per-rank rates such as MFU divide by this).
  int job_size() const { return model_parallel_ ? model_parallel_->world().size() : comm_.size(); }
  /// Every rank of the job (a copy sharing the process group): comm(), or
  /// the ModelParallel's world. Checkpoints are written over it.
  Comm job_comm() const { return model_parallel_ ? model_parallel_->world() : comm_; }
  /// Where this rank trains (the Comm's device): setup() moves the module
  /// there and the Trainer moves each batch there.
  const torch::Device& device() const { return comm_.device(); }

  /// Called at the start of every fit: wrap, shard or register hooks. The base
  /// materialises a deferred module (TrainingModule::has_deferred_parameters)
  /// on device() and initialises it, then attach()es it.
  /// single, ddp, oss and sdp may be set up again (another fit, the same or
  /// another module): every piece of state is rebuilt and hooks installed on
  /// an earlier module become no-ops. FSDP shards one module once and refuses
  /// a second call: a second fit needs a new FSDPStrategy.
  virtual void setup(TrainingModule& module);

  /// Keeps the optimizer's state in `tier` instead of memory
  /// (OffloadedMomentsOptimizer, strategies/offloaded_moments.h): `--offload`
  /// for the strategies whose parameters and gradients stay resident.
  /// Call before setup_optimizer(); FSDP offloads through its own options.
  void offload_optimizer_state(std::shared_ptr<OffloadTier> tier, int64_t chunk_numel);

  /// Builds the optimizer; the base hands every group to the factory
  /// (optimizer_factory_for(factory): the offloading one when set).
  virtual std::unique_ptr<torch::optim::Optimizer> setup_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const OptimizerFactory& factory);

  /// The module's training step as this strategy runs it (Lightning's
  /// Strategy.training_step): the base calls module.training_step(batch);
  /// FSDP gathers the root unit's parameters around it.
  virtual torch::Tensor training_step(TrainingModule& module, const Batch& batch) {
    return module.training_step(batch);
  }
  /// Same for validation (called under torch::NoGradGuard).
  virtual ValidationStep validation_step(TrainingModule& module, const Batch& batch) {
    return module.validation_step(batch);
  }

  /// RAII: while the returned handle lives, the module's parameters hold
  /// their full values on this rank (checkpoints, export, evaluation outside
  /// the step). A collective where parameters are sharded (FSDP gathers
  /// them): every rank must call it. With `writeback`, values written to the
  /// parameters meanwhile are kept. Where the module holds them anyway:
  /// nullptr; a ShardedState gathers them.
  std::shared_ptr<void> full_params(bool writeback = false);

  /// The base runs loss.backward().
  virtual void backward(const torch::Tensor& loss);

  /// See NoSyncGuard. Strategies read require_sync() in their hooks.
  NoSyncGuard no_sync() { return NoSyncGuard(this); }
  bool require_sync() const { return require_sync_; }

  /// Finish gradient communication (wait for async work started by hooks).
  virtual void reduce_gradients() {}

  /// Bracket a step whose forwards and backwards a StepRunner calls on the
  /// module's stages itself (a pipeline's schedule: several micro-batches in
  /// flight, forwards between backwards, split backwards) instead of
  /// training_step() and backward(). `training`: backwards run in between,
  /// under no_sync(); end_scheduled_step() then starts what
  /// reduce_gradients() finishes. The base does nothing; FSDP keeps every
  /// unit gathered in between, as FSDP2 under torch's pipelining does
  /// (reshard_after_forward off, gradients synced after the last micro-batch).
  virtual void begin_scheduled_step(bool training) { (void)training; }
  virtual void end_scheduled_step() {}

  /// Makes parameter `name`'s gradient the sum of its own and another copy's
  /// (a tied weight that other ranks hold too: the first and the last
  /// pipeline stage). `exchange` gets this data-parallel group's whole
  /// gradient of it (parameter-shaped) and returns the other copy's; each
  /// rank then adds its part of that into the gradient its optimizer steps,
  /// in place. Collective over comm() when gradients are sharded (oss, sdp,
  /// fsdp): every rank of it calls this. After reduce_gradients().
  void add_gradient_of_copy(const std::string& name,
                            const std::function<torch::Tensor(const torch::Tensor&)>& exchange);

  /// Clips by the GLOBAL 2-norm over every gradient on every rank (each element
  /// counted once) and returns that norm before clipping. One code path for all
  /// strategies: local_grads_for_norm() says which gradients this rank
  /// contributes and grads_sharded() whether contributions must be summed.
  /// max_norm <= 0 only computes the norm.
  ///
  /// `loss_scale`: the gradients are of a loss multiplied by it (fp16 loss
  /// scaling); they are unscaled in the same pass as the clip, and the norm
  /// returned is the unscaled one. With a loss scale other than 1, a norm
  /// that is not finite (an inf or NaN gradient on any rank, seen alike by
  /// every rank) is returned as is and the gradients are left untouched: the
  /// caller skips the step.
  double clip_grad_norm(double max_norm, double loss_scale = 1.0);

  /// The base runs opt.step().
  virtual void optimizer_step(torch::optim::Optimizer& optimizer);

  /// The base sets gradients to none (torch's default since 2.0).
  virtual void zero_grad(torch::optim::Optimizer& optimizer);

  /// Mean of a scalar over ranks (for logged metrics); identity on one rank.
  double mean_over_ranks(double value);

  /// What this rank holds of params / grads / optimizer state, in bytes.
  ModelStateBytes model_state_bytes(const torch::optim::Optimizer& optimizer) const;

  /// True when each rank's optimizer holds only its shard (checkpoints are
  /// then written sharded by default).
  virtual bool optimizer_sharded() const { return false; }

  /// This rank's pieces of the model and optimizer state (checkpoints). kSave:
  /// disjoint over ranks and together everything (replicated state once, from
  /// rank 0; sharded state from its owner); kLoad: everything this rank holds.
  /// The base builds them from param_pieces(), frozen_pieces() and
  /// optimizer_param_pieces(); buffers are whole on every rank (saved by rank 0).
  /// Creates missing optimizer state first (create_optimizer_state).
  std::vector<StatePiece> state_pieces(torch::optim::Optimizer& optimizer, StateUse use);

  /// Creates the optimizer's lazily made state (AdamW: zero moments, step 0)
  /// for every parameter that has none yet, so a checkpoint can fill it (and a
  /// save before the first step stores it). Stepping is unchanged: torch
  /// creates exactly this state on a parameter's first step.
  static void create_optimizer_state(torch::optim::Optimizer& optimizer);
  /// The same for SGD with momentum: zero momentum buffers.
  static void create_sgd_momentum(torch::optim::Optimizer& optimizer);

  /// A one-paragraph description of the partition / buckets, printed at start.
  virtual std::string describe() const;

  /// Strategy-specific numbers for summary.json (name -> value), merged into
  /// it by strata-gpt: the base reports offloaded optimizer state
  /// (offload_bytes, offload_io_s) when offload_optimizer_state() is on;
  /// fsdp: max_units_gathered and its own offload.
  std::map<std::string, double> report() const;

 protected:
  /// Gradients this rank contributes to the global norm, each element of the
  /// model's gradient exactly once over all ranks when grads_sharded().
  virtual std::vector<torch::Tensor> local_grads_for_norm() const;
  /// The same gradients as pieces of parameters (`values`: gradient
  /// elements), for a ModelParallel that counts replicated parameters once
  /// (ModelParallel::counts_gradient). The base: the .grad() of each of
  /// optimizer_param_pieces(kLoad) (oss, sdp and fsdp give their pieces the
  /// shard's gradient); fsdp leaves out its replicas (hybrid_shard).
  virtual std::vector<strata::ParamPiece> grad_pieces_for_norm() const;
  /// Whether the ranks' norm contributions must be summed: a rank
  /// contributes exactly the gradients its optimizer steps, so gradients are
  /// sharded where the optimizer is (oss, sdp, fsdp over > 1 rank).
  bool grads_sharded() const { return optimizer_sharded() && world_size() > 1; }
  /// 2-norms (0-dim tensors) of this rank's contributions: the base takes
  /// them from local_grads_for_norm(); FSDP from its shard gradients, which
  /// may be offloaded (their norms were taken when they were written).
  std::vector<torch::Tensor> local_grad_norms() const;
  /// Multiplies this rank's gradients by `coef` (clipping): the base scales
  /// local_grads_for_norm() in place; offloaded FSDP gradients when next read.
  void scale_grads(double coef);

  /// `factory`, or one building an OffloadedMomentsOptimizer over the same
  /// groups when offload_optimizer_state() was called. Subclasses that build
  /// their own groups (oss, sdp) call their factory through this too.
  OptimizerFactory optimizer_factory_for(const OptimizerFactory& factory) const;

  using ParamPiece = strata::ParamPiece;
  /// Parameter values this rank holds (kLoad) or writes (kSave). The base:
  /// every parameter whole (kSave: on rank 0 only).
  virtual std::vector<ParamPiece> param_pieces(StateUse use) const;
  /// The tensors the inner optimizer steps, as pieces of the parameters
  /// (each `values` IS the optimizer's tensor: its state is found by it).
  /// The base: every parameter whole (kSave: on rank 0 only).
  virtual std::vector<ParamPiece> optimizer_param_pieces(StateUse use) const;
  /// State that lives in an offload tier, as streamed pieces (StatePiece's
  /// numel/read/write form) for checkpoints. The base: the moments of an
  /// optimizer built by offload_optimizer_state() (OffloadedMomentsOptimizer),
  /// for each of optimizer_param_pieces(); fsdp: its offloaded shards and
  /// their moments.
  virtual std::vector<StatePiece> offloaded_state_pieces(torch::optim::Optimizer& optimizer, StateUse use);
  using NamedPiece = strata::NamedPiece;
  /// Frozen parameter values this rank holds (kLoad) or writes (kSave). The
  /// base: every frozen parameter whole (kSave: on rank 0 only); FSDP: its
  /// frozen units' shards.
  virtual std::vector<NamedPiece> frozen_pieces(StateUse use) const;
  /// The global shape of params()[index], as attach() found it (FSDP's
  /// parameters are 0-element between gathers).
  const std::vector<int64_t>& param_shape(size_t index) const { return param_shapes_[index]; }

  /// Routes full_params, model_state_bytes, report and the clip's norms and
  /// scaling to `state` (FSDP registers itself in its constructor).
  void set_sharded_state(ShardedState* state) { sharded_ = state; }

  /// What setup() does after materialising: remembers the module, moves its
  /// parameters and buffers that hold memory to device() and remembers its
  /// trainable parameters (deferred ones included, still deferred). For a
  /// strategy that materialises a deferred module itself (FSDP).
  void attach(TrainingModule& module);

  TrainingModule& module() const;
  /// Trainable parameters in registration order (fixed at setup()).
  const std::vector<torch::Tensor>& params() const { return params_; }
  /// Their qualified names, same order.
  const std::vector<std::string>& param_names() const { return param_names_; }

 private:
  friend class NoSyncGuard;
  Comm comm_;
  TrainingModule* module_ = nullptr;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;
  std::vector<std::vector<int64_t>> param_shapes_;  ///< params_' shapes at attach()
  ShardedState* sharded_ = nullptr;                 ///< set_sharded_state
  std::shared_ptr<ModelParallel> model_parallel_;   ///< set_model_parallel
  std::shared_ptr<StepRunner> step_runner_ = std::make_shared<SequentialSteps>();
  bool require_sync_ = true;
  std::shared_ptr<OffloadTier> offload_tier_;
  int64_t offload_chunk_numel_ = 0;
};

/// Broadcasts rank 0's parameters and buffers to every rank (identical start
/// for the data-parallel strategies); nothing on a world of one. Deferred
/// parameters (no values yet) are skipped.
void broadcast_module_state(Comm& comm, torch::nn::Module& module);

/// Sum of nbytes over the unique storages behind `tensors` (views of one
/// buffer are counted once).
int64_t unique_storage_bytes(const std::vector<torch::Tensor>& tensors);

/// Bytes of tensor state (exp_avg, exp_avg_sq, ...) held by an optimizer.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace strata
