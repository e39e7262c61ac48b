#include "strata/strategies/ddp/ddp.h"

#include <algorithm>
#include <sstream>

namespace strata {

DDPStrategy::DDPStrategy(Comm comm, DDPOptions options)
    : Strategy(std::move(comm)), options_(options), grad_sync_(options.find_unused_parameters()) {
  TORCH_CHECK_VALUE(options_.bucket_cap_mb() >= 0,
                    "DDPStrategy: bucket_cap_mb must be >= 0 (0: one all-reduce per gradient), got ",
                    options_.bucket_cap_mb());
}

void DDPStrategy::setup(TrainingModule& module) {
  // Idempotent: a second fit (same or another module) rebuilds everything.
  // Work a failed step left in flight is waited for (PendingWork's destructor,
  // bounded by the process group's timeout) before its buffers are dropped.
  in_flight_.clear();
  deferred_.clear();
  bucket_buffers_.clear();
  Strategy::setup(module);
  broadcast_module_state(comm(), module.module());

  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  // A cap of 0 bytes puts every parameter in a bucket of its own.
  auto buckets = assign_buckets(params(), std::max<int64_t>(cap, 1));
  // Gradients become views into one flat buffer per bucket, so the all-reduce
  // needs no copy in or out, and AccumulateGrad adds into the bucket in place.
  // A bucket holds one dtype (assign_buckets), so its buffer takes any member's.
  for (const auto& bucket : buckets) {
    int64_t numel = 0;
    for (size_t p : bucket) numel += params()[p].numel();
    auto buffer = torch::zeros({numel}, params()[bucket.front()].options().requires_grad(false));
    int64_t offset = 0;
    for (size_t p : bucket) {
      const auto& param = params()[p];
      param.mutable_grad() = buffer.narrow(0, offset, param.numel()).view(param.sizes());
      offset += param.numel();
    }
    bucket_buffers_.push_back(buffer);
  }
  grad_sync_.install(params(), param_names(), std::move(buckets),
                     [this](size_t b) { launch_bucket(b); }, [this] { return require_sync(); });
}

void DDPStrategy::launch_bucket(size_t bucket) {
  if (!options_.overlap_comm()) {
    deferred_.push_back(bucket);  // comparison mode: reduce after backward
    return;
  }
  start_all_reduce(bucket);
}

void DDPStrategy::start_all_reduce(size_t bucket) {
  auto& buffer = bucket_buffers_[bucket];
  // Pre-divide so the SUM all-reduce yields the mean over ranks, matching one
  // process that averages the loss over the whole global batch.
  buffer.div_(world_size());
  // Async: backward keeps computing earlier layers' gradients while this
  // bucket travels; reduce_gradients() waits for it.
  comm().set_flight_label(c10::str("bucket ", bucket));
  in_flight_.push_back(comm().all_reduce_async(buffer));
}

void DDPStrategy::backward(const torch::Tensor& loss) { grad_sync_.backward(loss, require_sync()); }

void DDPStrategy::reduce_gradients() {
  // Buckets whose hooks never completed (unused parameters, no_sync) go now,
  // so every rank issues the same all-reduces whatever its graph was.
  grad_sync_.launch_remaining();
  for (size_t bucket : deferred_) start_all_reduce(bucket);
  deferred_.clear();
  // Sync point: the optimizer may only read gradients once every bucket's
  // all-reduce has completed.
  for (auto& work : in_flight_) work.wait();
  in_flight_.clear();
  grad_sync_.resolve_unused(comm(), name());
}

void DDPStrategy::optimizer_step(torch::optim::Optimizer& optimizer) {
  // Parameters no rank used (find_unused_parameters) are skipped, as torch
  // skips a parameter without a gradient (see grad_sync.h).
  std::vector<torch::Tensor> unused;
  for (size_t k : grad_sync_.unused_everywhere()) unused.push_back(params()[k]);
  HiddenGrads hidden(std::move(unused));
  optimizer.step();
}

void DDPStrategy::zero_grad(torch::optim::Optimizer&) {
  // Zero in place: the gradients are views into the buckets and must stay so.
  for (auto& buffer : bucket_buffers_) buffer.zero_();
}

std::string DDPStrategy::describe() const {
  std::ostringstream out;
  out << "ddp: " << world_size() << " ranks, ";
  if (options_.bucket_cap_mb() == 0) {
    out << "no bucketing (" << bucket_buffers_.size() << " gradients, one all-reduce each)";
  } else {
    out << bucket_buffers_.size() << " gradient bucket(s) of <= " << options_.bucket_cap_mb()
        << " MiB";
  }
  out << ", all-reduce " << (options_.overlap_comm() ? "overlapped with backward" : "after backward");
  return out.str();
}

}  // namespace strata
