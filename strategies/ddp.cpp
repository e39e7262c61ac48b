#include "strategies/ddp.h"

#include <algorithm>
#include <sstream>

namespace strata {

DDPStrategy::DDPStrategy(Comm comm, DDPOptions options)
    : Strategy(std::move(comm)), options_(options) {
  TORCH_CHECK_VALUE(options_.bucket_cap_mb() >= 0,
                    "DDPStrategy: bucket_cap_mb must be >= 0 (0: one all-reduce per gradient), got ",
                    options_.bucket_cap_mb());
}

void broadcast_module_state(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  torch::NoGradGuard no_grad;
  // Sync point: every replica must start from rank 0's weights, or the ranks
  // would train different models from the first step on.
  std::vector<PendingWork> works;
  for (auto& p : module.parameters()) works.push_back(comm.broadcast_async(p, /*root=*/0));
  for (auto& b : module.buffers()) works.push_back(comm.broadcast_async(b, /*root=*/0));
  for (auto& w : works) w.wait();
}

std::string unused_parameters_message(const std::string& strategy,
                                      const std::vector<std::string>& names) {
  std::ostringstream out;
  out << strategy << ": parameter(s) ";
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  out << " received no gradient in this step; every trainable parameter must take part in "
         "the loss, or set find_unused_parameters=true (ddp), or freeze it "
         "(requires_grad=false) before setup";
  return out.str();
}

void DDPStrategy::setup(TrainingModule& module) {
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
  readiness_ = std::make_unique<GradReadiness>(params(), std::move(buckets),
                                               [this](size_t b) { launch_bucket(b); });
  readiness_->install_hooks([this] { return require_sync(); });
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
  in_flight_.push_back(comm().all_reduce_async(buffer));
}

void DDPStrategy::backward(const torch::Tensor& loss) {
  if (require_sync()) readiness_->reset();
  loss.backward();
}

void DDPStrategy::reduce_gradients() {
  std::vector<std::string> unused;
  if (!readiness_->all_launched()) {
    for (size_t p : readiness_->unready_params()) unused.push_back(param_names()[p]);
    // Launch the rest even when this is an error, so every rank issues the
    // same collectives; all ranks then raise the same error (same graph).
    readiness_->launch_remaining();
  }
  for (size_t bucket : deferred_) start_all_reduce(bucket);
  deferred_.clear();
  // Sync point: the optimizer may only read gradients once every bucket's
  // all-reduce has completed.
  for (auto& work : in_flight_) work.wait();
  in_flight_.clear();
  TORCH_CHECK(unused.empty() || options_.find_unused_parameters(),
              unused_parameters_message("DDPStrategy", unused));
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
