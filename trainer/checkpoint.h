#pragma once
// Resumable checkpoints: a directory holding
//   model.pt            rank 0's parameters and buffers (full; every strategy
//                       here keeps full parameters on every rank)
//   optimizer-rank<R>-of-<N>.pt   one per rank when the optimizer is sharded,
//                       else optimizer.pt written by rank 0
//   trainer.pt          step counter and metadata
// Sharded optimizer state must be loaded at the same world size (checked).
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

namespace strata {

struct CheckpointMeta {
  int64_t step = 0;
  int world_size = 1;
  std::string strategy;
  bool sharded_optimizer = false;
  std::string optimizer = "adamw";  ///< TrainerOptions::optimizer: state is not interchangeable
  /// Named opaque blobs saved and restored verbatim (the trainer's RNG states,
  /// each callback's state_dict(), the data position): key -> bytes.
  std::map<std::string, std::string> state;
};

/// Every rank calls this; rank 0 writes the shared files.
void save_checkpoint(const std::string& dir, torch::nn::Module& module,
                     const torch::optim::Optimizer& optimizer, const CheckpointMeta& meta,
                     int rank);

/// Loads into an already set-up module and optimizer; returns the metadata.
/// Errors name the directory and the mismatching value (missing files, a
/// different world size for sharded state, a different strategy family).
CheckpointMeta load_checkpoint(const std::string& dir, torch::nn::Module& module,
                               torch::optim::Optimizer& optimizer, const CheckpointMeta& expected,
                               int rank);

}  // namespace strata
