#include "strata/strategies/comm.h"

#include "strata/strategies/comm_lender.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <utility>

namespace strata {

namespace {

using detail::Lender;

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

void check_contiguous(const torch::Tensor& t, const char* what, const char* op) {
  TORCH_CHECK(t.defined(), "Comm::", op, ": ", what, " is an undefined tensor");
  TORCH_CHECK(t.is_contiguous(), "Comm::", op, ": ", what, " must be contiguous, got sizes ",
              t.sizes(), " strides ", t.strides());
}

void check_same_kind(const torch::Tensor& output, const torch::Tensor& input, const char* op) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "Comm::", op,
              ": output dtype ", output.scalar_type(), " != input dtype ", input.scalar_type());
  TORCH_CHECK(output.device() == input.device(), "Comm::", op, ": output device ",
              output.device(), " != input device ", input.device());
}

void check_root(int root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "Comm::", op, ": root ", root,
              " is outside the world [0, ", size, ")");
}

// Gloo takes the emulated all-gather and reduce-scatter below, NCCL its native
// ones. LibTorch 2.x's Gloo has _allgather_base and _reduce_scatter_base too,
// but on 2 thread-ranks here they were slower than these emulations: the
// native reduce-scatter took 1.2-2.7x the time at every size from 64 KiB to
// 64 MiB, the native all-gather 1.2-3.2x from 256 KiB up (it won only at
// 64 KiB, 0.77 vs 1.16 ms). Gloo's bf16 all-reduce works natively now, and so
// do bf16 broadcasts and all-to-alls (1.13 needed an fp16 view of the bits):
// strata-micro-bench BM_GlooReduceScatterBase / BM_GlooAllGatherBase, README
// "LibTorch 2.x".
bool needs_emulation(const c10d::ProcessGroup& pg) { return pg.getBackendName() == "gloo"; }

// The flat collectives under the names both supported LibTorch versions have.
// LibTorch 2.15 renamed them (all_gather_single, reduce_scatter_single,
// all_to_all_single) and deprecated the old names; 2.11, which the GPU
// machines carry, has only the old ones. Only these four call them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
c10::intrusive_ptr<c10d::Work> flat_all_gather(c10d::ProcessGroup& pg, at::Tensor& out, at::Tensor& in) {
  return pg._allgather_base(out, in);
}
c10::intrusive_ptr<c10d::Work> flat_reduce_scatter(c10d::ProcessGroup& pg, at::Tensor& out, at::Tensor& in) {
  return pg._reduce_scatter_base(out, in);
}
c10::intrusive_ptr<c10d::Work> equal_all_to_all(c10d::ProcessGroup& pg, at::Tensor& out, at::Tensor& in) {
  std::vector<int64_t> equal_splits;  // empty: the input splits into N equal chunks
  return pg.alltoall_base(out, in, equal_splits, equal_splits);
}
// Two ranks: one all-to-all whose only non-empty split sends `in` to the
// peer and receives the peer's equal-sized chunk into `out`. Nothing goes to
// this rank itself, so Gloo copies nothing locally.
c10::intrusive_ptr<c10d::Work> exchange_with_peer(c10d::ProcessGroup& pg, int rank, at::Tensor& out, at::Tensor& in) {
  std::vector<int64_t> splits(2, 0);
  splits[1 - rank] = in.numel();
  return pg.alltoall_base(out, in, splits, splits);
}
#pragma GCC diagnostic pop

}  // namespace

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kCount: break;
  }
  return "unknown";
}

int64_t CommBytes::total_sent() const {
  int64_t total = 0;
  for (int64_t s : sent) total += s;
  return total;
}

// ---------------------------------------------------------------------------
// PendingWork

PendingWork::PendingWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> on_complete,
                         std::shared_ptr<std::atomic<int64_t>> wait_ns)
    : on_complete_(std::move(on_complete)), wait_ns_(std::move(wait_ns)) {
  if (work) works_.push_back(std::move(work));
}

PendingWork::PendingWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> on_complete,
                         std::shared_ptr<std::atomic<int64_t>> wait_ns)
    : works_(std::move(works)), on_complete_(std::move(on_complete)), wait_ns_(std::move(wait_ns)) {}

PendingWork& PendingWork::operator=(PendingWork&& other) noexcept {
  if (this != &other) {
    finish_before_drop();
    works_ = std::move(other.works_);
    on_complete_ = std::move(other.on_complete_);
    wait_ns_ = std::move(other.wait_ns_);
    other.works_.clear();
    other.on_complete_ = nullptr;
  }
  return *this;
}

