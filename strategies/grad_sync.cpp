#include "strata/strategies/grad_sync.h"

#include "strata/core/deferred_init.h"

#include <sstream>

namespace strata {

void GradSync::install(const std::vector<torch::Tensor>& params, std::vector<std::string> names,
                       std::vector<std::vector<size_t>> buckets, std::function<void(size_t)> launch,
                       std::function<bool()> active) {
  TORCH_CHECK(params.size() == names.size(), "GradSync: ", params.size(), " parameters but ",
              names.size(), " names");
  // Dropping the old readiness first turns its hooks into no-ops (they stay on
  // the autograd nodes of whatever module they were installed on).
  readiness_.reset();
  unused_everywhere_.clear();
  names_ = std::move(names);
  readiness_ = std::make_unique<GradReadiness>(params, std::move(buckets), std::move(launch));
  readiness_->install_hooks(std::move(active));
}

const GradReadiness& GradSync::readiness() const {
  TORCH_CHECK(readiness_ != nullptr, "GradSync: setup() has not installed the gradient hooks");
  return *readiness_;
}

void GradSync::rehook(size_t k) {
  TORCH_CHECK(readiness_ != nullptr, "GradSync: setup() has not installed the gradient hooks");
  readiness_->rehook(k);
}

void GradSync::backward(const torch::Tensor& loss, bool require_sync) {
  TORCH_CHECK(readiness_ != nullptr, "GradSync: backward() before setup()");
  if (require_sync) readiness_->reset();
  loss.backward();
}

void GradSync::launch_remaining() {
  TORCH_CHECK(readiness_ != nullptr, "GradSync: launch_remaining() before setup()");
  readiness_->launch_remaining();
}

void GradSync::resolve_unused(Comm& comm, const std::string& owner) {
  TORCH_CHECK(readiness_ != nullptr, "GradSync: resolve_unused() before setup()");
  const auto local = readiness_->unused_params();
  readiness_->clear_used();  // the next step starts counting afresh
  // And launching: a step whose backwards all ran under no_sync (a
  // pipeline's schedule) never resets it, yet its reduce_gradients() must
  // launch every bucket.
  readiness_->reset();
  unused_everywhere_.clear();
  const auto options = torch::TensorOptions(torch::kFloat64).device(comm.device());
  auto missing = torch::full({1}, static_cast<double>(local.size()), options);
  // Sync point: a rank cannot know alone whether another rank missed a
  // gradient, yet all must decide alike (raise together, skip the same
  // parameters), so they first agree on the total (one element).
  comm.all_reduce(missing);
  if (scalar_value(missing) == 0.0) return;

  auto counts = torch::zeros({static_cast<int64_t>(names_.size())}, torch::kFloat64);
  auto c = counts.accessor<double, 1>();
  for (size_t k : local) c[static_cast<int64_t>(k)] = 1.0;
  counts = counts.to(comm.device());
  // Sync point (only in steps where some rank missed a gradient): which
  // parameters, on how many ranks, identically everywhere.
  comm.all_reduce(counts);
  const auto reduced = counts.cpu();
  const auto r = reduced.accessor<double, 1>();

  std::ostringstream named;
  int listed = 0;
  const int kMaxListed = 20;
  for (size_t k = 0; k < names_.size(); ++k) {
    const auto ranks = static_cast<int>(r[static_cast<int64_t>(k)]);
    if (ranks == 0) continue;
    if (ranks == comm.size()) unused_everywhere_.push_back(k);
    if (listed < kMaxListed) {
      named << (listed ? ", " : "") << names_[k] << " on " << ranks << " of " << comm.size()
            << " rank(s)";
    } else if (listed == kMaxListed) {
      named << ", ...";
    }
    ++listed;
  }
  if (find_unused_parameters_) return;
  unused_everywhere_.clear();
  TORCH_CHECK(false, owner, ": ", listed, " parameter(s) received no gradient in this step: ",
              named.str(), "; every trainable parameter must take part in every rank's loss, or set "
              "find_unused_parameters (--find-unused-parameters) to count a missing gradient as "
              "zero, or freeze the parameter (requires_grad=false) before setup");
}

HiddenGrads::HiddenGrads(std::vector<torch::Tensor> tensors) {
  saved_.reserve(tensors.size());
  for (auto& t : tensors) {
    saved_.emplace_back(t, t.grad());
    t.mutable_grad() = torch::Tensor();
  }
}

HiddenGrads::~HiddenGrads() {
  for (auto& [tensor, grad] : saved_) tensor.mutable_grad() = grad;
}

StrategyOption bucket_cap_mb_option() {
  return StrategyOption::real("bucket-cap-mb", 25.0,
                              "gradient bucket size in MiB (ddp: 0 = one all-reduce per gradient)");
}

StrategyOption find_unused_parameters_option() {
  return StrategyOption::boolean("find-unused-parameters", false,
                                 "a parameter without a gradient counts as zero (else an error naming it)",
                                 /*bare=*/true);
}

}  // namespace strata
