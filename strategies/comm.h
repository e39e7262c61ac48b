#pragma once
// Comm: a thin, non-virtual wrapper over an injected c10d::ProcessGroup.
//
// Every collective a strategy issues goes through here, so that
//  * Gloo's missing collectives (flat all-gather, reduce-scatter in LibTorch 1.13)
//    are emulated in one place with the cheapest primitive Gloo has, and
//  * bytes sent per collective kind are counted for the benchmarks (2Ψ vs 3Ψ),
//  * and every collective is recorded in a FlightRecorder (flight_recorder.h):
//    its sequence number in its group, op, dtype, bytes, label, start and end.
//
// A default-constructed Comm is a world of one: every collective is the identity
// and nothing is counted. Comm is cheap to copy; copies share the process group
// and the byte counters.
//
// Example:
//   strata::Comm comm(pg);
//   comm.all_reduce(t);                       // in place, SUM
//   auto w = comm.reduce_scatter_async(out, flat_in);  ... w.wait();
#include "strata/strategies/flight_recorder.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace strata {

enum class CollectiveKind : int {
  kAllReduce = 0,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kBarrier,
  kSend,  // point-to-point (send_async), counted by the sender
  kCount
};

/// Name used in reports: "all_reduce", "broadcast", ...
const char* collective_name(CollectiveKind kind);

/// Bytes this rank sent, per collective kind, under the bandwidth-optimal
/// algorithm for each collective (ring all-reduce: 2(N-1)/N·S; broadcast and
/// reduce: S on the root's side of a tree counted once per non-root rank / N;
/// all-gather and reduce-scatter: (N-1)/N·S where S is the full flat size).
/// These are the numbers the ZeRO paper's 2Ψ / 3Ψ refer to.
struct CommBytes {
  std::array<int64_t, static_cast<int>(CollectiveKind::kCount)> sent{};
  std::array<int64_t, static_cast<int>(CollectiveKind::kCount)> calls{};
  int64_t total_sent() const;
  int64_t operator[](CollectiveKind k) const { return sent[static_cast<int>(k)]; }
};

/// A collective in flight. wait() blocks until it has finished and then runs the
/// completion step of an emulated collective (e.g. the local sum after an
/// all-to-all). A default-constructed PendingWork is already complete.
class PendingWork {
 public:
  PendingWork() = default;
  /// `wait_ns`: where wait() adds the nanoseconds it spends blocked (the
  /// issuing Comm's counter; null: not counted).
  PendingWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> on_complete = {},
              std::shared_ptr<std::atomic<int64_t>> wait_ns = nullptr);
  /// Several collectives that together make one (an emulated all-gather's
  /// broadcasts), waited in order.
  PendingWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> on_complete = {},
              std::shared_ptr<std::atomic<int64_t>> wait_ns = nullptr);
  PendingWork(PendingWork&&) noexcept = default;
  /// Waits for what this handle still holds before taking `other`'s (as the
  /// destructor does): the tensors a collective writes into must outlive it.
  PendingWork& operator=(PendingWork&& other) noexcept;
  PendingWork(const PendingWork&) = delete;
  PendingWork& operator=(const PendingWork&) = delete;
  ~PendingWork();

  /// Blocks until done; rethrows the collective's error (timeout, peer gone).
  void wait();
  /// wait(), an error reported as a warning instead of thrown (the destructor's).
  void finish_before_drop() noexcept;
  bool pending() const { return !works_.empty() || on_complete_; }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::function<void()> on_complete_;
  std::shared_ptr<std::atomic<int64_t>> wait_ns_;
};

/// Builds the process group of one subgroup (Comm::split). `key`: the same on
/// every member and unique in the world (it prefixes the group's rendezvous
/// keys in the world's store); `rank` / `size`: this rank's place in the
/// subgroup. Every member calls it; it blocks until all have connected.
using SubgroupFactory = std::function<c10::intrusive_ptr<c10d::ProcessGroup>(
    const std::string& key, int rank, int size)>;

