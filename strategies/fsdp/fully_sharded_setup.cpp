// FSDPStrategy's setup: the module attached and broadcast, one FlatParam per
// wrap unit's trainable and frozen parameters (and the root's), built and
// resharded one at a time, the gradient hooks, the optimizer over the
// shards. Kept apart from the step logic of fully_sharded.cpp.
#include "strata/strategies/fsdp/fully_sharded.h"

#include "strata/core/deferred_init.h"
#include "strata/core/parameter_ranges.h"
#include "strata/strategies/fsdp/hybrid.h"

#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace strata {

FSDPStrategy::FSDPStrategy(Comm comm, FSDPOptions options)
    : Strategy(std::move(comm)),
      options_(std::move(options)),
      reshard_after_forward_(resolve_reshard_after_forward(options_)),
      keep_last_unit_(reshard_after_forward_ && !options_.reshard_after_forward().has_value()),
      grad_sync_(options_.find_unused_parameters()) {
  // The module's tensors do not hold this rank's state between steps: the
  // base routes full_params, model_state_bytes, report and the clip here.
  set_sharded_state(this);
  // hybrid_shard's node size is checked now, before any collective.
  if (options_.sharding_strategy() == ShardingStrategy::kHybridShard)
    check_hybrid_node_size(options_.node_size(), world_size());
  check_offload_options(options_, device(),
                        options_.sharding_strategy() == ShardingStrategy::kHybridShard ? options_.node_size()
                                                                                       : world_size());
}

void FSDPStrategy::setup(TrainingModule& module) {
  TORCH_CHECK(!set_up_, name(), ": setup() was already called; one FSDPStrategy shards one module once");
  set_up_ = true;
  prepare_module(module);
  // Each parameter's AccumulateGrad node, created while the unit is gathered
  // and kept alive until grad_sync_ holds it: the node records its
  // parameter's shape when created, and must record the full one.
  std::vector<GradAccumulatorPtr> accumulators;
  build_units(module, accumulators);
  install_gradient_hooks();
  // From here on each rank holds shards only (make_part resharded each part;
  // with offload, not even those are in memory).
  // Mixed precision: wrap units compute in param_dtype (gathered straight
  // into a buffer of it: half the memory, nothing for autocast to cache);
  // the root, gathered for the whole step and holding the embeddings whose
  // outputs start the fp32 residual stream, keeps fp32 values in memory and
  // only travels in param_dtype.
  for (int i = 0; i < num_wrap_units_; ++i) {
    units_[i]->for_parts([&](FlatParam& part) { part.set_compute_dtype(options_.param_dtype()); });
  }
  if (num_wrap_units_ < static_cast<int>(units_.size())) {
    units_.back()->for_parts([&](FlatParam& part) { part.set_gather_dtype(options_.param_dtype()); });
  }
  module.add_unit_runner([this](int64_t unit, const torch::Tensor& x, const UnitFn& forward) {
    return run_unit(unit, x, forward);
  });
}

void FSDPStrategy::prepare_module(TrainingModule& module) {
  // Not Strategy::setup: a deferred module stays deferred (no memory) until
  // its units are built, one at a time.
  attach(module);
  // Every rank cuts its shards from rank 0's values (deferred parameters:
  // each unit's full buffer is broadcast once initialised, in make_part).
  broadcast_module_state(comm(), module.module());
  // Collective (hybrid_shard makes subgroups): every rank is here, in setup.
  FsdpGroups groups = make_fsdp_groups(comm(), options_);
  shard_comm_ = groups.shard;
  replicate_comm_ = groups.replicate;
  shard_world_ = shard_comm_.size();
  shard_rank_ = shard_comm_.rank();
  if (device().is_cpu()) {
    // Kept per size: at most what a step holds at once (two gathered units,
    // a full gradient, a reduction in flight with its gradient and receive
    // buffer); optimizer_step() trims it back to what the step's peak held.
    // Only buffers of 1 MiB and more (strata-gpt's mmap threshold): malloc
    // reuses smaller ones itself, and keeping them would only add memory.
    pool_ = std::make_unique<BufferPool>(c10::GetAllocator(c10::kCPU), /*max_free_per_size=*/8,
                                         /*min_bytes=*/size_t{1} << 20);
  }
  if (options_.offload() != OffloadKind::kNone) {
    tier_ = options_.offload() == OffloadKind::kDisk ? make_disk_tier(options_.offload_dir()) : make_host_tier();
  }
}

