#pragma once
// ModelCheckpoint: resumable checkpoints <dirpath>/step-<N> every n steps and
// at fit end, keeping the newest `keep_last` and, with a monitored metric, the
// `save_top_k` best by it.
//
// Saves run in on_train_step_end, after the step's log and validation, so a
// checkpoint holds everything about its step (callback states included) and a
// resume continues at step N+1 exactly.
//
// A checkpoint is a directory written by Trainer::save_checkpoint on EVERY rank
// (sharded strategies write one shard per rank), so save() is collective and
// runs the same hooks on all ranks. It never leaves a half-written directory
// that looks valid:
//   1. rank 0 creates <dirpath> and clears a stale <dirpath>/.step-<N>.tmp;
//      barrier (nobody writes into a directory that is being deleted)
//   2. every rank: trainer.save_checkpoint(<dirpath>/.step-<N>.tmp)
//   3. barrier: every rank has finished writing its part
//   4. rank 0 renames .step-<N>.tmp -> step-<N> (atomic on one file system,
//      replacing an older step-<N>), prunes every step-* directory that is
//      neither among the newest keep_last nor among the best save_top_k, and
//      (with a monitor) rewrites <dirpath>/best atomically: "step-<N>\n" of the
//      best checkpoint.
// A crash before 4 leaves only the hidden .tmp directory, which neither
// find_checkpoints() nor prune_checkpoints() treat as a checkpoint.
//
// Best-k: a checkpoint's score is the monitored value measured at its own
// step (val_loss/val_accuracy by that step's validation, loss by its training
// step), never an older one. Besides the periodic saves, every step whose
// score would enter the top k is saved. The monitored values are reduced over
// ranks, so every rank makes the same decision (save() is collective). A
// monitored metric that is never measured (no validation, no accuracy) gives
// one warning, on rank 0.
//
// Example:
//   std::make_shared<strata::ModelCheckpoint>(
//       strata::ModelCheckpointOptions("runs/gpt/ckpt").every_n_train_steps(500).keep_last(3)
//           .monitor("val_loss").save_top_k(2));
//   resume: TrainerOptions().resume_from(strata::latest_checkpoint("runs/gpt/ckpt"))
#include "strata/callbacks/monitor_mode.h"
#include "strata/trainer/callback.h"
#include "strata/trainer/checkpoint.h"

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace strata {

struct ModelCheckpointOptions {
  explicit ModelCheckpointOptions(std::string dirpath) : dirpath_(std::move(dirpath)) {}
  /// Directory holding the step-<N> checkpoint directories.
  TORCH_ARG(std::string, dirpath);
  /// Save after every n-th optimizer step; 0 = never during training.
  TORCH_ARG(int64_t, every_n_train_steps) = 0;
  /// Save at fit end (unless that step was just saved).
  TORCH_ARG(bool, save_last) = true;
  /// Keep the newest k step-* directories; 0 or negative keeps all.
  TORCH_ARG(int64_t, keep_last) = 2;
  /// Metric that ranks checkpoints: "" (none), "val_loss", "val_accuracy" or
  /// "loss" (the training loss). Only rank-reduced metrics: all ranks agree.
  TORCH_ARG(std::string, monitor) = "";
  TORCH_ARG(MonitorMode, mode) = MonitorMode::kMin;
  /// With a monitor: keep the k best checkpoints by it (>= 1); keep_last
  /// pruning never deletes them.
  TORCH_ARG(int64_t, save_top_k) = 1;
  /// --checkpoint-async: each save snapshots the state into host memory and
  /// a thread writes it (trainer/checkpoint.h, AsyncCheckpointSave, sharded
  /// format); the loop goes on, and the checkpoint is published at the first
  /// step end where every rank's file is written. The next save, and fit's
  /// end, wait for the previous one.
  TORCH_ARG(bool, async_write) = false;
};

/// How long one save held the step loop, and how long its write took.
struct CheckpointTiming {
  int64_t step = 0;
  double blocked_s = 0.0;  ///< in the loop: snapshot, waiting, publishing
  double write_s = 0.0;    ///< the data write (async: on its thread)
  double finish_s = 0.0;   ///< async: of blocked_s, completing and publishing it (collectives, metadata, rename)
  bool async = false;
};

/// The metrics ModelCheckpointOptions::monitor accepts (besides "").
std::vector<std::string> checkpoint_monitor_names();

class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options);

  std::string name() const override { return "ModelCheckpoint"; }

  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;
  void on_validation_end(Trainer& trainer, TrainingModule& module, const ValidationMetrics& metrics) override;
  void on_train_step_end(Trainer& trainer, TrainingModule& module, int64_t step) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;
  /// The best-k list, the last saved step and whether the warning was given.
  std::string state_dict() const override;
  void load_state_dict(const std::string& state) override;

  /// Collective: writes <dirpath>/step-<step> as described above (all ranks).
  void save(Trainer& trainer, int64_t step);

  /// Path of the newest checkpoint this callback wrote ("" if none).
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  /// Step of that checkpoint (-1 if none).
  int64_t last_saved_step() const { return last_saved_step_; }
  /// (score, step) of the best checkpoints, best first (at most save_top_k).
  const std::vector<std::pair<double, int64_t>>& best() const { return best_; }
  /// One entry per save, in order.
  const std::vector<CheckpointTiming>& timings() const { return timings_; }
  /// Warnings given so far (at most one: the monitored metric is missing).
  const std::vector<std::string>& warnings() const { return warnings_; }

 protected:
  /// Writes the checkpoint's content into `dir` on this rank; the default
  /// calls trainer.save_checkpoint(dir). A seam for tests and for callbacks
  /// that save something else (e.g. weights only).
  virtual void write_checkpoint(Trainer& trainer, const std::string& dir);

 private:
  /// Records the monitored value measured at `step`.
  void observe(int64_t step, double value);
  /// True when a checkpoint scoring `value` belongs among the best k.
  bool enters_top_k(double value) const;
  void warn(Trainer& trainer, const std::string& message);
  /// <dirpath>/.step-<step>.tmp, where a save writes before publish().
  std::filesystem::path tmp_dir(int64_t step) const;
  /// Collective: completes the pending async save and publishes it.
  void finish_pending(Trainer& trainer);
  /// Collective: renames tmp to step-<step>, prunes, updates "best".
  void publish(Trainer& trainer, int64_t step);
  /// Collective: removes the partial copy, then throws one error naming the
  /// step and the newest complete checkpoint.
  [[noreturn]] void fail_save(Trainer& trainer, int64_t step, const CheckpointWriteError& e);

  ModelCheckpointOptions options_;
  std::string last_checkpoint_;
  int64_t last_saved_step_ = -1;
  std::optional<std::pair<double, int64_t>> current_;  ///< (value, step) last measured
  std::vector<std::pair<double, int64_t>> best_;
  std::vector<std::string> warnings_;
  std::unique_ptr<AsyncCheckpointSave> pending_;  ///< an async save not yet published
  std::vector<CheckpointTiming> timings_;
};

