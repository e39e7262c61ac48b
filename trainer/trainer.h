#pragma once
// Trainer: runs a TrainingModule and delegates every distributed decision to a
// Strategy; callbacks observe. fit() reads like nanoGPT's train.py.
//
// Example:
//   strata::Trainer trainer(strata::TrainerOptions().max_steps(100).lr(1e-3),
//                           strategy, {std::make_shared<strata::ProgressBar>()});
//   auto result = trainer.fit(module, data);
#include "strata/trainer/callback.h"
#include "strata/trainer/checkpoint.h"
#include "strata/core/precision.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/data_source.h"
#include "strata/trainer/loss_scaler.h"
#include "strata/trainer/lr_schedule.h"
#include "strata/trainer/memory.h"
#include "strata/core/training_module.h"
#include "strata/kernels/fused_adamw_optimizer.h"

#include <torch/torch.h>

#include <map>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata {

struct TrainerOptions {
  /// Optimizer steps to run.
  TORCH_ARG(int64_t, max_steps) = 100;
  /// Samples per micro-batch per rank (the global batch is
  /// batch_size * accumulate_grad_batches * world_size).
  TORCH_ARG(int64_t, batch_size) = 32;
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Clip gradients to this global 2-norm; 0 disables clipping.
  TORCH_ARG(double, gradient_clip_val) = 0.0;
  TORCH_ARG(int64_t, log_every_n_steps) = 10;
  /// Validate every n steps; 0: only at the end of fit.
  TORCH_ARG(int64_t, val_check_interval) = 0;
  /// Validation batches per check (per rank); 0 disables validation.
  TORCH_ARG(int64_t, limit_val_batches) = 20;
  TORCH_ARG(uint64_t, seed) = 1337;
  TORCH_ARG(Precision, precision) = Precision::kFp32;
  /// Loss scaling under Precision::kFp16Mixed (trainer/loss_scaler.h); not
  /// read under the other precisions, which need none.
  TORCH_ARG(LossScalerOptions, loss_scaler) = {};
  /// "adamw": AdamW with nanoGPT's groups (decay on >=2-D weights only) and
  /// beta1/beta2/eps below. "sgd": SGD over the same groups, with
  /// torch::optim::SGD's L2 weight decay and momentum/nesterov below (plain by
  /// default). Why plain SGD in tests: its update is linear in the gradient,
  /// so a gradient N times too large shows in the parameters, where Adam's
  /// per-element normalisation would hide it (parity tests).
  TORCH_ARG(std::string, optimizer) = "adamw";
  /// "adamw" only: step with FusedAdamW (kernels/fused_adamw_optimizer.h: one
  /// vectorised pass per parameter, the same math and state as
  /// torch::optim::AdamW) instead of torch::optim::AdamW.
  TORCH_ARG(bool, fused_adamw) = true;
  /// Which fused step FusedAdamW runs (fused_adamw() only): strata's kernel or
  /// ATen's at::_fused_adamw_ (PyTorch's AdamW(fused=True)).
  TORCH_ARG(FusedAdamWKernel, fused_adamw_kernel) = FusedAdamWKernel::kStrata;
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, min_lr) = 1e-4;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(double, weight_decay) = 0.1;
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.95;
  TORCH_ARG(double, eps) = 1e-8;
  /// "sgd" only: momentum in [0, 1) (0: plain SGD) and Nesterov (needs
  /// momentum > 0); dampening 0, as torch's and DeepSpeed's default.
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(bool, nesterov) = false;
  /// Checkpoint directory to resume from ("" = start fresh). A resume restores
  /// the parameters, optimizer state, step (hence the LR schedule's position),
  /// data position, random generator states and callback states, so it
  /// continues exactly as the uninterrupted run would (same strategy and world
  /// size; another world size re-seeds the generators, see fit()). The
  /// checkpoint's step must be below max_steps.
  TORCH_ARG(std::string, resume_from) = "";
  /// How save_checkpoint writes: "full" (one consolidated file) or "sharded"
  /// (one file per rank); "" = sharded when the strategy shards optimizer
  /// state (oss, sdp, fsdp), else full.
  TORCH_ARG(std::string, checkpoint_format) = "";
};

/// One rank's steady-state means per optimizer step (first step excluded;
/// see StepMetrics for the split's definition).
struct RankStepStats {
  double forward_s = 0.0;
  double backward_s = 0.0;    ///< backward without the comm wait inside it
  double comm_wait_s = 0.0;
  double optimizer_s = 0.0;
  double step_s = 0.0;
  double tokens_per_s = 0.0;  ///< this rank's tokens / its step time
  /// Bytes this rank sent per step, by CollectiveKind (see CommBytes).
  std::array<double, static_cast<int>(CollectiveKind::kCount)> comm_bytes_per_step{};
};