PendingWork::~PendingWork() { finish_before_drop(); }

void PendingWork::finish_before_drop() noexcept {
  if (!pending()) return;
  // Why wait here: the collective still writes into tensors the caller owns,
  // and an emulated collective's completion step (the local sum) has not run
  // yet. Dropping the handle must not leave either half-done, so behave like
  // std::future from std::async and block. The process group's timeout bounds
  // this; an error cannot propagate out of a destructor, so it is reported.
  try {
    wait();
  } catch (const std::exception& e) {
    TORCH_WARN("strata::PendingWork destroyed while pending; its collective failed: ", e.what());
  }
}

void PendingWork::wait() {
  // Move both out first so that a failed wait leaves this handle complete
  // (a second wait() or the destructor must not rethrow or block again).
  // The completion step first: it may hold the tensors the works were given
  // views of (Lender), which must outlive the works, so it is destroyed last.
  auto on_complete = std::move(on_complete_);
  auto works = std::move(works_);
  works_.clear();
  on_complete_ = nullptr;
  // Why: the collective runs on the process group's worker threads; its output
  // tensors are only valid after this returns. wait() rethrows its error.
  // Only the blocked time is counted (the step-time split's comm wait).
  if (!works.empty()) {
    RECORD_FUNCTION("strata::comm_wait", std::vector<c10::IValue>());
    const auto start = std::chrono::steady_clock::now();
    struct AddWait {  // counts a failed wait too
      std::atomic<int64_t>* counter;
      std::chrono::steady_clock::time_point start;
      ~AddWait() {
        if (counter) {
          counter->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - start).count(),
                             std::memory_order_relaxed);
        }
      }
    } add_wait{wait_ns_.get(), start};
    // All of them, even after one failed: none may still write into the
    // caller's tensors once this returns. The first error is rethrown.
    std::exception_ptr first_error;
    for (auto& work : works) {
      try {
        work->wait();
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
  }
  // The completion step reads the collective's output, so it runs only now.
  if (on_complete) on_complete();
}

// ---------------------------------------------------------------------------
// Comm

Comm::Comm(torch::Device device) : device_(device), counters_(std::make_shared<Counters>()) {}

Comm::Comm(c10::intrusive_ptr<c10d::ProcessGroup> process_group, torch::Device device)
    : pg_(std::move(process_group)), device_(device), counters_(std::make_shared<Counters>()) {
  TORCH_CHECK(pg_, "Comm: the process group is null; use Comm() for a world of one");
  rank_ = pg_->getRank();
  size_ = pg_->getSize();
  TORCH_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "Comm: process group has rank ", rank_,
              " and size ", size_);
}

Comm::Comm(c10::intrusive_ptr<c10d::ProcessGroup> process_group, torch::Device device,
           SubgroupFactory make_subgroup)
    : Comm(std::move(process_group), device) {
  make_subgroup_ = std::move(make_subgroup);
}

int64_t Comm::count(CollectiveKind kind, int64_t sent, const torch::Tensor& tensor, int peer) {
  const bool collective = kind != CollectiveKind::kSend;
  if (collective && group_name_ == "world" && counters_->skip_seq > 0 &&
      counters_->world_issued.fetch_add(1, std::memory_order_relaxed) + 1 == counters_->skip_seq) {
    return kSkipped;
  }
  const auto k = static_cast<int>(kind);
  counters_->sent[k].fetch_add(sent, std::memory_order_relaxed);
  counters_->calls[k].fetch_add(1, std::memory_order_relaxed);
  FlightRecorder* recorder = counters_->recorder.get();
  if (recorder == nullptr) return -1;
  // A send has no sequence the group's ranks share (only the sender issues
  // it): it is numbered apart, in "<group>:send".
  return recorder->start(collective ? group_name_ : group_name_ + ":send", collective_name(kind),
                         tensor.defined() ? c10::toString(tensor.scalar_type()) : "",
                         tensor.defined() ? tensor_bytes(tensor) : 0, peer);
}

void Comm::set_flight_phase(std::string phase) const {
  if (FlightRecorder* recorder = counters_->recorder.get()) recorder->set_phase(std::move(phase));
}

void Comm::set_flight_label(std::string label) const {
  if (FlightRecorder* recorder = counters_->recorder.get()) recorder->set_label(std::move(label));
}

