#include "strata/strategies/fsdp/fully_sharded.h"

#include "strata/core/deferred_init.h"
#include "strata/strategies/fsdp/hybrid.h"
#include "strata/strategies/fsdp/pre_backward.h"
#include "strata/strategies/grad_buckets.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace strata {

torch::Tensor FSDPStrategy::run_unit(int64_t module_unit, const torch::Tensor& x, const UnitFn& forward) {
  TORCH_CHECK(module_unit < static_cast<int64_t>(index_of_unit_.size()), name(), ": the module ran unit ",
              module_unit, " but named ", index_of_unit_.size(), " wrap units at setup");
  const int index = index_of_unit_[module_unit];
  if (index < 0) return forward(x);
  const FsdpUnit& unit = *units_[index];
  // Called during backward: an activation checkpoint installed outside FSDP
  // recomputes the unit, and the unit's own backward follows at once.
  const bool recompute = in_backward_;
  // A scheduled step gathered every unit and keeps them: no gather, no
  // reshard, no hook (its gradients are reduced when the schedule ends).
  const bool held = held_step_;
  if (!held) gather(index);
  if (!held && !recompute) prefetch(index + 1);  // overlaps the next unit's all-gather with this forward
  const bool grad = torch::GradMode::is_enabled() && !held;
  const torch::Tensor in = grad && unit.frozen() != nullptr ? hook_frozen_input(module_unit, index, x, recompute) : x;
  // A unit computing in low precision (mixed precision) takes its input in
  // that dtype, as torch's FSDP casts forward inputs, and hands its output
  // back in the caller's dtype, so the stream between units keeps its own.
  const FlatParam& flat = unit.lead();
  const auto compute = flat.compute_dtype();
  const bool cast = x.is_floating_point() && x.scalar_type() != compute && compute != flat.dtype();
  auto out = cast ? forward(in.to(compute)).to(x.scalar_type()) : forward(in);
  if (grad && out.requires_grad()) out = with_pre_backward_hook(out, [this, index] { pre_backward(index); });
  if (!held) reshard_after_unit_forward(index, grad, recompute);
  return out;
}

torch::Tensor FSDPStrategy::hook_frozen_input(int64_t module_unit, int index, const torch::Tensor& x,
                                              bool recompute) {
  FsdpUnit& unit = *units_[index];
  // A second run's backward could read the frozen part after the first
  // run's input gradient freed it.
  TORCH_CHECK(!unit.ran_with_grad() || recompute, name(), ": wrap unit ", module_unit, " ran twice in one "
              "forward; a unit with frozen parameters may run once per micro-batch (its frozen part is freed after "
              "its input's gradient arrives)");
  unit.mark_ran_with_grad();
  if (!x.requires_grad()) return x;
  // Reports when the gradient w.r.t. the unit's input is complete: every
  // input-gradient computation (those reading the frozen part) is done.
  unit.mark_input_hooked();
  return with_pre_backward_hook(x, [this, index] { input_backward_done(index); });
}

void FSDPStrategy::reshard_after_unit_forward(int index, bool grad, bool recompute) {
  // Without grad no backward will come for this unit's graph: free it (an
  // activation checkpoint's recompute gathers it again). Except: unset
  // reshard_after_forward keeps the last unit gathered when a backward
  // follows (torchtitan's default): backward starts with it and would gather
  // it again at once, with nothing to overlap that all-gather. That holds
  // under a checkpoint's no-grad forward too, whose recompute needs it then.
  const bool keep = keep_last_unit_ && backward_follows_ && index == num_wrap_units_ - 1;
  if (keep) return;
  if (!grad || (reshard_after_forward_ && !recompute)) units_[index]->reshard();
}

void FSDPStrategy::begin_forward() {
  for (auto& unit : units_) unit->begin_micro_batch();
  // The root's parameters (embeddings, final norm, head) are used before the
  // first unit and after the last one; gather them for the whole micro-batch.
  if (num_wrap_units_ < static_cast<int>(units_.size())) {
    units_.back()->for_parts([&](FlatParam& part) { part.finish_gather(shard_comm_); });
  }
  prefetch(0);
}

torch::Tensor FSDPStrategy::training_step(TrainingModule& module, const Batch& batch) {
  begin_forward();
  backward_follows_ = torch::GradMode::is_enabled();
  auto loss = module.training_step(batch);
  if (!backward_follows_) reshard_all();
  return loss;
}

ValidationStep FSDPStrategy::validation_step(TrainingModule& module, const Batch& batch) {
  begin_forward();
  backward_follows_ = false;
  auto out = module.validation_step(batch);
  reshard_all();
  return out;
}

void FSDPStrategy::begin_scheduled_step(bool training) {
  TORCH_CHECK(!held_step_, name(), ": begin_scheduled_step() twice without end_scheduled_step()");
  TORCH_CHECK(tier_ == nullptr, name(), ": --offload under a pipeline schedule is not composed yet (the tied "
              "weight's sum and the held gathers need the shards in memory)");
  for (auto& unit : units_) unit->begin_micro_batch();
  // Every all-gather started before the first is waited for: they overlap.
  for (auto& unit : units_) unit->for_parts([&](FlatParam& part) { part.start_gather(shard_comm_); });
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    gather(i);
    if (FlatParam* train = units_[i]->train(); training && train != nullptr) train->prepare_grads();
  }
  held_step_ = true;
  backward_follows_ = training;
}

