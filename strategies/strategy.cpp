#include "strata/strategies/strategy.h"

#include "strata/strategies/offload_tier.h"
#include "strata/strategies/offloaded_moments.h"

#include "strata/core/deferred_init.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_set>

namespace strata {

NoSyncGuard::NoSyncGuard(Strategy* strategy) : strategy_(strategy) {
  previous_ = strategy_->require_sync_;
  strategy_->require_sync_ = false;
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : strategy_(other.strategy_), previous_(other.previous_) {
  other.strategy_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (strategy_ != nullptr) strategy_->require_sync_ = previous_;
}

Strategy::Strategy(Comm comm) : comm_(std::move(comm)) {}

void Strategy::set_step_runner(std::shared_ptr<StepRunner> runner) {
  TORCH_CHECK(runner != nullptr, "set_step_runner: runner is null");
  step_runner_ = std::move(runner);
}

void Strategy::setup(TrainingModule& module) {
  // A module built deferred gets its memory here, whole, on device(), and its
  // initial values from the module itself: every strategy accepts one. (FSDP
  // calls attach() alone and materialises one unit at a time.)
  if (module.has_deferred_parameters()) materialize_parameters(module, device());
  attach(module);
}

void Strategy::attach(TrainingModule& module) {
  module_ = &module;
  // In place (parameters keep their identity), before any strategy builds
  // buckets or flat buffers from them. Deferred parameters stay deferred.
  move_materialized(module.module(), device());
  params_.clear();
  param_names_.clear();
  param_shapes_.clear();
  for (const auto& item : module.module().named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    param_names_.push_back(item.key());
    param_shapes_.push_back(item.value().sizes().vec());  // deferred ones too: meta tensors have their shape
  }
}

TrainingModule& Strategy::module() const {
  TORCH_CHECK(module_ != nullptr, name(), ": setup() has not been called");
  return *module_;
}

void Strategy::offload_optimizer_state(std::shared_ptr<OffloadTier> tier, int64_t chunk_numel) {
  TORCH_CHECK(tier != nullptr, name(), ": offload_optimizer_state needs a tier");
  TORCH_CHECK(chunk_numel > 0, name(), ": offload chunk must be > 0 elements (got ", chunk_numel, ")");
  offload_tier_ = std::move(tier);
  offload_chunk_numel_ = chunk_numel;
}

OptimizerFactory Strategy::optimizer_factory_for(const OptimizerFactory& factory) const {
  if (!offload_tier_) return factory;
  return offloading_optimizer_factory(factory, offload_tier_, offload_chunk_numel_);
}

std::unique_ptr<torch::optim::Optimizer> Strategy::setup_optimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, const OptimizerFactory& factory) {
  return optimizer_factory_for(factory)(std::move(groups));
}

std::map<std::string, double> Strategy::report() const {
  if (sharded_) return sharded_->sharding_report();
  if (!offload_tier_) return {};
  return {{"offload_bytes", static_cast<double>(offload_tier_->bytes())},
          {"offload_io_s", offload_tier_->stats().seconds}};
}

std::shared_ptr<void> Strategy::full_params(bool writeback) {
  std::shared_ptr<void> sharded = sharded_ ? sharded_->gather_full_params(writeback) : nullptr;
  if (!model_parallel_) return sharded;
  // This rank's whole parts first (fsdp's gather), then the other dimension's
  // gather of the split parameters; undone in the reverse order.
  std::shared_ptr<void> split = model_parallel_->gather_full_params(module(), writeback);
  return std::shared_ptr<void>(split.get(), [split, sharded](void*) mutable {
    split.reset();
    sharded.reset();
  });
}

void Strategy::backward(const torch::Tensor& loss) { loss.backward(); }

std::vector<Strategy::ParamPiece> Strategy::grad_pieces_for_norm() const {
  // The optimizer's tensors carry this rank's gradients (whole parameters,
  // or 1-D pieces of a shard whose .grad() is the shard's gradient).
  std::vector<ParamPiece> pieces;
  for (const auto& piece : optimizer_param_pieces(StateUse::kLoad)) {
    const auto& grad = piece.values.grad();
    if (grad.defined()) pieces.push_back({piece.index, piece.offset, grad});
  }
  return pieces;
}

std::vector<torch::Tensor> Strategy::local_grads_for_norm() const {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

void Strategy::add_gradient_of_copy(const std::string& name,
                                    const std::function<torch::Tensor(const torch::Tensor&)>& exchange) {
  const auto at = std::find(param_names_.begin(), param_names_.end(), name);
  TORCH_CHECK(at != param_names_.end(), this->name(), ": no trainable parameter named ", name, " to sum with its copy");
  const auto k = static_cast<size_t>(at - param_names_.begin());
  const auto& shape = param_shapes_[k];
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions(params_[k].scalar_type()).device(device());
  torch::Tensor mine;
  if (grads_sharded()) {
    // Each element of the gradient is held by one rank of the group (the
    // norm's pieces: a replica's are left out), the rest are zeros here.
    mine = torch::zeros({c10::multiply_integers(shape)}, options);
    for (const auto& piece : grad_pieces_for_norm()) {
      if (piece.index == k) mine.narrow(0, piece.offset, piece.values.numel()).copy_(piece.values.reshape(-1));
    }
    // Sync point: the other copy's ranks need this group's whole gradient.
    comm_.all_reduce(mine);
  } else {
    const auto& grad = params_[k].grad();
    mine = grad.defined() ? grad.reshape(-1).to(options.dtype()) : torch::zeros({c10::multiply_integers(shape)}, options);
  }
  const torch::Tensor theirs = exchange(mine.view(shape)).reshape(-1);
  // Into what the optimizer steps (a replica's shards too), in place: a
  // strategy may hold a gradient as a view of its own buffer (ddp's buckets).
  for (const auto& piece : optimizer_param_pieces(StateUse::kLoad)) {
    if (piece.index != k) continue;
    const auto part = theirs.narrow(0, piece.offset, piece.values.numel()).view_as(piece.values);
    auto& grad = piece.values.mutable_grad();
    if (grad.defined()) {
      grad.add_(part.to(grad.scalar_type()));
    } else {
      grad = part.to(piece.values.scalar_type()).clone();
    }
  }
}

double Strategy::clip_grad_norm(double max_norm, double loss_scale) {
  TORCH_CHECK_VALUE(loss_scale > 0.0, "clip_grad_norm: loss_scale must be > 0, got ", loss_scale);
  // One norm per tensor (no copy of the gradients), squared and summed in
  // float64 so the sharded and single-process totals agree far better than
  // the parity tolerance; torch's clip_grad_norm_ also combines per-tensor norms.
  const std::vector<torch::Tensor> norms = local_grad_norms();
  auto sq = norms.empty() ? torch::zeros({1}, torch::TensorOptions(torch::kFloat64).device(device()))
                          : torch::stack(norms).to(torch::kFloat64).pow(2).sum().reshape({1});
  if (grads_sharded()) {
    // Sync point: every rank holds a disjoint shard of the gradient; the global
    // norm needs all of them, and every rank must compute the same coefficient.
    comm_.all_reduce(sq);
  }
  if (model_parallel_) {
    // Sync point: the other dimension's ranks hold the other parts of the
    // split parameters' gradients (local_grad_norms counted replicated ones once).
    model_parallel_->sum_over_group(sq);
  }
  const double scaled_norm = std::sqrt(scalar_value(sq));
  // Loss scaling: an inf/NaN anywhere makes the all-reduced sum non-finite
  // on every rank, so the ranks agree on skipping without another collective.
  // Unscaled, torch's formula stands (an infinite norm clips to zero).
  if (!std::isfinite(scaled_norm) && loss_scale != 1.0) return scaled_norm;
  const double norm = scaled_norm / loss_scale;
  // Unscale and clip in one pass over the gradients.
  double coef = 1.0 / loss_scale;
  if (max_norm > 0.0) {
    // torch.nn.utils.clip_grad_norm_'s formula, so single-process parity holds.
    coef *= std::min(1.0, max_norm / (norm + 1e-6));
  }
  if (coef != 1.0) scale_grads(coef);
  return norm;
}

std::vector<torch::Tensor> Strategy::local_grad_norms() const {
  if (model_parallel_) {
    // Piece by piece, so that replicated parameters count on one rank of the other dimension.
    std::vector<torch::Tensor> grads;
    for (const auto& piece : grad_pieces_for_norm()) {
      if (piece.values.defined() && model_parallel_->counts_gradient(param_names_[piece.index])) {
        grads.push_back(piece.values);
      }
    }
    if (grads.empty()) return {};
    return at::_foreach_norm(grads, 2);
  }
  if (sharded_) return sharded_->shard_grad_norms();
  // ATen's multi-tensor ops: on CUDA one launch per ~chunk of tensors instead of
  // one per gradient (a GPT-2 has ~150); on the CPU they loop over the tensors
  // with the same per-tensor ops as before (the same numbers).
  const auto grads = local_grads_for_norm();
  if (grads.empty()) return {};
  return at::_foreach_norm(grads, 2);
}

void Strategy::scale_grads(double coef) {
  if (sharded_) return sharded_->scale_shard_grads(coef);
  auto grads = local_grads_for_norm();
  if (!grads.empty()) at::_foreach_mul_(grads, coef);
}

void Strategy::optimizer_step(torch::optim::Optimizer& optimizer) { optimizer.step(); }

void Strategy::zero_grad(torch::optim::Optimizer& optimizer) {
  for (auto& p : params_) {
    // Set to none: frees the memory and lets AccumulateGrad steal the next grad.
    p.mutable_grad() = torch::Tensor();
  }
}

double Strategy::mean_over_ranks(double value) {
  if (world_size() == 1) return value;
  auto t = torch::full({1}, value, torch::TensorOptions(torch::kFloat64).device(device()));
  // Sync point: logged metrics are the mean over ranks so rank 0 prints (and
  // early stopping decides on) the same number every rank sees.
  comm_.all_reduce(t);
  return scalar_value(t) / world_size();
}

ModelStateBytes Strategy::model_state_bytes(const torch::optim::Optimizer& optimizer) const {
  if (sharded_) return sharded_->held_state_bytes(optimizer);
  ModelStateBytes bytes;
  std::vector<torch::Tensor> all_params;
  std::vector<torch::Tensor> grads;
  for (const auto& p : module().module().parameters()) {
    all_params.push_back(p);
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // Sharded strategies hand the optimizer shard views whose gradients live in
  // their own buffers; views of buffers already counted are deduplicated.
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  bytes.params = unique_storage_bytes(all_params);
  bytes.grads = unique_storage_bytes(grads);
  bytes.optimizer = optimizer_state_bytes(optimizer);
  return bytes;
}

std::string Strategy::describe() const {
  std::ostringstream out;
  out << name() << ": world size " << world_size();
  return out.str();
}

void broadcast_module_state(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  torch::NoGradGuard no_grad;
  // Sync point: every replica must start from rank 0's weights, or the ranks
  // would train different models from the first step on.
  std::vector<PendingWork> works;
  for (auto& p : module.parameters()) {
    // Deferred parameters have no values yet: whoever materialises them
    // broadcasts them (FSDP: each unit's full buffer).
    if (!is_deferred(p)) works.push_back(comm.broadcast_async(p, /*root=*/0));
  }
  for (auto& b : module.buffers()) works.push_back(comm.broadcast_async(b, /*root=*/0));
  for (auto& w : works) w.wait();
}

int64_t unique_storage_bytes(const std::vector<torch::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto* impl = t.storage().unsafeGetStorageImpl();
    if (seen.insert(impl).second) total += static_cast<int64_t>(impl->nbytes());
  }
  return total;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> tensors;
  for (const auto& entry : optimizer.state()) {
    // Each optimizer's state type exposes its tensors through serialization
    // only; the types strata uses are listed here.
    const auto* state = entry.second.get();
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      tensors.insert(tensors.end(), {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
    } else if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      tensors.insert(tensors.end(), {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
    } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      tensors.push_back(s->momentum_buffer());
    } else if (const auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(state)) {
      tensors.push_back(s->sum());
    } else if (const auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(state)) {
      tensors.insert(tensors.end(), {s->square_avg(), s->momentum_buffer(), s->grad_avg()});
    }
  }
  return unique_storage_bytes(tensors);
}

}  // namespace strata