CommBytes Comm::bytes() const {
  CommBytes out;
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    out.sent[k] = counters_->sent[k].load(std::memory_order_relaxed);
    out.calls[k] = counters_->calls[k].load(std::memory_order_relaxed);
  }
  return out;
}

void Comm::reset_bytes() {
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    counters_->sent[k].store(0, std::memory_order_relaxed);
    counters_->calls[k].store(0, std::memory_order_relaxed);
  }
}

double Comm::wait_seconds() const {
  return static_cast<double>(counters_->wait_ns->load(std::memory_order_relaxed)) * 1e-9;
}

namespace {
/// The completion step of a recorded collective: its record is finished
/// first (the wait returned), then the collective's own step runs.
std::function<void()> finishing(std::shared_ptr<FlightRecorder> recorder, int64_t record,
                                std::function<void()> on_complete) {
  if (recorder == nullptr) return on_complete;
  return [recorder = std::move(recorder), record, on_complete = std::move(on_complete)] {
    recorder->finish(record);
    if (on_complete) on_complete();
  };
}
}  // namespace

PendingWork Comm::pending(c10::intrusive_ptr<c10d::Work> work, int64_t record,
                          std::function<void()> on_complete) const {
  return PendingWork(std::move(work), finishing(counters_->recorder, record, std::move(on_complete)),
                     counters_->wait_ns);
}

PendingWork Comm::pending(std::vector<c10::intrusive_ptr<c10d::Work>> works, int64_t record,
                          std::function<void()> on_complete) const {
  return PendingWork(std::move(works), finishing(counters_->recorder, record, std::move(on_complete)),
                     counters_->wait_ns);
}

// --- all_reduce -------------------------------------------------------------