void FSDPStrategy::end_scheduled_step() {
  if (!held_step_) return;
  held_step_ = false;
  // The step's peak: every unit gathered, every full gradient held.
  if (pool_ != nullptr) pool_at_peak_ = pool_->in_use();
  if (backward_follows_) {
    // Every unit in bucket order, each reduce-scattered and resharded
    // (post_backward, as a synchronised backward's hooks would have);
    // reduce_gradients() waits for the last ones.
    sync_backward_ = true;
    grad_sync_.launch_remaining();
    backward_follows_ = false;
  }
  reshard_all();  // frozen parts and, after validation, everything
}

void FSDPStrategy::gather(int index) {
  RECORD_FUNCTION("strata::fsdp_gather", std::vector<c10::IValue>());  // a span in --profile traces
  const FsdpUnit& unit = *units_[index];
  if (unit.frozen() != nullptr) unit.frozen()->finish_gather(shard_comm_);
  if (FlatParam* train = unit.train()) {
    train->finish_gather(shard_comm_);
    if (train->compute_dtype() != train->dtype()) {
      // The parameters changed dtype (set_data), which drops their gradient
      // accumulators: hook the new ones before the unit's graph uses them.
      for (size_t k : unit.hooks()) grad_sync_.rehook(k);
    }
  }
  max_units_gathered_ = std::max(max_units_gathered_, wrap_units_holding_full());
}

void FSDPStrategy::prefetch(int index) {
  if (index < 0 || index >= num_wrap_units_) return;
  const FsdpUnit& unit = *units_[index];
  if (!unit.needs_gather()) return;
  // Decided from state every rank has alike (never from whether a collective
  // has finished), so every rank issues the same all-gathers in the same order.
  if (options_.limit_all_gathers() && wrap_units_holding_full() >= kMaxUnitsGathered) return;
  unit.for_parts([&](FlatParam& part) { part.start_gather(shard_comm_); });
  max_units_gathered_ = std::max(max_units_gathered_, wrap_units_holding_full());
}

int FSDPStrategy::wrap_units_holding_full() const {
  int n = 0;
  for (int i = 0; i < num_wrap_units_; ++i) n += units_[i]->holds_full();
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
  backward_follows_ = false;
  // Frozen parts no event freed (the root's; a unit whose input needed no
  // gradient): backward is over, nothing reads them any more.
  for (auto& unit : units_) {
    if (unit->frozen() != nullptr) unit->frozen()->reshard();
  }
}

void FSDPStrategy::pre_backward(int index) {
  // Runs on the autograd thread when the gradient w.r.t. unit `index`'s
  // output is complete, before any of the unit's backward nodes.
  gather(index);  // Sync point: the unit's backward reads its full parameters
  prefetch(index - 1);
  if (FlatParam* train = units_[index]->train()) train->prepare_grads();
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
  FsdpUnit& unit = *unit_of_bucket_[bucket];
  FlatParam& train = *unit.train();
  // A unit whose backward never started still takes part with zeros: every
  // rank must issue the same collectives.
  train.prepare_grads();
  if (sync_backward_) launch_reduction(train);
  train.reshard();
  unit.mark_train_done();
  unit.maybe_reshard_frozen();
}

void FSDPStrategy::input_backward_done(int index) {
  // On the autograd thread: the unit's input gradient is complete.
  units_[index]->mark_input_done();
  units_[index]->maybe_reshard_frozen();
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
    shard_comm_.set_flight_label("unit " + unit.name());
    r.work = shard_comm_.reduce_scatter_async(r.output, r.input, workspace);
  } else {
    // no_shard: the full gradient, reduced in place (or in a cast copy)
    r.output = unit.shard_grad().to(dtype);
    replicate_comm_.set_flight_label("unit " + unit.name());
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
  if (r.unit->sharded()) {
    // Added, not copied: gradients accumulate over synchronised backwards
    // (offloaded: into the tier's copy). The mean is taken in the same pass.
    r.unit->accumulate_shard_grad(sum, 1.0 / world_size());
    return;
  }
  auto mean = sum.div_(world_size());
  if (!mean.is_same(r.unit->shard_grad())) {
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
    const auto& [part, param] = hooked_param_[k];
    const FlatParam& unit = *part;
    for (size_t j = 0; j < unit.pieces().size(); ++j) {
      if (unit.piece_params()[j] == param) hidden.push_back(unit.pieces()[j]);
    }
  }
  return hidden;
}

void FSDPStrategy::reshard_all() {
  // Per step (end_step): the units directly, no list of parts built.
  for (auto& unit : units_) unit->reshard();
}

std::vector<FlatParam*> FSDPStrategy::trainable_parts() const {
  std::vector<FlatParam*> parts;
  for (const auto& unit : units_) {
    if (unit->train() != nullptr) parts.push_back(unit->train());
  }
  return parts;
}

std::vector<FlatParam*> FSDPStrategy::frozen_parts() const {
  std::vector<FlatParam*> parts;
  for (const auto& unit : units_) {
    if (unit->frozen() != nullptr) parts.push_back(unit->frozen());
  }
  return parts;
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
      const auto& [part, param] = hooked_param_[k];
      skipped.insert(part->params()[param].unsafeGetTensorImpl());
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
    if (FlatParam* train = unit->train()) {
      train->release_full_grad();
      train->zero_shard_grad();
    }
  }
}

}  // namespace strata
