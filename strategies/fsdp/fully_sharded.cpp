#include "strategies/fsdp/fully_sharded.h"

#include "core/deferred_init.h"
#include "strategies/ddp.h"
#include "strategies/fsdp/hybrid.h"
#include "strategies/fsdp/pre_backward.h"
#include "strategies/grad_buckets.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace strata {

FSDPStrategy::FSDPStrategy(Comm comm, FSDPOptions options)
    : Strategy(std::move(comm)),
      options_(std::move(options)),
      reshard_after_forward_(resolve_reshard_after_forward(options_)),
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
  // From here on each rank holds shards only (make_unit resharded each unit;
  // with offload, not even those are in memory).
  // Mixed precision: wrap units compute in param_dtype (gathered straight
  // into a buffer of it: half the memory, nothing for autocast to cache);
  // the root, gathered for the whole step and holding the embeddings whose
  // outputs start the fp32 residual stream, keeps fp32 values in memory and
  // only travels in param_dtype.
  for (int i = 0; i < num_wrap_units_; ++i) units_[i]->set_compute_dtype(options_.param_dtype());
  if (root_ != nullptr) root_->set_gather_dtype(options_.param_dtype());
  module.add_unit_runner([this](int64_t unit, const torch::Tensor& x, const UnitFn& forward) {
    return run_unit(unit, x, forward);
  });
}