void Comm::all_reduce(torch::Tensor& tensor, c10d::ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

PendingWork Comm::all_reduce_async(torch::Tensor& tensor, c10d::ReduceOp op) {
  RECORD_FUNCTION("strata::all_reduce", std::vector<c10::IValue>());  // spans in --profile traces
  check_contiguous(tensor, "tensor", "all_reduce");
  if (size_ == 1) return {};
  const int64_t n = size_;
  // Ring all-reduce: reduce-scatter then all-gather, each (N-1)/N·S.
  const int64_t record = count(CollectiveKind::kAllReduce, 2 * (n - 1) * tensor_bytes(tensor) / n, tensor);
  if (record == kSkipped) return {};
  Lender lend;
  std::vector<at::Tensor> tensors{lend(tensor)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  return pending(pg_->allreduce(tensors, opts), record, std::move(lend).keeping());
}

// --- broadcast --------------------------------------------------------------

void Comm::broadcast(torch::Tensor& tensor, int root) { broadcast_async(tensor, root).wait(); }

PendingWork Comm::broadcast_async(torch::Tensor& tensor, int root) {
  RECORD_FUNCTION("strata::broadcast", std::vector<c10::IValue>());
  check_contiguous(tensor, "tensor", "broadcast");
  check_root(root, size_, "broadcast");
  if (size_ == 1) return {};
  const int64_t n = size_;
  const int64_t record = count(CollectiveKind::kBroadcast, tensor_bytes(tensor) * (n - 1) / n, tensor);
  if (record == kSkipped) return {};
  Lender lend;
  std::vector<at::Tensor> tensors{lend(tensor)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return pending(pg_->broadcast(tensors, opts), record, std::move(lend).keeping());
}

// --- reduce -----------------------------------------------------------------

void Comm::reduce(torch::Tensor& tensor, int root, c10d::ReduceOp op) {
  reduce_async(tensor, root, op).wait();
}

PendingWork Comm::reduce_async(torch::Tensor& tensor, int root, c10d::ReduceOp op) {
  RECORD_FUNCTION("strata::reduce", std::vector<c10::IValue>());
  check_contiguous(tensor, "tensor", "reduce");
  check_root(root, size_, "reduce");
  if (size_ == 1) return {};
  const int64_t n = size_;
  const int64_t record = count(CollectiveKind::kReduce, tensor_bytes(tensor) * (n - 1) / n, tensor);
  if (record == kSkipped) return {};
  Lender lend;
  std::vector<at::Tensor> tensors{lend(tensor)};
  c10d::ReduceOptions opts;
  opts.reduceOp = op;
  opts.rootRank = root;
  return pending(pg_->reduce(tensors, opts), record, std::move(lend).keeping());
}

// --- all_gather_into --------------------------------------------------------

void Comm::all_gather_into(torch::Tensor& output, const torch::Tensor& input) {
  all_gather_into_async(output, input).wait();
}

PendingWork Comm::all_gather_into_async(torch::Tensor& output, const torch::Tensor& input) {
  RECORD_FUNCTION("strata::all_gather", std::vector<c10::IValue>());
  check_contiguous(output, "output", "all_gather_into");
  check_contiguous(input, "input", "all_gather_into");
  check_same_kind(output, input, "all_gather_into");
  const int64_t n = input.numel();
  TORCH_CHECK(output.numel() == size_ * n, "Comm::all_gather_into: output numel ",
              output.numel(), " != world size ", size_, " * input numel ", n,
              " (output sizes ", output.sizes(), ", input sizes ", input.sizes(), ")");
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return {};
  }
  const int64_t record = count(CollectiveKind::kAllGather, (size_ - 1) * tensor_bytes(input), input);
  if (record == kSkipped) return {};

  Lender lend;
  at::Tensor flat_in = lend(input.view({-1}));
  at::Tensor flat_out = lend(output.view({-1}));
  if (!needs_emulation(*pg_)) {
    return pending(flat_all_gather(*pg_, flat_out, flat_in), record, std::move(lend).keeping());
  }
  // Gloo: rank r broadcasts its input into chunk r, [r*n, (r+1)*n), of every
  // rank's output. Gloo's broadcast reads and writes the tensor it is given,
  // so nothing is staged or copied; its list all-gather instead allocates a
  // flat N·n buffer per call and copies out of it (measured: those fresh
  // pages and copies cost FSDP ~10% of a gpt-mini step on this 2-core
  // machine). Each rank roots one broadcast and relays in the others, so it
  // sends (N-1)·n in all, as a ring all-gather does. All ranks issue the N
  // broadcasts in the same order.
  flat_out.narrow(0, rank_ * n, n).copy_(flat_in);
  if (size_ == 2) {
    // One collective instead of two broadcasts: half the wake-ups of Gloo's
    // worker threads, which share the cores with compute (fsdp x2, gpt-mini
    // block 64: ~3% of a step, README "strata vs PyTorch 2.x").
    at::Tensor peer_chunk = flat_out.narrow(0, (1 - rank_) * n, n);
    return pending(exchange_with_peer(*pg_, rank_, peer_chunk, flat_in), record, std::move(lend).keeping());
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(size_);
  try {
    for (int r = 0; r < size_; ++r) {
      std::vector<at::Tensor> chunk{flat_out.narrow(0, r * n, n)};
      c10d::BroadcastOptions opts;
      opts.rootRank = r;
      works.push_back(pg_->broadcast(chunk, opts));
    }
  } catch (...) {
    // Sync point: the broadcasts already queued write through borrowed views;
    // they finish before the owners (in `lend`) go.
    PendingWork(std::move(works), std::move(lend).keeping()).finish_before_drop();
    throw;
  }
  return pending(std::move(works), record, std::move(lend).keeping());
}

// --- reduce_scatter ---------------------------------------------------------

void Comm::reduce_scatter(torch::Tensor& output, const torch::Tensor& input) {
  reduce_scatter_async(output, input).wait();
}

PendingWork Comm::reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input,
                                       const torch::Tensor& workspace) {
  RECORD_FUNCTION("strata::reduce_scatter", std::vector<c10::IValue>());
  check_contiguous(output, "output", "reduce_scatter");
  check_contiguous(input, "input", "reduce_scatter");
  check_same_kind(output, input, "reduce_scatter");
  const int64_t n = output.numel();
  TORCH_CHECK(input.numel() == size_ * n, "Comm::reduce_scatter: input numel ", input.numel(),
              " != world size ", size_, " * output numel ", n, " (input sizes ", input.sizes(),
              ", output sizes ", output.sizes(), ")");
  if (workspace.defined()) {
    check_contiguous(workspace, "workspace", "reduce_scatter");
    check_same_kind(workspace, input, "reduce_scatter");
    TORCH_CHECK(workspace.numel() == input.numel(), "Comm::reduce_scatter: workspace numel ",
                workspace.numel(), " != input numel ", input.numel());
  }
  if (size_ == 1) {
    output.view({-1}).copy_(input.view({-1}));
    return {};
  }
  const int64_t record = count(CollectiveKind::kReduceScatter, (size_ - 1) * tensor_bytes(output), input);
  if (record == kSkipped) return {};

  Lender lend;
  at::Tensor flat_in = lend(input.view({-1}));
  at::Tensor flat_out = lend(output.view({-1}));
  if (!needs_emulation(*pg_)) {
    return pending(flat_reduce_scatter(*pg_, flat_out, flat_in), record, std::move(lend).keeping());
  }
  // Gloo: one all-to-all with equal splits sends input chunk j to rank j, so
  // row r of `received` is rank r's copy of the chunk this rank owns. Each rank
  // sends exactly (N-1)/N of its input, as a ring reduce-scatter would.
  at::Tensor received = lend(workspace.defined() ? workspace.view({-1}) : torch::empty_like(flat_in));
  if (size_ == 2) {
    // Only the peer's chunk crosses: this rank's own chunk is summed straight
    // from the input instead of being copied through Gloo first.
    const int peer = 1 - rank_;
    at::Tensor to_peer = flat_in.narrow(0, peer * n, n);
    at::Tensor from_peer = received.narrow(0, peer * n, n);
    auto work = exchange_with_peer(*pg_, rank_, from_peer, to_peer);
    at::Tensor own = flat_in.narrow(0, rank_ * n, n);
    // Why in on_complete: from_peer is written by the worker thread.
    auto local_sum = [own, from_peer, flat_out]() mutable { at::add_out(flat_out, own, from_peer); };
    return pending(std::move(work), record, std::move(lend).keeping(std::move(local_sum)));
  }
  auto work = equal_all_to_all(*pg_, received, flat_in);
  const int64_t world = size_;
  // Why in on_complete: `received` is filled by the process group's worker
  // thread; the local sum may only read it after the all-to-all has finished.
  // Row by row: element-wise adds of contiguous rows (one pass for two
  // ranks), where at::sum over dim 0 of the [N, n] view showed up as a
  // hot spot in FSDP's profile.
  auto local_sum = [received, flat_out, world, n]() mutable {
    at::add_out(flat_out, received.narrow(0, 0, n), received.narrow(0, n, n));
    for (int64_t r = 2; r < world; ++r) flat_out.add_(received.narrow(0, r * n, n));
  };
  return pending(std::move(work), record, std::move(lend).keeping(std::move(local_sum)));
}

// --- barrier ----------------------------------------------------------------

void Comm::barrier() {
  if (size_ == 1) return;
  const int64_t record = count(CollectiveKind::kBarrier, 0, {});
  if (record == kSkipped) return;
  // Why: every rank blocks here until all ranks have arrived.
  pending(pg_->barrier(), record).wait();
}

// --- point-to-point -----------------------------------------------------------

PendingWork Comm::send_async(const torch::Tensor& tensor, int dst, int tag) {
  check_contiguous(tensor, "tensor", "send");
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "Comm::send: destination rank ", dst,
              " must be another rank of the world [0, ", size_, ") than this one (", rank_, ")");
  TORCH_CHECK(tag >= 0, "Comm::send: tag ", tag, " is negative");
  const int64_t record = count(CollectiveKind::kSend, tensor_bytes(tensor), tensor, world_rank_of(dst));
  Lender lend;
  std::vector<at::Tensor> tensors{lend(tensor)};
  return pending(pg_->send(tensors, dst, tag), record, std::move(lend).keeping());
}

PendingWork Comm::recv_async(torch::Tensor& tensor, int src, int tag) {
  check_contiguous(tensor, "tensor", "recv");
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "Comm::recv: source rank ", src,
              " must be another rank of the world [0, ", size_, ") than this one (", rank_, ")");
  TORCH_CHECK(tag >= 0, "Comm::recv: tag ", tag, " is negative");
  Lender lend;
  std::vector<at::Tensor> tensors{lend(tensor)};
  // Not counted (the sender counts the bytes), but recorded, numbered apart
  // as sends are: a rank stuck in a receive names its peer in the dumps.
  FlightRecorder* recorder = counters_->recorder.get();
  const int64_t record = recorder == nullptr ? -1
                                             : recorder->start(group_name_ + ":recv", "recv",
                                                               c10::toString(tensor.scalar_type()),
                                                               tensor_bytes(tensor), world_rank_of(src));
  return pending(pg_->recv(tensors, src, tag), record, std::move(lend).keeping());
}

}  // namespace strata