class Comm {
 public:
  /// A world of one on `device`: rank 0, size 1, every collective is the identity.
  explicit Comm(torch::Device device = torch::kCPU);
  /// `device`: where this rank's model and collective tensors live (c10d's
  /// NCCL groups take CUDA tensors only; Gloo takes CPU tensors).
  explicit Comm(c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                torch::Device device = torch::kCPU);
  /// As above, and able to split() into subgroups made by `make_subgroup`
  /// (process_group.h: subgroup_factory over the world's store).
  Comm(c10::intrusive_ptr<c10d::ProcessGroup> process_group, torch::Device device,
       SubgroupFactory make_subgroup);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_distributed() const { return static_cast<bool>(pg_); }
  const torch::Device& device() const { return device_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }

  /// In place on every rank.
  void all_reduce(torch::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM);
  PendingWork all_reduce_async(torch::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM);

  /// In place: every rank ends with root's values.
  void broadcast(torch::Tensor& tensor, int root);
  PendingWork broadcast_async(torch::Tensor& tensor, int root);

  /// In place on the root; other ranks' tensors are unspecified afterwards.
  void reduce(torch::Tensor& tensor, int root, c10d::ReduceOp op = c10d::ReduceOp::SUM);
  PendingWork reduce_async(torch::Tensor& tensor, int root, c10d::ReduceOp op = c10d::ReduceOp::SUM);

  /// output (contiguous, numel == size() * input.numel()) receives every rank's
  /// input, rank r at [r*n, (r+1)*n). Emulated for Gloo with one broadcast per
  /// rank, each straight into its chunk of `output`: no staging buffer and no
  /// copy (Gloo's list all-gather allocates a flat N·n buffer per call and
  /// copies out of it); two ranks swap their inputs in one all-to-all instead.
  /// Each rank sends (N-1)/N of the output in all.
  void all_gather_into(torch::Tensor& output, const torch::Tensor& input);
  PendingWork all_gather_into_async(torch::Tensor& output, const torch::Tensor& input);

