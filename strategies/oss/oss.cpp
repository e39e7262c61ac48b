#include "strata/strategies/oss/oss.h"

#include <sstream>
#include <unordered_map>

namespace strata {

OSSStrategy::OSSStrategy(Comm comm, ShardOptions options)
    : Strategy(std::move(comm)), options_(options), grad_sync_(options.find_unused_parameters()) {
  TORCH_CHECK_VALUE(options_.bucket_cap_mb() > 0, "bucket_cap_mb must be > 0 (got ",
                    options_.bucket_cap_mb(), ")");
}

int64_t OSSStrategy::round_numel() const {
  const auto bytes = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  return std::max<int64_t>(1, bytes / (static_cast<int64_t>(sizeof(float)) * world_size()));
}

void OSSStrategy::setup(TrainingModule& module) {
  // Idempotent: a second fit (same or another module) rebuilds the layout,
  // the flat buffers and the hooks; pieces come back with setup_optimizer().
  optimizer_pieces_.clear();
  Strategy::setup(module);
  // Before any collective: every rank has the same parameters, so every rank
  // fails here alike and none waits in the broadcast.
  check_one_dtype(params(), param_names(), name());
  broadcast_module_state(comm(), module.module());
  layout_ = FlatLayout(params(), world_size());
  flat_params_ = flatten_into_buffer(params(), layout_);
  setup_gradients();
}

void OSSStrategy::setup_gradients() {
  // Full gradients as views into one flat buffer: the reduce-scatter reads it
  // in place and AccumulateGrad adds into it.
  flat_grads_ = torch::zeros_like(flat_params_);
  for (size_t k = 0; k < params().size(); ++k) {
    const auto& p = params()[k];
    p.mutable_grad() = flat_grads_.narrow(0, layout_.offset_of(k), p.numel()).view(p.sizes());
  }
  // Hooks only to learn which parameters got a gradient (one bucket, nothing
  // to launch: OSS reduces after backward).
  std::vector<size_t> all(params().size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = all.size() - 1 - k;
  grad_sync_.install(params(), param_names(), {all}, [](size_t) {}, [this] { return require_sync(); });
}

void OSSStrategy::backward(const torch::Tensor& loss) { grad_sync_.backward(loss, require_sync()); }

torch::Tensor OSSStrategy::owned_grad() const {
  return flat_grads_.narrow(0, layout_.shard_begin(rank()), layout_.shard_numel());
}

std::unique_ptr<torch::optim::Optimizer> OSSStrategy::setup_optimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, const OptimizerFactory& factory) {
  std::unordered_map<const void*, size_t> index_of;
  for (size_t k = 0; k < params().size(); ++k) index_of[params()[k].unsafeGetTensorImpl()] = k;
  std::unordered_map<size_t, std::vector<ShardPiece>> pieces_of;
  for (const auto& piece : layout_.pieces(rank())) pieces_of[piece.param_index].push_back(piece);

  const int64_t begin = layout_.shard_begin(rank());
  auto grad_shard = owned_grad();
  std::vector<torch::optim::OptimizerParamGroup> local;
  optimizer_pieces_.clear();
  for (auto& group : groups) {
    std::vector<torch::Tensor> shard_params;
    for (const auto& p : group.params()) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(it != index_of.end(), name(),
                  ": the optimizer was given a parameter that is not trainable in the module");
      for (const auto& piece : pieces_of[it->second]) {
        // The optimizer updates a 1-D view of this rank's part of the flat
        // parameters in place; its gradient is the matching reduced shard.
        auto view = flat_params_.narrow(0, piece.flat_offset, piece.numel);
        view.mutable_grad() = grad_shard.narrow(0, piece.flat_offset - begin, piece.numel);
        shard_params.push_back(view);
        optimizer_pieces_.push_back({it->second, piece.param_offset, view});
      }
    }
    if (shard_params.empty()) continue;
    local.emplace_back(std::move(shard_params), group.options().clone());
  }
  return optimizer_factory_for(factory)(std::move(local));
}

void OSSStrategy::check_trainable_unchanged() const {
  std::vector<std::string> changed;
  for (size_t k = 0; k < params().size(); ++k) {
    if (!params()[k].requires_grad()) changed.push_back(param_names()[k]);
  }
  TORCH_CHECK(changed.empty(), name(), ": parameter(s) ", c10::Join(", ", changed),
              " stopped requiring grad after setup; the sharded strategies fix the trainable "
              "set at setup, so freeze parameters before building the Trainer");
}

void OSSStrategy::reduce_gradients() {
  check_trainable_unchanged();
  // Sync point: after backward every rank holds full local gradients; each
  // owner needs the sum of its shard over ranks before stepping. A parameter
  // a rank did not use holds zeros there (zero_grad), i.e. counts as zero.
  sharded_reduce_scatter(comm(), flat_grads_, layout_, round_numel());
  owned_grad().div_(world_size());
  grad_sync_.resolve_unused(comm(), name());
}

void OSSStrategy::optimizer_step(torch::optim::Optimizer& optimizer) {
  {
    // Pieces of parameters no rank used (find_unused_parameters) are skipped,
    // as torch skips a parameter without a gradient (see grad_sync.h).
    std::vector<torch::Tensor> unused;
    for (size_t k : grad_sync_.unused_everywhere()) {
      for (const auto& piece : optimizer_pieces_) {
        if (piece.index == k) unused.push_back(piece.values);
      }
    }
    HiddenGrads hidden(std::move(unused));
    optimizer.step();
  }
  // Sync point: each rank updated only its shard; all-gather so every replica
  // runs the next forward with the same, fully updated parameters.
  comm().set_flight_label("updated shards");
  sharded_all_gather(comm(), flat_params_, layout_, round_numel());
}

std::vector<Strategy::ParamPiece> OSSStrategy::param_pieces(StateUse use) const {
  if (use == StateUse::kLoad) return Strategy::param_pieces(use);
  std::vector<ParamPiece> out;
  for (const auto& piece : layout_.pieces(rank())) {
    out.push_back({piece.param_index, piece.param_offset, flat_params_.narrow(0, piece.flat_offset, piece.numel)});
  }
  return out;
}

std::vector<Strategy::ParamPiece> OSSStrategy::optimizer_param_pieces(StateUse) const {
  return optimizer_pieces_;
}

void OSSStrategy::zero_grad(torch::optim::Optimizer&) { flat_grads_.zero_(); }

std::string OSSStrategy::describe() const {
  std::ostringstream out;
  out << name() << ": " << layout_.describe(param_names());
  return out.str();
}

}  // namespace strata
