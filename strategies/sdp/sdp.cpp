#include "strata/strategies/sdp/sdp.h"

namespace strata {

SDPStrategy::SDPStrategy(Comm comm, ShardOptions options) : OSSStrategy(std::move(comm), options) {}

void SDPStrategy::setup_gradients() {
  // A second setup: sends a failed step left behind are waited for (see
  // PendingWork) and dropped with the old buckets.
  in_flight_.clear();
  shard_grad_ = torch::zeros({layout_.shard_numel()}, flat_params_.options());
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  // Buckets walk params in reverse registration order, the same order as the
  // flat layout, so each bucket is one contiguous flat range.
  grad_sync_.install(params(), param_names(), assign_buckets(params(), cap),
                     [this](size_t b) { launch_bucket(b); }, [this] { return require_sync(); });
}

void SDPStrategy::launch_bucket(size_t bucket) {
  // Bound memory: wait for the oldest send before starting another.
  while (in_flight_.size() >= kMaxBucketsInFlight) finish_oldest();

  const auto& members = grad_sync_.readiness().buckets()[bucket];
  int64_t begin = layout_.offset_of(members.front());
  int64_t end = begin;
  for (size_t k : members) {
    begin = std::min(begin, layout_.offset_of(k));
    end = std::max(end, layout_.offset_of(k) + params()[k].numel());
  }
  BucketSend send;
  send.flat_begin = begin;
  send.staging = torch::empty({end - begin}, flat_params_.options());
  for (size_t k : members) {
    auto& p = params()[k];
    auto slot = send.staging.narrow(0, layout_.offset_of(k) - begin, p.numel());
    if (p.grad().defined()) {
      slot.copy_(p.grad().view(-1));
    } else {
      slot.zero_();  // a parameter this rank did not use counts as zero (grad_sync.h)
    }
    // Freed as soon as it is in the send buffer: non-owners never keep it, and
    // the owner receives the reduced sum into its shard.
    p.mutable_grad() = torch::Tensor();
  }
  // Pre-divide so the SUM yields the mean over ranks.
  send.staging.div_(world_size());
  comm().set_flight_label(c10::str("bucket ", bucket));
  // Async reduce of each owner's part of the bucket, in owner order: every rank
  // issues the same sequence because buckets launch in bucket order.
  for (int r = 0; r < world_size(); ++r) {
    const int64_t lo = std::max(begin, layout_.shard_begin(r));
    const int64_t hi = std::min(end, layout_.shard_begin(r) + layout_.shard_numel());
    if (lo >= hi) continue;
    auto part = send.staging.narrow(0, lo - begin, hi - lo);
    send.works.push_back(comm().reduce_async(part, r));
  }
  in_flight_.push_back(std::move(send));
}

void SDPStrategy::finish_oldest() {
  BucketSend send = std::move(in_flight_.front());
  in_flight_.pop_front();
  for (auto& w : send.works) w.wait();
  const int64_t mine = layout_.shard_begin(rank());
  const int64_t end = send.flat_begin + send.staging.numel();
  const int64_t lo = std::max(send.flat_begin, mine);
  const int64_t hi = std::min(end, mine + layout_.shard_numel());
  if (lo < hi) {
    shard_grad_.narrow(0, lo - mine, hi - lo).copy_(send.staging.narrow(0, lo - send.flat_begin, hi - lo));
  }
}

void SDPStrategy::reduce_gradients() {
  check_trainable_unchanged();
  // Buckets whose hooks never completed (unused parameters, no_sync) go now,
  // so every rank issues the same reduces whatever its graph was.
  grad_sync_.launch_remaining();
  // Sync point: the owner may step only when every bucket touching its shard
  // has arrived.
  while (!in_flight_.empty()) finish_oldest();
  grad_sync_.resolve_unused(comm(), name());
}

void SDPStrategy::zero_grad(torch::optim::Optimizer&) {
  shard_grad_.zero_();
  for (auto& p : params()) p.mutable_grad() = torch::Tensor();
}

}  // namespace strata
