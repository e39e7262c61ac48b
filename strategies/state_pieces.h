#pragma once
// The pieces of state a strategy partitions, saves and loads, from geometry
// to file, in one place:
//   ShardPiece  -- geometry: which run of a parameter lies in a rank's shard
//                  of a FlatLayout (oss, sdp, fsdp's units);
//   ParamPiece  -- a live 1-D view of such a run (or a whole parameter) that
//                  a strategy holds, writes or steps (Strategy::param_pieces,
//                  optimizer_param_pieces);
//   StatePiece  -- a ParamPiece (or optimizer state of one) named for the
//                  checkpoint, independent of strategy and world size
//                  (Strategy::state_pieces, implemented in strategy_state.cpp;
//                  trainer/checkpoint.h writes and reads them).
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace strata {

/// The part of one parameter that lies in one rank's shard.
struct ShardPiece {
  size_t param_index;    ///< index into the params given to FlatLayout
  int64_t param_offset;  ///< first element within the (flattened) parameter
  int64_t flat_offset;   ///< first element in the flat index space
  int64_t numel;
};

/// Part of a strategy's trainable parameter params()[index]: flattened
/// elements [offset, offset + values.numel()), `values` a 1-D view of them.
struct ParamPiece {
  size_t index;
  int64_t offset;
  torch::Tensor values;
};

/// Part of a parameter a strategy does not train (a frozen one), by name:
/// flattened elements [offset, offset + values.numel()) of `name` (global
/// `shape`), `values` a live 1-D view (Strategy::frozen_pieces).
struct NamedPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  torch::Tensor values;
};

/// Whether state pieces are wanted for writing a checkpoint or for filling
/// from one (Strategy::state_pieces).
enum class StateUse { kSave, kLoad };

/// One stored piece of a logical state tensor: elements [lo, lo +
/// values.numel()) of the flattened tensor `name` (global `shape`). Names:
/// "model/<qualified name>" for parameters and buffers, "optim/<parameter
/// name>/<key>" for optimizer state (exp_avg, exp_avg_sq, step, ...), keyed by
/// the parameter's name so any strategy's inner optimizer (whole tensors, 1-D
/// pieces, FSDP flat shards) maps to it.
struct StatePiece {
  std::string name;
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat;
  int64_t lo = 0;
  /// A live 1-D view (kSave: read; kLoad: written in place, cast to its dtype).
  torch::Tensor values;
  /// For state not held as a tensor (AdamW's step count): called with
  /// `values` once they are loaded.
  std::function<void(const torch::Tensor&)> on_loaded;
  /// Offloaded state (`values` undefined): `numel` elements of `dtype` that
  /// live outside memory (an offload tier), moved in chunks: read(offset,
  /// dst) fills `dst` (a contiguous CPU tensor of `dtype`) with elements
  /// [offset, offset + dst.numel()) of the piece, write(offset, src) stores
  /// them. Checkpoints stream such pieces through a bounded buffer, so
  /// resident memory does not grow with the model.
  int64_t numel = 0;
  std::function<void(int64_t, const torch::Tensor&)> read;
  std::function<void(int64_t, const torch::Tensor&)> write;

  bool streamed() const { return !values.defined(); }
  int64_t size() const { return streamed() ? numel : values.numel(); }
};

/// Elements of a streamed piece moved at once (4 MiB of fp32: one CRC block).
constexpr int64_t kStreamChunkNumel = int64_t{1} << 20;

}  // namespace strata