std::unique_ptr<FlatParam> FSDPStrategy::make_part(TrainingModule& module, const std::string& unit_name,
                                                   const std::vector<torch::Tensor>& all_params,
                                                   const std::vector<std::string>& all_names,
                                                   const std::vector<size_t>& members,
                                                   std::vector<GradAccumulatorPtr>& accumulators) {
  std::vector<torch::Tensor> ps;
  std::vector<std::string> names;
  for (size_t k : members) {
    ps.push_back(all_params[k]);
    names.push_back(all_names[k]);
  }
  // Only the deferred ones are initialised: a materialised parameter (one
  // tensor parallelism split) keeps its values.
  std::vector<bool> was_deferred;
  for (const auto& p : ps) was_deferred.push_back(is_deferred(p));
  DeferredParamInit deferred;
  deferred.device = device();
  deferred.fill = [&](const torch::Tensor& full) {
    for (size_t k = 0; k < ps.size(); ++k) {
      if (was_deferred[k]) module.init_parameter(names[k], ps[k]);
    }
    // Sync point: every rank cuts its shard from rank 0's values, as
    // broadcast_module_state guarantees for an eager module (the module's
    // init is seeded alike on every rank, but a rank seeded differently
    // must not train a different model).
    torch::Tensor buffer = full;
    comm().set_flight_label("unit " + unit_name + " init");
    if (world_size() > 1) comm().broadcast(buffer, /*root=*/0);
  };
  // A module that reads its values from files in parts (--init-from a
  // transformers directory): each rank reads only its shard's pieces. No
  // broadcast: every rank reads the same bytes, and every rank decides alike
  // (the same module, the same source), so the collectives still match.
  const auto* ranges = dynamic_cast<const ParameterRanges*>(&module);
  bool ranged = ranges != nullptr;
  for (size_t k = 0; k < ps.size() && ranged; ++k) ranged = was_deferred[k] && ranges->reads_ranges(names[k]);
  if (ranged) {
    deferred.fill_range = [&](size_t k, int64_t begin, int64_t end, const torch::Tensor& out) {
      ranges->read_range(names[k], begin, end, out);
    };
  }
  auto unit = std::make_unique<FlatParam>(unit_name, ps, names, shard_world_, shard_rank_, deferred);
  // Ranged, the full buffer holds nothing until a gather: only shapes are
  // read (the AccumulateGrad nodes below) before the reshard.
  unit->set_buffer_pool(pool_.get());
  if (!unit->frozen()) {
    for (const auto& p : unit->params()) accumulators.push_back(torch::autograd::impl::grad_accumulator(p));
  }
  unit->reshard();
  if (tier_ != nullptr) unit->offload(*tier_);  // before the next unit: setup never holds two units' shards in memory
  return unit;
}

namespace {
/// The module's frozen parameters (requires_grad false), each tensor once
/// (a tied weight under its first name), in registration order.
void frozen_parameters(const torch::nn::Module& module, std::vector<torch::Tensor>& ps,
                       std::vector<std::string>& names) {
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad() || !seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    ps.push_back(item.value());
    names.push_back(item.key());
  }
}
}  // namespace

void FSDPStrategy::build_units(TrainingModule& module, std::vector<GradAccumulatorPtr>& accumulators) {
  std::vector<torch::Tensor> frozen;
  std::vector<std::string> frozen_names;
  frozen_parameters(module.module(), frozen, frozen_names);
  const auto train = assign_units(module, params(), param_names(), options_.wrap_policy());
  const auto still = assign_units(module, frozen, frozen_names, options_.wrap_policy());
  // Built, initialised and resharded one at a time: with a deferred module no
  // rank ever holds more than its shards so far plus one unit's full buffer.
  // -1: the unit runs unwrapped (no parameters, or wrap policy none).
  index_of_unit_.assign(module.wrap_units().size(), -1);
  auto add_unit = [&](const std::string& name, const std::vector<size_t>& t, const std::vector<size_t>& f) {
    auto trainable = t.empty() ? nullptr : make_part(module, name, params(), param_names(), t, accumulators);
    auto still_part = f.empty() ? nullptr : make_part(module, name + " (frozen)", frozen, frozen_names, f, accumulators);
    units_.push_back(std::make_unique<FsdpUnit>(name, std::move(trainable), std::move(still_part)));
  };
  for (size_t u = 0; u < train.units.size(); ++u) {
    if (train.units[u].empty() && still.units[u].empty()) continue;
    index_of_unit_[u] = static_cast<int>(units_.size());
    add_unit(train.units[u].empty() ? still.unit_names[u] : train.unit_names[u], train.units[u], still.units[u]);
  }
  num_wrap_units_ = static_cast<int>(units_.size());
  if (!train.root.empty() || !still.root.empty()) {
    add_unit("root", train.root, still.root);
    root_ = units_.back()->train();  // null: the root has frozen parameters only
  }
}

