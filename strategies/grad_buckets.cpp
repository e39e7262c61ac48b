#include "strategies/grad_buckets.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace strata {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<torch::Tensor>& params,
                                                int64_t cap_bytes) {
  TORCH_CHECK_VALUE(cap_bytes > 0, "bucket cap must be > 0 bytes (got ", cap_bytes, ")");
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const int64_t bytes = params[k].numel() * static_cast<int64_t>(params[k].element_size());
    if (buckets.empty() || (filled + bytes > cap_bytes && filled > 0)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += bytes;
  }
  return buckets;
}

GradReadiness::GradReadiness(std::vector<torch::Tensor> params,
                             std::vector<std::vector<size_t>> buckets,
                             std::function<void(size_t)> launch)
    : params_(std::move(params)), buckets_(std::move(buckets)), launch_(std::move(launch)) {
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t p : buckets_[b]) bucket_of_[p] = b;
  }
  reset();
}

void GradReadiness::install_hooks(std::function<bool()> active) {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    TORCH_CHECK(acc, "parameter ", i, " has no gradient accumulator (is it a leaf requiring grad?)");
    // Why a post-hook on AccumulateGrad and not a tensor hook: it fires after
    // the gradient has been added into .grad, i.e. when it is final for this
    // backward, which is when its bucket may be communicated.
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i, active, alive = alive_](const torch::autograd::variable_list& outputs,
                                          const torch::autograd::variable_list&) {
          if (*alive && active()) mark_ready(i);
          return outputs;
        }));
    accumulators_.push_back(std::move(acc));
  }
}

void GradReadiness::reset() {
  pending_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].size();
  ready_.assign(params_.size(), false);
  next_bucket_ = 0;
}

void GradReadiness::mark_ready(size_t param_index) {
  TORCH_CHECK(!ready_[param_index], "parameter ", param_index,
              " received its gradient twice in one backward; strata's gradient hooks "
              "support one backward per micro-batch");
  ready_[param_index] = true;
  --pending_[bucket_of_[param_index]];
  // Launch strictly in bucket order (see the header): a later bucket that is
  // complete waits for the earlier ones.
  while (next_bucket_ < buckets_.size() && pending_[next_bucket_] == 0) {
    launch_(next_bucket_++);
  }
}

void GradReadiness::launch_remaining() {
  while (next_bucket_ < buckets_.size()) launch_(next_bucket_++);
}

std::vector<size_t> GradReadiness::unready_params() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) out.push_back(i);
  }
  return out;
}

}  // namespace strata
