#pragma once
// Resumable checkpoints that load under any strategy at any world size.
//
// A checkpoint is a directory:
//   shard-<r>-of-<n>.bin   format "sharded": raw bytes of what rank r saved
//   full.bin               format "full": rank 0's consolidated state
//   metadata.json          written last, by rank 0, once every data file is
//                          on disk: the trainer meta (step, world size,
//                          strategy, optimizer, format, the `state` blobs in
//                          base64) and every logical tensor — global name
//                          ("model/<qualified name>", "optim/<param>/exp_avg",
//                          ".../exp_avg_sq", ".../step"), global shape, dtype,
//                          and its stored pieces (file, byte offset, flat
//                          element range [lo, hi)) — plus a CRC32 of each
//                          4 MiB block of each data file and a CRC32 of its
//                          own body.
// What a rank saves and loads is its strategy's business
// (Strategy::state_pieces): replicated state once, sharded state by its
// owner; on load each rank reads only the block-aligned byte ranges that
// overlap the pieces it holds (pread) and verifies each block's CRC, so a
// bit flip or a truncated file is one error naming the file. Data files and
// the directory are fsync'd; metadata.json is written after every rank's data
// is on disk, so a directory without it is no checkpoint.
// Format "full": rank 0 writes one file, gathered one logical tensor at a
// time (a reduce of that tensor's pieces), so no rank holds more than its own
// state plus one full tensor.
#include "strata/strategies/strategy.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace strata {

struct CheckpointMeta {
  int64_t step = 0;
  int world_size = 1;
  std::string strategy;
  std::string optimizer = "adamw";  ///< TrainerOptions::optimizer: state is not interchangeable
  /// "full" or "sharded" (checkpoint_formats()).
  std::string format = "sharded";
  /// Named opaque blobs saved and restored verbatim (the trainer's RNG states,
  /// each callback's state_dict(), the data position): key -> bytes.
  std::map<std::string, std::string> state;
};

/// {"full", "sharded"}
std::vector<std::string> checkpoint_formats();

/// What a save wrote (this rank) and how long it took.
struct CheckpointSaveStats {
  int64_t bytes_written = 0;  ///< data bytes this rank wrote (metadata not counted)
  double seconds = 0.0;
};

/// What save_checkpoint throws, on every rank alike, when any rank could not
/// write (a full disk, an unwritable directory): the ranks agreed on it, so
/// a caller may still run collectives (clean up, then fail).
class CheckpointWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Collective: every rank calls it. Writes `strategy`'s state and
/// `optimizer`'s into `dir` (created if missing) in meta.format; returns when
/// metadata.json is on disk (every rank), or throws CheckpointWriteError on
/// every rank.
CheckpointSaveStats save_checkpoint(const std::string& dir, Strategy& strategy,
                                    torch::optim::Optimizer& optimizer, const CheckpointMeta& meta);

/// --checkpoint-async: save_checkpoint's sharded format, split so the step
/// loop need not wait for the disk. The constructor (collective: the
/// strategy's state pieces) copies what this rank saves into host memory
/// (one copy of its state) and starts a thread writing it to the rank's
/// file (file I/O only, no collective). finish() (collective) waits for the
/// thread, then completes the checkpoint exactly as save_checkpoint does
/// (rank 0 writes metadata.json once every rank's file is on disk), or
/// throws CheckpointWriteError on every rank. Training may go on between the
/// two, collectives included: the thread issues none.
class AsyncCheckpointSave {
 public:
  /// `before_write` (tests): called on the thread before it writes, e.g. to
  /// hold the write back while training changes the state.
  AsyncCheckpointSave(const std::string& dir, Strategy& strategy, torch::optim::Optimizer& optimizer,
                      CheckpointMeta meta, std::function<void()> before_write = nullptr);
  ~AsyncCheckpointSave();
  AsyncCheckpointSave(const AsyncCheckpointSave&) = delete;
  AsyncCheckpointSave& operator=(const AsyncCheckpointSave&) = delete;

  /// This rank's file is written (or its write failed); local, no collective.
  bool written() const { return written_.load(); }
  int64_t step() const { return step_; }
  /// Collective. stats.seconds: the thread's write time.
  CheckpointSaveStats finish(Comm& comm);

 private:
  std::filesystem::path dir_;
  int64_t step_;
  int rank_, world_;
  nlohmann::json body_;
  std::vector<StatePiece> pieces_;
  std::string error_;
  nlohmann::json index_;
  CheckpointSaveStats stats_;
  std::atomic<bool> written_{false};
  std::thread thread_;
};

/// Collective: loads a checkpoint of either format, written by any strategy
/// at any world size, into the set-up `strategy` and its `optimizer`;
/// returns the saved meta. Errors: a missing or corrupt file (naming it), a
/// different optimizer kind than expected.optimizer, a different model (one
/// error listing the missing, unexpected and wrongly shaped tensors).
CheckpointMeta load_checkpoint(const std::string& dir, Strategy& strategy, torch::optim::Optimizer& optimizer,
                               const CheckpointMeta& expected);

/// Consolidates, in this process alone (no strategy, no collective), every
/// logical tensor whose name starts with `prefix` (e.g. "model/": the
/// parameters and buffers) from a checkpoint of either format: whole tensors
/// by name with the prefix removed, each block read verified. For export
/// tools (strata-export); errors as load_checkpoint's.
std::map<std::string, torch::Tensor> read_checkpoint_tensors(const std::string& dir, const std::string& prefix);

/// Reads and verifies metadata.json alone (the meta, not the tensors).
CheckpointMeta read_checkpoint_meta(const std::string& dir);

/// Why `dir` is not a complete checkpoint, or "" when it is: metadata.json
/// present and intact (its CRC), and every data file it names present with
/// the size it records. Reads no tensor data (a load verifies each block's
/// CRC as it reads); catches a save cut short and a truncated or missing file.
std::string checkpoint_incomplete_reason(const std::string& dir);

/// checkpoint_incomplete_reason's, and then every block of every data file
/// read once (4 MiB at a time) and checked against its CRC: "" when the
/// checkpoint is intact, else why, naming the file and the block. What
/// --resume auto asks before it picks a checkpoint: a bit flipped on disk
/// is found before the job resumes, not as a failed load on every restart.
std::string checkpoint_corrupt_reason(const std::string& dir);

/// Reads metadata.json alone and raises load_checkpoint's errors that need no
/// strategy: not a complete checkpoint, another optimizer kind than
/// `optimizer`, or other model tensors than `model` (qualified name -> shape
/// of every parameter and buffer). For checking a --resume before a run
/// writes anything.
void check_checkpoint_model(const std::string& dir, const std::map<std::string, std::vector<int64_t>>& model,
                            const std::string& optimizer);

/// Test-only fault injection: when the environment variable
/// STRATA_CHECKPOINT_KILL_AT is "<point>[@<rank>][/<step>]" and matches, the
/// process raise(SIGKILL)s itself here. Points: "after-shard" (this rank's
/// data file is written), "before-metadata" (rank 0, all data on disk),
/// "before-rename" (ModelCheckpoint, before publishing).
void checkpoint_kill_point(const std::string& point, int rank, int64_t step);

}  // namespace strata