/// "step-<step>"
std::string checkpoint_dir_name(int64_t step);

/// N of a path whose last component is step-<N>; -1 otherwise.
int64_t checkpoint_step(const std::string& path);

/// The step-<N> directories directly under `dir`, oldest (smallest N) first;
/// empty if `dir` does not exist. Other entries (.step-<N>.tmp, files) are ignored.
std::vector<std::string> find_checkpoints(const std::string& dir);

/// The newest step-<N> directory under `dir`, or "" if there is none.
std::string latest_checkpoint(const std::string& dir);

/// The newest step-<N> directory under `dir` that is a complete checkpoint
/// (checkpoint_incomplete_reason; with `verify_data`, every data block's CRC
/// too: checkpoint_corrupt_reason), or "" if none is; each newer one passed
/// over is appended to `skipped` as "<path>: <why>". What --resume auto loads.
std::string newest_complete_checkpoint(const std::string& dir, std::vector<std::string>* skipped = nullptr,
                                       bool verify_data = false);

/// Deletes every step-<N> directory under `dir` that is neither among the
/// newest `keep_last` (keep_last <= 0 keeps all) nor one of `keep_steps`;
/// returns the deleted paths, oldest first.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last,
                                           const std::set<int64_t>& keep_steps = {});

}  // namespace strata
