#pragma once
// OffloadTier: where sharded training state lives between uses (ZeRO-Offload's
// host memory, ZeRO-Infinity's disk), as fixed-size byte regions that are
// read into and written from contiguous CPU tensors.
//
//  - DiskTier: one file per tier in a directory (--offload-dir). The file is
//    created unnamed (O_TMPFILE; where the filesystem lacks it, created and
//    unlinked at once), so it disappears whenever the process ends: normal
//    exit, an error, SIGTERM/SIGINT, even SIGKILL. Its space is reserved up
//    front (posix_fallocate), so a full disk fails at setup with the
//    directory's name, not minutes later in the middle of a step. Reads and
//    writes are pread/pwrite: thread-safe, the page cache does the rest.
//  - HostTier: pinned host memory beside a CUDA device (copies to and from it
//    can run asynchronously); only where LibTorch has CUDA.
// Both go through the same interface, so the code that streams state through
// a bounded staging buffer (fsdp/offload.h) is one code path; the disk tier
// is the one this CPU-only machine exercises.
//
// IoQueue: one background thread running reads and writes in submission
// order, so the next chunk's read overlaps the current chunk's compute.
#include "strata/strategies/state_pieces.h"

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata {

/// Where offloaded state lives between uses: memory (none), pinned host
/// memory beside a CUDA device (cpu), or an unnamed file in a directory
/// (disk). fsdp offloads its parameter shards, their gradients and the
/// optimizer state (fsdp/offload.h); single, ddp, oss and sdp the optimizer
/// state (offloaded_moments.h).
enum class OffloadKind { kNone, kCpu, kDisk };

/// "none", "cpu", "disk"; anything else is an error listing them.
OffloadKind parse_offload(const std::string& name);
std::string to_string(OffloadKind kind);

/// Elements per staged chunk of a streamed optimizer step (1 MiB per fp32
/// transfer; the staging holds a few such buffers, twice).
constexpr int64_t kDefaultOffloadChunkNumel = int64_t{1} << 18;

/// Errors (exit-2 kind, naming the values) for an offload that cannot work
/// on `device`: cpu with a device whose state is already in host memory,
/// disk without a directory.
void check_offload_kind(OffloadKind kind, const std::string& dir, const torch::Device& device);

/// What went through a tier so far (all threads).
struct OffloadIoStats {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  double seconds = 0.0;  ///< time spent inside reads and writes, summed over threads
};

class OffloadTier {
 public:
  /// A reserved range of the tier; `nbytes` is its size.
  struct Region {
    int64_t id = -1;
    int64_t nbytes = 0;
  };

  virtual ~OffloadTier() = default;
  OffloadTier() = default;
  OffloadTier(const OffloadTier&) = delete;
  OffloadTier& operator=(const OffloadTier&) = delete;

  /// Reserves `nbytes` (zero-filled). Called during setup, from one thread.
  virtual Region allocate(int64_t nbytes) = 0;
  /// Copies region bytes [byte_offset, byte_offset + dst.nbytes()) into `dst`
  /// (a contiguous CPU tensor). Thread-safe for disjoint destinations.
  void read(const Region& region, int64_t byte_offset, const torch::Tensor& dst);
  /// Copies `src` (contiguous CPU) into the region at `byte_offset`.
  /// Thread-safe for disjoint ranges.
  void write(const Region& region, int64_t byte_offset, const torch::Tensor& src);

  /// Bytes reserved so far.
  int64_t bytes() const { return bytes_; }
  OffloadIoStats stats() const;
  /// "disk (/path)" or "pinned host memory".
  virtual std::string describe() const = 0;

 protected:
  virtual void read_bytes(const Region& region, int64_t byte_offset, void* dst, int64_t nbytes) = 0;
  virtual void write_bytes(const Region& region, int64_t byte_offset, const void* src, int64_t nbytes) = 0;
  int64_t bytes_ = 0;

 private:
  /// The tensor's byte count, after checking it fits the region at byte_offset.
  int64_t check_range(const Region& region, int64_t byte_offset, const torch::Tensor& t,
                      const char* what) const;
  std::atomic<int64_t> bytes_read_{0};
  std::atomic<int64_t> bytes_written_{0};
  std::atomic<int64_t> nanoseconds_{0};
};

/// A tier in an unnamed file inside `dir` (see above). Fails, naming `dir`,
/// when it does not exist, is not a writable directory, or (at allocate())
/// has no space left.
std::unique_ptr<OffloadTier> make_disk_tier(const std::string& dir);
/// A tier in pinned host memory: only where LibTorch has CUDA (an error
/// naming the reason otherwise).
std::unique_ptr<OffloadTier> make_host_tier();

/// make_disk_tier(dir) or make_host_tier() for `kind` (not kNone).
std::unique_ptr<OffloadTier> make_offload_tier(OffloadKind kind, const std::string& dir);

/// One-line reason why `dir` cannot hold a disk tier (missing, not a
/// directory, not writable), or "" when it can: creates and drops an unnamed
/// probe file, so nothing is left behind either way.
std::string disk_tier_problem(const std::string& dir);
/// Bytes free for an unprivileged writer on the filesystem holding `dir`.
int64_t free_bytes_at(const std::string& dir);

/// Runs tasks on one background thread in submission order (FIFO: a read
/// submitted after a write to the same buffer sees the write done).
class IoQueue {
 public:
  IoQueue();
  ~IoQueue();  ///< finishes the queued tasks, then joins
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  /// Queues `task`; the future rethrows what it threw.
  std::future<void> submit(std::function<void()> task);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stopping_ = false;
  std::thread worker_;
};

/// Streams chunks 0..n-1 through two staging sets (chunk i uses set i % 2):
/// `read(i)` and `write(i)` run on `io`'s thread, `compute(i)` on the
/// caller's, with chunk i+1's read and chunk i-1's write overlapping chunk
/// i's compute. Returns when every write is done (rethrowing an I/O error);
/// on any exit it first waits for every queued task, since they use the
/// caller's buffers.
void stream_chunks(IoQueue& io, size_t n, const std::function<void(size_t)>& read,
                   const std::function<void(size_t)>& compute, const std::function<void(size_t)>& write);

/// Throws the one error both offloading optimizers give for save() (`saving`)
/// or load(): their state lives in a tier, which checkpoints do not read.
[[noreturn]] void refuse_offloaded_checkpoint(bool saving);

/// A streamed StatePiece (checkpoints) over `numel` elements of `dtype`
/// stored from `byte_offset` in `region` of `tier`, which must outlive it.
StatePiece tier_piece(OffloadTier& tier, const OffloadTier::Region& region, int64_t byte_offset, int64_t numel,
                      torch::ScalarType dtype, std::string name, std::vector<int64_t> shape, int64_t lo);

/// An offloaded optimizer's per-tensor step count as a checkpoint piece (as
/// AdamW's resident step is: 1 element, int64), loaded back into `*step`.
StatePiece step_piece(std::string name, int64_t* step);

}  // namespace strata