  /// input (contiguous, numel == size() * output.numel()); output receives the
  /// SUM over ranks of input chunk rank(). Emulated for Gloo with one all-to-all
  /// of the chunks followed by a local sum: each rank sends (N-1)/N of the input,
  /// the bandwidth-optimal amount, never a full all-reduce. `workspace`
  /// (optional; numel and dtype of `input`) receives the all-to-all (row r:
  /// rank r's copy of this rank's chunk; with two ranks only the peer's row is
  /// written, the own chunk being read from `input`), so a caller that reuses
  /// buffers avoids a fresh allocation per call.
  void reduce_scatter(torch::Tensor& output, const torch::Tensor& input);
  PendingWork reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input,
                                   const torch::Tensor& workspace = {});

  void barrier();

  /// Point-to-point: `tensor` (contiguous, any dtype: raw bytes) to rank
  /// `dst`, which takes it with recv_async(tensor of the same size, src = this
  /// rank, the same tag). Messages between one pair with the same tag arrive
  /// in the order sent. The sender counts the tensor's bytes (kind "send").
  PendingWork send_async(const torch::Tensor& tensor, int dst, int tag = 0);
  PendingWork recv_async(torch::Tensor& tensor, int src, int tag = 0);

  /// Whether split() can build subgroups of more than one rank.
  bool can_split() const { return static_cast<bool>(make_subgroup_); }
  /// Partitions this Comm's ranks into `groups` (each rank in exactly one; a
  /// group's order gives its members' subgroup ranks) and returns the Comm of
  /// the group holding this rank. Collective: every rank calls it with the same
  /// `name` and `groups`, and all ranks make their splits in the same order
  /// (the split's sequence number is part of the rendezvous key). The result
  /// shares this Comm's byte counters: subgroup traffic counts with the rest.
  Comm split(const std::string& name, const std::vector<std::vector<int>>& groups) const;

  /// The recorder of this Comm's collectives, shared by all copies and
  /// subgroups (a world of one records nothing: it issues no collective);
  /// null when recording is off.
  FlightRecorder* flight_recorder() const { return counters_->recorder.get(); }
  /// Replaces the recorder for this Comm, its copies and subgroups; null
  /// turns recording off. Call before the first collective.
  void set_flight_recorder(std::shared_ptr<FlightRecorder> recorder) { counters_->recorder = std::move(recorder); }
  /// FlightRecorder::set_phase / set_label, when recording is on.
  void set_flight_phase(std::string phase) const;
  void set_flight_label(std::string label) const;
  /// Testing aid: this rank does not issue its `seq`-th collective of group
  /// "world" (1-based; 0: none), and does not record it, as a rank with a
  /// bug in its control flow would. The other ranks wait, or pair the next
  /// collective with the wrong one; the flight recorder names the mismatch.
  void skip_collective_for_testing(int64_t seq) { counters_->skip_seq = seq; }
  /// This Comm's group in the recorder: "world", or a subgroup's
  /// "<split name>/<group index>".
  const std::string& group_name() const { return group_name_; }
  /// Rank `r` of this Comm in the world's numbering (a subgroup's members
  /// are the world's ranks it was split from): what the flight recorder
  /// names a send's or receive's peer by.
  int world_rank_of(int r) const { return world_ranks_ ? (*world_ranks_)[size_t(r)] : r; }

  /// Byte counters shared by all copies of this Comm.
  CommBytes bytes() const;
  void reset_bytes();
  /// Seconds this rank spent blocked in PendingWork::wait() and barrier()
  /// (blocking collectives wait too), summed over every thread that waited;
  /// shared by all copies and subgroups. The step-time split subtracts it
  /// from the phase it happened in.
  double wait_seconds() const;

 private:
  /// Counts `sent` bytes under `kind` and records the collective on `tensor`
  /// in the flight recorder; returns the record's id for pending() (-1: not
  /// recorded), or kSkipped: the caller issues nothing (the testing aid).
  int64_t count(CollectiveKind kind, int64_t sent, const torch::Tensor& tensor, int peer = -1);
  static constexpr int64_t kSkipped = -2;

  /// Wraps a started collective so that waiting on it is timed and its
  /// flight record (`record`) is marked finished when the wait returns.
  PendingWork pending(c10::intrusive_ptr<c10d::Work> work, int64_t record,
                      std::function<void()> on_complete = {}) const;
  PendingWork pending(std::vector<c10::intrusive_ptr<c10d::Work>> works, int64_t record,
                      std::function<void()> on_complete = {}) const;

  struct Counters {
    std::array<std::atomic<int64_t>, static_cast<int>(CollectiveKind::kCount)> sent{};
    std::array<std::atomic<int64_t>, static_cast<int>(CollectiveKind::kCount)> calls{};
    std::shared_ptr<std::atomic<int64_t>> wait_ns = std::make_shared<std::atomic<int64_t>>(0);
    std::shared_ptr<FlightRecorder> recorder = std::make_shared<FlightRecorder>();
    std::atomic<int64_t> world_issued{0};  ///< collectives of group "world" so far
    int64_t skip_seq = 0;                  ///< skip_collective_for_testing
  };

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int rank_ = 0;
  int size_ = 1;
  torch::Device device_ = torch::kCPU;
  std::shared_ptr<Counters> counters_;
  SubgroupFactory make_subgroup_;
  std::string key_ = "strata/split";        // this group's rendezvous key; subgroups extend it
  std::string group_name_ = "world";
  std::shared_ptr<const std::vector<int>> world_ranks_;  // null: this Comm is the world
  std::shared_ptr<int> splits_ = std::make_shared<int>(0);  // splits made so far, shared by copies
};

}  // namespace strata
