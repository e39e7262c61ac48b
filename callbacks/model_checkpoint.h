#pragma once
// ModelCheckpoint: resumable checkpoints <dirpath>/step-<N> every n steps and
// at fit end, keeping the newest `keep_last`.
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
//      replacing an older step-<N>) and prunes all but the newest keep_last
//      step-* directories.
// A crash before 4 leaves only the hidden .tmp directory, which neither
// find_checkpoints() nor prune_checkpoints() treat as a checkpoint.
//
// Example:
//   std::make_shared<strata::ModelCheckpoint>(
//       strata::ModelCheckpointOptions("runs/gpt/ckpt").every_n_train_steps(500).keep_last(3));
//   resume: TrainerOptions().resume_from(strata::latest_checkpoint("runs/gpt/ckpt"))
#include "trainer/callback.h"

#include <torch/torch.h>

#include <cstdint>
#include <string>
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
};

class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options);

  std::string name() const override { return "ModelCheckpoint"; }

  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;

  /// Collective: writes <dirpath>/step-<step> as described above (all ranks).
  void save(Trainer& trainer, int64_t step);

  /// Path of the newest checkpoint this callback wrote ("" if none).
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  /// Step of that checkpoint (-1 if none).
  int64_t last_saved_step() const { return last_saved_step_; }

 protected:
  /// Writes the checkpoint's content into `dir` on this rank; the default
  /// calls trainer.save_checkpoint(dir). A seam for tests and for callbacks
  /// that save something else (e.g. weights only).
  virtual void write_checkpoint(Trainer& trainer, const std::string& dir);

 private:
  ModelCheckpointOptions options_;
  std::string last_checkpoint_;
  int64_t last_saved_step_ = -1;
};

/// "step-<step>"
std::string checkpoint_dir_name(int64_t step);

/// The step-<N> directories directly under `dir`, oldest (smallest N) first;
/// empty if `dir` does not exist. Other entries (.step-<N>.tmp, files) are ignored.
std::vector<std::string> find_checkpoints(const std::string& dir);

/// The newest step-<N> directory under `dir`, or "" if there is none.
std::string latest_checkpoint(const std::string& dir);

/// Deletes all but the newest `keep_last` step-<N> directories under `dir`
/// (keep_last <= 0 keeps all) and returns the deleted paths, oldest first.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last);

}  // namespace strata