void FSDPStrategy::prepare_module(TrainingModule& module) {
  // Not Strategy::setup: a deferred module stays deferred (no memory) until
  // its units are built, one at a time.
  attach(module);
  // Frozen parameters are not sharded (held whole): materialised whole now,
  // and broadcast with the rest of the module's state below.
  materialize_parameters(module, device(), [](const std::string&, const torch::Tensor& p) {
    return !p.requires_grad();
  });
  // Every rank cuts its shards from rank 0's values (deferred parameters:
  // each unit's full buffer is broadcast once initialised, in make_unit).
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

std::unique_ptr<FlatParam> FSDPStrategy::make_unit(TrainingModule& module, const std::string& unit_name,
                                                   const std::vector<size_t>& members,
                                                   std::vector<GradAccumulatorPtr>& accumulators) {
  std::vector<torch::Tensor> ps;
  std::vector<std::string> names;
  for (size_t k : members) {
    ps.push_back(params()[k]);
    names.push_back(param_names()[k]);
  }
  DeferredParamInit deferred;
  deferred.device = device();
  deferred.fill = [&](const torch::Tensor& full) {
    for (size_t k = 0; k < ps.size(); ++k) module.init_parameter(names[k], ps[k]);
    // Sync point: every rank cuts its shard from rank 0's values, as
    // broadcast_module_state guarantees for an eager module (the module's
    // init is seeded alike on every rank, but a rank seeded differently
    // must not train a different model).
    torch::Tensor buffer = full;
    if (world_size() > 1) comm().broadcast(buffer, /*root=*/0);
  };
  auto unit = std::make_unique<FlatParam>(unit_name, ps, names, shard_world_, shard_rank_, deferred);
  unit->set_buffer_pool(pool_.get());
  for (const auto& p : unit->params()) accumulators.push_back(torch::autograd::impl::grad_accumulator(p));
  unit->reshard();
  if (tier_ != nullptr) unit->offload(*tier_);  // before the next unit: setup never holds two units' shards in memory
  return unit;
}

void FSDPStrategy::build_units(TrainingModule& module, std::vector<GradAccumulatorPtr>& accumulators) {
  const auto assignment = assign_units(module, params(), param_names(), options_.wrap_policy());
  // Built, initialised and resharded one at a time: with a deferred module no
  // rank ever holds more than its shards so far plus one unit's full buffer.
  // -1: the unit runs unwrapped (no trainable parameters, or wrap policy none).
  index_of_unit_.assign(module.wrap_units().size(), -1);
  for (size_t u = 0; u < assignment.units.size(); ++u) {
    if (assignment.units[u].empty()) continue;
    index_of_unit_[u] = static_cast<int>(units_.size());
    units_.push_back(make_unit(module, assignment.unit_names[u], assignment.units[u], accumulators));
  }
  num_wrap_units_ = static_cast<int>(units_.size());
  if (!assignment.root.empty()) {
    units_.push_back(make_unit(module, "root", assignment.root, accumulators));
    root_ = units_.back().get();
  }
}

void FSDPStrategy::install_gradient_hooks() {
  // One readiness bucket per unit, in the order backward finishes them: the
  // last wrap unit first, the root (embeddings, used first in forward) last.
  std::vector<torch::Tensor> hooked;
  std::vector<std::string> hooked_names;
  std::vector<std::vector<size_t>> buckets;
  auto add_bucket = [&](int index) {
    unit_of_bucket_.push_back(index);
    buckets.emplace_back();
    const auto& unit = *units_[index];
    for (size_t k = 0; k < unit.params().size(); ++k) {
      hooks_of_unit_[index].push_back(hooked.size());
      buckets.back().push_back(hooked.size());
      hooked.push_back(unit.params()[k]);
      hooked_names.push_back(unit.param_names()[k]);
      hooked_param_.emplace_back(index, k);
    }
  };
  hooks_of_unit_.assign(units_.size(), {});
  for (int i = num_wrap_units_ - 1; i >= 0; --i) add_bucket(i);
  if (root_ != nullptr) add_bucket(num_wrap_units_);
  // Installs the hooks now, before the first reshard: each AccumulateGrad
  // node records its parameter's shape when created, and must record the
  // full one. Always active: under no_sync the hooks still free each unit.
  grad_sync_.install(hooked, std::move(hooked_names), std::move(buckets),
                     [this](size_t b) { post_backward(b); }, [] { return true; });
}

std::unique_ptr<torch::optim::Optimizer> FSDPStrategy::setup_optimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, const OptimizerFactory& factory) {
  if (tier_ != nullptr) {
    // The state lives in the tier: the step is streamed from there (offload.h),
    // per parameter piece, with the groups' options.
    std::vector<FlatParam*> units;
    for (auto& unit : units_) units.push_back(unit.get());
    auto optimizer = std::make_unique<FsdpOffloadedOptimizer>(std::move(groups), std::move(units), *tier_,
                                                          options_.offload_chunk_numel());
    offloaded_optimizer_ = optimizer.get();
    return optimizer;
  }
  // Each parameter's pieces (1-D views of this rank's shards) go to the group
  // the parameter was in, so per-parameter choices such as weight decay
  // survive flattening. Exact for element-wise optimizers (SGD, Adam(W), ...).
  std::unordered_map<const void*, std::vector<torch::Tensor>> pieces_of;
  for (const auto& unit : units_) {
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

torch::Tensor FSDPStrategy::run_unit(int64_t unit, const torch::Tensor& x, const UnitFn& forward) {
  TORCH_CHECK(unit < static_cast<int64_t>(index_of_unit_.size()), name(), ": the module ran unit ",
              unit, " but named ", index_of_unit_.size(), " wrap units at setup");
  const int index = index_of_unit_[unit];
  if (index < 0) return forward(x);
  FlatParam& flat = *units_[index];
  // Called during backward: an activation checkpoint installed outside FSDP
  // recomputes the unit, and the unit's own backward follows at once.
  const bool recompute = in_backward_;
  gather(index);
  if (!recompute) prefetch(index + 1);  // overlaps the next unit's all-gather with this forward
  // A unit computing in low precision (mixed precision) takes its input in
  // that dtype, as torch's FSDP casts forward inputs, and hands its output
  // back in the caller's dtype, so the stream between units keeps its own.
  const auto compute = flat.compute_dtype();
  const bool cast = x.is_floating_point() && x.scalar_type() != compute && compute != flat.dtype();
  auto out = cast ? forward(x.to(compute)).to(x.scalar_type()) : forward(x);
  const bool grad = torch::GradMode::is_enabled();
  if (grad && out.requires_grad()) out = with_pre_backward_hook(out, [this, index] { pre_backward(index); });
  // Without grad no backward will come for this unit: always free it.
  if (!grad || (reshard_after_forward_ && !recompute)) flat.reshard();
  return out;
}

void FSDPStrategy::begin_forward() {
  // The root's parameters (embeddings, final norm, head) are used before the
  // first unit and after the last one; gather them for the whole micro-batch.
  if (root_ != nullptr) root_->finish_gather(shard_comm_);
  prefetch(0);
}

torch::Tensor FSDPStrategy::training_step(TrainingModule& module, const Batch& batch) {
  begin_forward();
  auto loss = module.training_step(batch);
  if (!torch::GradMode::is_enabled()) reshard_all();
  return loss;
}

ValidationStep FSDPStrategy::validation_step(TrainingModule& module, const Batch& batch) {
  begin_forward();
  auto out = module.validation_step(batch);
  reshard_all();
  return out;
}

void FSDPStrategy::gather(int index) {
  RECORD_FUNCTION("strata::fsdp_gather", std::vector<c10::IValue>());  // a span in --profile traces
  FlatParam& unit = *units_[index];
  unit.finish_gather(shard_comm_);
  if (unit.compute_dtype() != unit.dtype()) {
    // The parameters changed dtype (set_data), which drops their gradient
    // accumulators: hook the new ones before the unit's graph uses them.
    for (size_t k : hooks_of_unit_[index]) grad_sync_.rehook(k);
  }
  max_units_gathered_ = std::max(max_units_gathered_, wrap_units_holding_full());
}

void FSDPStrategy::prefetch(int index) {
  if (index < 0 || index >= num_wrap_units_) return;
  FlatParam& unit = *units_[index];
  if (!unit.sharded() || unit.holds_full()) return;
  // Decided from state every rank has alike (never from whether a collective
  // has finished), so every rank issues the same all-gathers in the same order.
  if (options_.limit_all_gathers() && wrap_units_holding_full() >= kMaxUnitsGathered) return;
  unit.start_gather(shard_comm_);
  max_units_gathered_ = std::max(max_units_gathered_, wrap_units_holding_full());
}

int FSDPStrategy::wrap_units_holding_full() const {
  int n = 0;
  for (int i = 0; i < num_wrap_units_; ++i) n += units_[i]->sharded() && units_[i]->holds_full();
  return n;
}

void FSDPStrategy::backward(const torch::Tensor& loss) {
  sync_backward_ = require_sync();
  if (root_ != nullptr) root_->prepare_grads();
  prefetch(num_wrap_units_ - 1);  // backward reaches the last unit first
  // The step's peak so far (a model of one unit has no pre_backward); the
  // first unit's pre_backward replaces it with the larger set it holds.
  if (pool_ != nullptr) pool_at_peak_ = pool_->in_use();
  peak_noted_ = false;
  struct InBackward {
    bool& flag;
    explicit InBackward(bool& f) : flag(f) { flag = true; }
    ~InBackward() { flag = false; }
  } in_backward(in_backward_);
  // Every backward resets readiness (not only synchronised ones): under
  // no_sync the hooks still free each unit's full parameters.
  grad_sync_.backward(loss, /*require_sync=*/true);
}

void FSDPStrategy::pre_backward(int index) {
  // Runs on the autograd thread when the gradient w.r.t. unit `index`'s
  // output is complete, before any of the unit's backward nodes.
  FlatParam& unit = *units_[index];
  gather(index);  // Sync point: the unit's backward reads its full parameters
  prefetch(index - 1);
  unit.prepare_grads();
  if (pool_ != nullptr && !peak_noted_) {
    // Every activation is still alive and the first unit's buffers are all
    // held: what a step holds at its peak (optimizer_step keeps that much).
    pool_at_peak_ = pool_->in_use();
    peak_noted_ = true;
  }
}

void FSDPStrategy::post_backward(size_t bucket) {
  // Called from the AccumulateGrad post-hook of the unit's last parameter
  // (GradReadiness, in bucket order), or from reduce_gradients() for a unit
  // whose parameters did not all get a gradient.
  FlatParam& unit = *units_[unit_of_bucket_[bucket]];
  // A unit whose backward never started still takes part with zeros: every
  // rank must issue the same collectives.
  unit.prepare_grads();
  if (sync_backward_) launch_reduction(unit);
  unit.reshard();
}

void FSDPStrategy::launch_reduction(FlatParam& unit) {
  if (!unit.sharded() && world_size() == 1) return;  // the local gradient is the gradient
  // Bound memory: each reduction in flight holds a full gradient.
  while (in_flight_.size() >= kMaxReductionsInFlight) finish_oldest_reduction();
  Reduction r;
  r.unit = &unit;
  // reduce_dtype (mixed precision): the gradient is cast for the wire (bf16:
  // half the bytes) and the sum upcast into the fp32 shard gradient.
  const auto dtype = options_.reduce_dtype().value_or(unit.dtype());
  torch::NoGradGuard no_grad;
  if (unit.sharded()) {
    r.input = unit.full_grad().to(dtype);  // no copy when the dtype is the same
    r.output = scratch(unit.layout().shard_numel(), r.input.options());
    unit.release_full_grad();  // the parameters' grads go; r.input keeps the buffer for the collective
    // Async: the rest of backward runs while this unit's gradient is reduced.
    // On CPU (Gloo's emulation) the all-to-all receives into a pooled buffer;
    // NCCL reduce-scatters natively and needs none.
    const auto workspace = pool_ != nullptr ? pool_->empty(r.input.numel(), r.input.options()) : torch::Tensor();
    r.work = shard_comm_.reduce_scatter_async(r.output, r.input, workspace);
  } else {
    // no_shard: the full gradient, reduced in place (or in a cast copy)
    r.output = unit.shard_grad().to(dtype);
    r.work = replicate_comm_.all_reduce_async(r.output);
  }
  in_flight_.push_back(std::move(r));
}

void FSDPStrategy::finish_oldest_reduction() {
  Reduction r = std::move(in_flight_.front());
  in_flight_.pop_front();
  // Sync point: the shard gradient may only be read once the sum has arrived.
  r.work.wait();
  torch::NoGradGuard no_grad;
  // Upcast first (no copy when the reduction ran in the shard's dtype).
  auto sum = r.output.to(r.unit->dtype());
  if (r.unit->sharded() && replicate_comm_.size() > 1) {
    // hybrid_shard: the node's sum of this shard, summed again over the ranks
    // holding the same shard on the other nodes, in the shard gradient's dtype
    // (Gloo cannot sum bf16). Sync point: it reads the reduce-scatter's result
    // (waited above) and the add below reads its own.
    replicate_comm_.all_reduce(sum);
  }
  // Divided after the upcast: a bf16 sum divided in fp32 loses no more.
  auto mean = sum.div_(world_size());
  if (r.unit->sharded()) {
    // Added, not copied: gradients accumulate over synchronised backwards
    // (offloaded: into the tier's copy).
    r.unit->accumulate_shard_grad(mean);
  } else if (!mean.is_same(r.unit->shard_grad())) {
    r.unit->shard_grad().copy_(mean);  // reduced in a cast copy
  }
}

void FSDPStrategy::reduce_gradients() {
  // Units whose parameters did not all get a gradient are reduced now, in
  // bucket order, with the missing gradients as zeros: every rank issues the
  // same collectives whether or not its parameters were used.
  grad_sync_.launch_remaining();
  // Sync point: the optimizer steps the shards only after every reduction
  // into them has arrived.
  while (!in_flight_.empty()) finish_oldest_reduction();
  // Sync point: ranks agree on parameters without a gradient (grad_sync.h):
  // an error naming them on every rank, or, with find_unused_parameters, the
  // list of those no rank used, for optimizer_step to hide.
  grad_sync_.resolve_unused(comm(), name());
}

std::vector<torch::Tensor> FSDPStrategy::pieces_unused_everywhere() const {
  // The optimizer steps per-parameter pieces of the shards: hiding a
  // parameter's pieces makes torch skip it, as it skips a .grad == None.
  std::vector<torch::Tensor> hidden;
  for (size_t k : grad_sync_.unused_everywhere()) {
    const auto& [index, param] = hooked_param_[k];
    const auto& unit = *units_[index];
    for (size_t j = 0; j < unit.pieces().size(); ++j) {
      if (unit.piece_params()[j] == param) hidden.push_back(unit.pieces()[j]);
    }
  }
  return hidden;
}

void FSDPStrategy::reshard_all() {
  for (auto& unit : units_) unit->reshard();
}

torch::Tensor FSDPStrategy::scratch(int64_t numel, const torch::TensorOptions& options) {
  return pool_ != nullptr ? pool_->empty(numel, options) : torch::empty({numel}, options);
}

void FSDPStrategy::end_step() {
  while (!in_flight_.empty()) finish_oldest_reduction();
  // Nothing should be gathered here; if something is (a forward without
  // backward), free it so the next forward gathers the updated shards.
  reshard_all();
  // Backward needed more buffers at once than the step's activation peak
  // holds (the start of backward: every activation, the root and its
  // gradient, two gathered units and the first unit's full gradient): keep
  // per size only as many as were in use there, so the kept buffers add
  // nothing to that peak; backward's extra ones are allocated anew.
  if (pool_ != nullptr) pool_->trim_to(pool_at_peak_);
}

void FSDPStrategy::optimizer_step(torch::optim::Optimizer& optimizer) {
  end_step();
  if (offloaded_optimizer_ != nullptr) {
    TORCH_CHECK(&optimizer == offloaded_optimizer_, name(), ": with offload, step the optimizer setup_optimizer() made");
    std::unordered_set<const void*> skipped;
    for (size_t k : grad_sync_.unused_everywhere()) {
      const auto& [index, param] = hooked_param_[k];
      skipped.insert(units_[index]->params()[param].unsafeGetTensorImpl());
    }
    offloaded_optimizer_->set_skipped(std::move(skipped));
    optimizer.step();
    return;
  }
  HiddenGrads hide(pieces_unused_everywhere());
  optimizer.step();
}

void FSDPStrategy::zero_grad(torch::optim::Optimizer&) {
  end_step();  // again (idempotent): a skipped step (16-mixed overflow) calls no optimizer_step
  for (auto& unit : units_) {
    unit->release_full_grad();
    unit->zero_shard_grad();
  }
}

}  // namespace strata
