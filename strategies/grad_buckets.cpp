#include "strata/strategies/grad_buckets.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <iterator>

namespace strata {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<torch::Tensor>& params,
                                                int64_t cap_bytes) {
  TORCH_CHECK_VALUE(cap_bytes > 0, "bucket cap must be > 0 bytes (got ", cap_bytes, ")");
  // One open bucket per (dtype, device), as torch DDP: a bucket is one flat
  // buffer, so it never mixes them.
  struct Open {
    torch::ScalarType dtype;
    torch::Device device;
    std::vector<size_t> members;
    int64_t filled;
  };
  std::vector<Open> open;
  std::vector<std::vector<size_t>> buckets;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
      return o.dtype == p.scalar_type() && o.device == p.device();
    });
    if (it == open.end()) {
      open.push_back({p.scalar_type(), p.device(), {}, 0});
      it = std::prev(open.end());
    } else if (it->filled + bytes > cap_bytes && it->filled > 0) {
      buckets.push_back(std::move(it->members));
      it->members.clear();
      it->filled = 0;
    }
    it->members.push_back(k);
    it->filled += bytes;
  }
  for (auto& o : open) {
    if (!o.members.empty()) buckets.push_back(std::move(o.members));
  }
  // Order buckets by their first (latest-registered) parameter: the order
  // backward tends to complete them, and a function of the parameter list
  // alone, so every rank gets the same order (the in-order launch relies on it).
  std::sort(buckets.begin(), buckets.end(),
            [](const std::vector<size_t>& x, const std::vector<size_t>& y) { return x.front() > y.front(); });
  return buckets;
}

GradReadiness::GradReadiness(std::vector<torch::Tensor> params,
                             std::vector<std::vector<size_t>> buckets,
                             std::function<void(size_t)> launch)
    : params_(std::move(params)), buckets_(std::move(buckets)), launch_(std::move(launch)) {
  constexpr size_t kNone = static_cast<size_t>(-1);
  bucket_of_.assign(params_.size(), kNone);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    TORCH_CHECK(!buckets_[b].empty(), "GradReadiness: bucket ", b, " is empty");
    for (size_t p : buckets_[b]) {
      TORCH_CHECK(p < params_.size() && bucket_of_[p] == kNone, "GradReadiness: parameter index ",
                  p, " is out of range [0, ", params_.size(), ") or in two buckets");
      bucket_of_[p] = b;
    }
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    TORCH_CHECK(bucket_of_[p] != kNone, "GradReadiness: parameter ", p, " is in no bucket");
  }
  reset();
  clear_used();
}

void GradReadiness::install_hooks(std::function<bool()> active) {
  active_ = std::move(active);
  accumulators_.assign(params_.size(), nullptr);
  for (size_t i = 0; i < params_.size(); ++i) rehook(i);
}

void GradReadiness::rehook(size_t i) {
  auto acc = torch::autograd::impl::grad_accumulator(params_.at(i));
  TORCH_CHECK(acc, "parameter ", i, " has no gradient accumulator (is it a leaf requiring grad?)");
  if (acc == accumulators_[i]) return;
  // Why a post-hook on AccumulateGrad and not a tensor hook: it fires after
  // the gradient has been added into .grad, i.e. when it is final for this
  // backward, which is when its bucket may be communicated.
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [this, i, active = active_, alive = alive_](const torch::autograd::variable_list& outputs,
                                                 const torch::autograd::variable_list&) {
        if (!alive->load()) return outputs;  // a later setup() replaced this object
        if (active()) {
          mark_ready(i);
        } else {
          mark_used(i);
        }
        return outputs;
      }));
  // Kept so the weak reference in the parameter stays valid until its data
  // changes again; an older accumulator lives as long as a graph uses it.
  accumulators_[i] = std::move(acc);
}

void GradReadiness::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!launching_, "GradReadiness::reset() while a bucket is being launched");
  pending_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].size();
  ready_.assign(params_.size(), false);
  next_bucket_ = 0;
}

void GradReadiness::mark_ready(size_t param_index) {
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(!ready_[param_index], "parameter ", param_index,
              " received its gradient twice in one backward; strata's gradient hooks "
              "support one backward per micro-batch");
  ready_[param_index] = true;
  used_[param_index] = true;
  --pending_[bucket_of_[param_index]];
  launch_in_order(lock, /*all=*/false);
}

void GradReadiness::mark_used(size_t param_index) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_[param_index] = true;
}

void GradReadiness::launch_remaining() {
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(!launching_, "GradReadiness::launch_remaining() while backward is still launching "
              "buckets; call it after backward has returned");
  launch_in_order(lock, /*all=*/true);
}

void GradReadiness::launch_in_order(std::unique_lock<std::mutex>& lock, bool all) {
  // Sync point (between hook threads). Launch strictly in bucket order (see
  // the header): a later bucket that is complete waits for the earlier ones.
  // One launcher at a time: the thread that finds no launcher running claims
  // the next bucket, releases the lock while launching it (launch_ may block
  // on communication or call back into this object), and loops until the next
  // bucket is incomplete. A thread that completes a bucket meanwhile only
  // counts it down; the launcher sees it when it re-takes the lock, so every
  // bucket goes out exactly once, in order, and launches never overlap.
  if (launching_) return;
  launching_ = true;
  while (next_bucket_ < buckets_.size() && (all || pending_[next_bucket_] == 0)) {
    const size_t bucket = next_bucket_++;
    lock.unlock();
    try {
      launch_(bucket);
    } catch (...) {
      lock.lock();
      launching_ = false;
      throw;
    }
    lock.lock();
  }
  launching_ = false;
}

std::vector<size_t> GradReadiness::unready_params() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<size_t> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) out.push_back(i);
  }
  return out;
}

std::vector<size_t> GradReadiness::unused_params() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<size_t> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!used_[i]) out.push_back(i);
  }
  return out;
}

void GradReadiness::clear_used() {
  std::lock_guard<std::mutex> lock(mutex_);
  used_.assign(params_.size(), false);
}

bool GradReadiness::all_launched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_bucket_ == buckets_.size();
}

}  // namespace strata