struct FitResult {
  int64_t steps = 0;
  double final_train_loss = 0.0;
  std::optional<double> val_loss;
  std::optional<double> val_accuracy;
  double tokens_per_s = 0.0;   ///< all ranks, steady state (first step excluded)
  /// This rank's mean per step, steady state (see StepMetrics).
  double backward_s_per_step = 0.0;
  double grad_sync_s_per_step = 0.0;
  double elapsed_s = 0.0;
  /// 16-mixed: optimizer steps skipped for non-finite gradients, and the
  /// loss scale at the end (unset under other precisions).
  int64_t skipped_steps = 0;
  std::optional<double> loss_scale;
  bool stopped_early = false;
  std::string stop_reason;
  /// One entry per rank (gathered onto every rank).
  std::vector<int64_t> peak_tensor_bytes;
  std::vector<ModelStateBytes> model_state_bytes;
  std::vector<int64_t> peak_rss_bytes;
  /// The strategy's setup (the model materialised, --init-from's weights
  /// read, shards cut) and the optimizer's: the resident set size before it
  /// and its peak during it (-1: the kernel could not reset the peak).
  std::vector<int64_t> setup_rss_bytes;
  std::vector<int64_t> setup_peak_rss_bytes;
  CommBytes comm_bytes;  ///< this rank's counters
  /// One entry per rank (gathered onto every rank).
  std::vector<RankStepStats> per_rank;
};

/// `batch` with its tensors on `device` (itself when already there).
Batch to_device(Batch batch, const torch::Device& device);

/// Why a checkpoint's data position (CheckpointMeta::state, from checkpoint
/// `dir`) cannot continue with `batch_size` per rank on `world_size` ranks (its
/// samples are not whole global micro-batches), or "" when it can. The
/// Trainer's resume raises it; a launcher can ask before starting any rank.
std::string resume_position_problem(const std::map<std::string, std::string>& state, const std::string& dir,
                                    int64_t batch_size, int world_size);

class Trainer {
 public:
  /// `memory` may be null (then peak tensor bytes are reported as 0).
  Trainer(TrainerOptions options, std::shared_ptr<Strategy> strategy,
          std::vector<std::shared_ptr<Callback>> callbacks = {},
          const MemoryTracker* memory = nullptr);

  FitResult fit(TrainingModule& module, const DataSource& data);

  /// Runs limit_val_batches held-out batches (sharded over ranks) and returns
  /// metrics reduced over ranks.
  ValidationMetrics validate(TrainingModule& module, const DataSource& data);

  /// Lightning's trainer.validate(): the strategy's setup, resume_from's
  /// weights when set, then the whole held-out set scored once (each sample
  /// exactly once at any batch and world size; limit_val_batches does not
  /// apply). No step is taken. Collective.
  ValidationMetrics evaluate(TrainingModule& module, const DataSource& data);

  // ---- for callbacks ----
  const TrainerOptions& options() const { return options_; }
  Strategy& strategy() { return *strategy_; }
  const MemoryTracker* memory() const { return memory_; }
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  /// The fp16 loss scaler (Precision::kFp16Mixed), else null.
  const DynamicLossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  /// Optimizer steps done so far.
  int64_t global_step() const { return step_; }
  /// Adds a value to the current step's log row.
  void log(const std::string& key, double value);
  /// Ends fit() after the current step (all ranks must agree: base the
  /// decision on rank-reduced metrics).
  void request_stop(const std::string& reason);
  bool should_stop() const { return stop_requested_; }
  /// Writes a resumable checkpoint into `dir` (see trainer/checkpoint.h).
  /// Collective: every rank calls it (the ranks' generator states are
  /// gathered to rank 0, which writes them). `format`: "full" or "sharded";
  /// "" takes TrainerOptions::checkpoint_format.
  CheckpointSaveStats save_checkpoint(const std::string& dir, const std::string& format = "");
  /// save_checkpoint's --checkpoint-async form (collective): the state is
  /// snapshotted and its write started; finish() the result (collective)
  /// before the checkpoint counts. Always the sharded format.
  std::unique_ptr<AsyncCheckpointSave> start_async_checkpoint(const std::string& dir);
  /// Micro-batches drawn so far (the data position; a global counter, see
  /// DataSource::train_batch).
  int64_t micro_batches() const { return micro_batch_; }

