#pragma once
// FlightRecorder: each rank's last N collectives, for naming the rank and the
// collective a hung or broken job is stuck at (what PyTorch's NCCL flight
// recorder does, for Gloo and NCCL alike).
//
// Comm records every collective it issues: a sequence number per process
// group (the same count on every member, since all members issue a group's
// collectives in the same order), the op, dtype, bytes, the label the issuer
// set (a phase or unit: "unit 5 backward"), and when it started and finished
// (wait() returned). A ring buffer of `capacity` entries: the newest win.
// Thread-safe (a mutex; backward hooks and the main thread both issue).
//
// diagnose() reads every rank's dump and says in one line what went wrong:
//   "rank 3 never entered collective #1204 of group 'world' (reduce_scatter,
//    unit 5 backward, 3.1 MiB); ranks 0-2 have waited in it for 12.4 s"
//   "at #88 of group 'world' rank 1 called all_gather 4 MiB; ranks 0, 2, 3
//    called reduce_scatter 4 MiB"
//
// Example:
//   auto recorder = std::make_shared<strata::FlightRecorder>();
//   strata::Comm comm(pg, device, make_subgroup, recorder);
//   ... on a timeout: write recorder->dump(rank, world) to a file;
//   strata::diagnose_flight_dumps(dumps) -> one line.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

/// One collective as a rank saw it.
struct CollectiveRecord {
  std::string group;       ///< "world", or a subgroup's name
  int64_t seq = 0;         ///< 1, 2, ... per group
  std::string op;          ///< collective_name(): "all_reduce", "reduce_scatter", ...
  std::string dtype;       ///< "Float", "BFloat16", ...
  int64_t bytes = 0;       ///< the input's bytes (all-gather: this rank's shard; reduce-scatter: the full input)
  std::string label;       ///< what issued it: "<phase>, <unit>" ("" when nobody said)
  int64_t start_ns = 0;    ///< steady clock when issued
  int64_t end_ns = -1;     ///< when its wait() returned; -1: still in flight
  int peer = -1;           ///< a send's or receive's other rank (the world's numbering); -1: a collective
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 2048);

  /// Records a collective issued now; returns its id for finish(). `group`'s
  /// sequence number advances by one.
  int64_t start(const std::string& group, const std::string& op, const std::string& dtype, int64_t bytes,
                int peer = -1);
  /// Its wait() returned (an id the ring buffer has since dropped is ignored).
  void finish(int64_t id);

  /// What the next collectives are issued for. Two parts, joined in each
  /// record's label as "<phase>, <label>": the phase the trainer is in
  /// ("step 12 backward"), which also clears the label, and what a strategy
  /// issues a collective for ("unit h5", "bucket 3"). "" clears either.
  void set_phase(std::string phase);
  void set_label(std::string label);
  /// The label the next record gets.
  std::string label() const;

  /// Changes with every start() and finish(): a dump written at one version
  /// need not be written again while it holds.
  int64_t version() const;

  /// The entries held, oldest first.
  std::vector<CollectiveRecord> records() const;
  size_t capacity() const { return capacity_; }

  /// JSON text {"rank", "world_size", "now_ns", "capacity", "records": [...]}:
  /// what a rank writes on a timeout, a failure or SIGUSR1.
  std::string dump(int rank, int world_size) const;

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  mutable std::mutex mutex_;
  size_t capacity_;
  std::vector<CollectiveRecord> ring_;  ///< slot id % capacity_
  int64_t next_id_ = 0;
  int64_t finished_ = 0;  ///< finish() calls
  std::unordered_map<std::string, int64_t> seq_;  ///< group -> last sequence number
  std::string phase_;
  std::string label_;
  std::string joined_;  ///< phase_ and label_ as records carry them
};

/// One line naming what went wrong, from the dumps of a world's ranks (each
/// FlightRecorder::dump; ranks missing from `dumps` are named as such): a rank
/// that never entered the collective the others wait in, ranks that called
/// different collectives at the same sequence number, or, when neither, the
/// collective the most ranks are in flight in (or that none is).
/// Throws c10::Error naming the problem for text that is not such a dump.
std::string diagnose_flight_dumps(const std::vector<std::string>& dumps);

}  // namespace strata