void FSDPStrategy::install_gradient_hooks() {
  // One readiness bucket per unit, in the order backward finishes them: the
  // last wrap unit first, the root (embeddings, used first in forward) last.
  std::vector<torch::Tensor> hooked;
  std::vector<std::string> hooked_names;
  std::vector<std::vector<size_t>> buckets;
  auto add_bucket = [&](FsdpUnit& unit) {
    const FlatParam* train = unit.train();
    if (train == nullptr) return;  // frozen only: nothing to reduce
    unit_of_bucket_.push_back(&unit);
    buckets.emplace_back();
    for (size_t k = 0; k < train->params().size(); ++k) {
      unit.hooks().push_back(hooked.size());
      buckets.back().push_back(hooked.size());
      hooked.push_back(train->params()[k]);
      hooked_names.push_back(train->param_names()[k]);
      hooked_param_.emplace_back(train, k);
    }
  };
  for (int i = num_wrap_units_ - 1; i >= 0; --i) add_bucket(*units_[i]);
  if (num_wrap_units_ < static_cast<int>(units_.size())) add_bucket(*units_.back());
  // Installs the hooks now, before the first reshard: each AccumulateGrad
  // node records its parameter's shape when created, and must record the
  // full one. Active under no_sync too (the hooks still free each unit), but
  // not in a scheduled step: its units stay gathered until it ends.
  grad_sync_.install(hooked, std::move(hooked_names), std::move(buckets),
                     [this](size_t b) { post_backward(b); }, [this] { return !held_step_; });
}

std::unique_ptr<torch::optim::Optimizer> FSDPStrategy::setup_optimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, const OptimizerFactory& factory) {
  if (tier_ != nullptr) {
    // The state lives in the tier: the step is streamed from there (offload.h),
    // per parameter piece, with the groups' options.
    auto optimizer = std::make_unique<FsdpOffloadedOptimizer>(std::move(groups), trainable_parts(), *tier_,
                                                          options_.offload_chunk_numel());
    offloaded_optimizer_ = optimizer.get();
    return optimizer;
  }
  // Each parameter's pieces (1-D views of this rank's shards) go to the group
  // the parameter was in, so per-parameter choices such as weight decay
  // survive flattening. Exact for element-wise optimizers (SGD, Adam(W), ...).
  std::unordered_map<const void*, std::vector<torch::Tensor>> pieces_of;
  for (const FlatParam* unit : trainable_parts()) {
    for (size_t j = 0; j < unit->pieces().size(); ++j) {
      const auto& p = unit->params()[unit->piece_params()[j]];
      pieces_of[p.unsafeGetTensorImpl()].push_back(unit->pieces()[j]);
    }
  }
  std::unordered_map<const void*, bool> trainable;
  for (const auto& p : params()) trainable[p.unsafeGetTensorImpl()] = true;
  std::vector<torch::optim::OptimizerParamGroup> local;
  for (auto& group : groups) {
    std::vector<torch::Tensor> shard_params;
    for (const auto& p : group.params()) {
      TORCH_CHECK(trainable.count(p.unsafeGetTensorImpl()) == 1, name(),
                  ": the optimizer was given a parameter that is not trainable in the module");
      auto it = pieces_of.find(p.unsafeGetTensorImpl());
      if (it == pieces_of.end()) continue;  // wholly in other ranks' shards
      shard_params.insert(shard_params.end(), it->second.begin(), it->second.end());
      pieces_of.erase(it);  // a tensor listed twice is stepped once
    }
    if (!shard_params.empty()) local.emplace_back(std::move(shard_params), group.options().clone());
  }
  return factory(std::move(local));
}

}  // namespace strata