 private:
  struct SteadyStats;
  /// With resume_from: loads the checkpoint (step, trainer state) and returns
  /// its saved state for restore_after_fit_start(); nullopt for a fresh fit.
  std::optional<std::map<std::string, std::string>> load_resume_checkpoint();
  /// resume_from's model and optimizer state and step.
  CheckpointMeta load_resume_state();
  /// The generators and callback states a checkpoint saved.
  void restore_after_fit_start(const std::map<std::string, std::string>& state);
  /// One optimizer step at `lr`; `steady` steps count toward the rates.
  StepMetrics train_step(TrainingModule& module, const DataSource& data, double lr, bool steady, SteadyStats& stats);
  void log_step(const StepMetrics& metrics);
  /// `batches` global batches of the held-out set, spread over it, with
  /// each sample scored at most once; metrics reduced over ranks.
  ValidationMetrics score(TrainingModule& module, const DataSource& data, int64_t batches);
  /// Validates on the val_check_interval and at the last step.
  void validate_if_due(TrainingModule& module, const DataSource& data, FitResult& result);
  void run_step(TrainingModule& module, const DataSource& data, StepMetrics& metrics);
  /// The flight recorder's phase: "step <step> <phase>".
  void enter_phase(const char* phase, int64_t step);
  void emit_log(int64_t step, const LogRow& base);
  void gather_memory(FitResult& result);
  /// The strategy's and the optimizer's setup, its resident set size measured.
  void setup(TrainingModule& module);
  /// Collective: the trainer's part of CheckpointMeta::state (world size,
  /// data position, max_steps, every rank's generator state).
  std::map<std::string, std::string> trainer_state();
  /// The meta a checkpoint of this moment carries (trainer and callback
  /// states); `format` "" takes TrainerOptions::checkpoint_format.
  CheckpointMeta checkpoint_meta(const std::string& format);
  /// The loss scaler's saved state, or a note when the checkpoint has none.
  void restore_loss_scaler(const std::map<std::string, std::string>& state);
  /// Puts back what trainer_state() saved but the generators; `step_` is
  /// already the checkpoint's.
  void restore_trainer_state(const std::map<std::string, std::string>& state);
  /// This rank's saved generator states (same world size), else seeds from
  /// (seed, step, rank) with a note on rank 0.
  void restore_rng(const std::map<std::string, std::string>& state);
  /// The CheckpointMeta::state key of each callback, in callbacks_ order:
  /// "callback/<name>", with "#2", "#3"... for repeated names.
  std::vector<std::string> callback_state_keys() const;
  void gather_step_stats(FitResult& result, const RankStepStats& mine);
  template <typename Fn>
  void each_callback(Fn&& fn) {
    for (auto& cb : callbacks_) fn(*cb);
  }

  TrainerOptions options_;
  std::shared_ptr<Strategy> strategy_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  const MemoryTracker* memory_;
  TrainingModule* module_ = nullptr;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<DynamicLossScaler> scaler_;  ///< Precision::kFp16Mixed only
  int64_t step_ = 0;
  int64_t micro_batch_ = 0;  ///< index of the next training micro-batch
  ModelStateBytes last_state_bytes_;
  /// Resident set size before setup, the peak during it (-1: unknown), and
  /// the process's peak before it.
  int64_t setup_rss_ = 0, setup_peak_rss_ = -1, peak_rss_before_setup_ = 0;
  LogRow pending_log_;
  bool stop_requested_ = false;
  std::string stop_reason_;
};

/// The learning-rate schedule `options` give a run of `max_steps` steps:
/// linear warmup, then a cosine to min_lr.
WarmupCosineSchedule lr_schedule_of(const TrainerOptions& options, int64_t max_steps);

/// The optimizers TrainerOptions::optimizer accepts: "adamw", "sgd".
std::vector<std::string> optimizer_names();

/// nanoGPT's parameter groups: weight decay on every parameter with dim >= 2,
/// none on biases and LayerNorm weights. Groups with no parameters are dropped.
/// Each group's options are those of options.optimizer().
std::vector<torch::optim::OptimizerParamGroup> make_optimizer_groups(
    torch::nn::Module& module, const TrainerOptions& options);

/// options.optimizer() with the trainer's settings (AdamW: betas/eps; FusedAdamW
/// with options.fused_adamw_kernel() when options.fused_adamw()); lr and
/// weight decay come per group.
OptimizerFactory optimizer_factory(const TrainerOptions& options);

}  // namespace strata
