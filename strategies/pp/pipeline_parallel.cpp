// PipelineParallel (pipeline_parallel.h).
#include "strata/strategies/pp/pipeline_parallel.h"

#include "strata/strategies/piece_names.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <set>

namespace strata::pp {

namespace {

// Tags outside a step's (executor.cpp: boundary, micro-batch and direction).
constexpr int kValidationTag = 1 << 30;
constexpr int kGatherTag = 1 << 29;

}  // namespace

PipelineParallel::PipelineParallel(Comm world, Comm group, StageModule& module, PipelineOptions options)
    : world_(std::move(world)),
      group_(std::move(group)),
      lanes_(PipelineLanes::split(group_)),
      module_(module),
      options_(std::move(options)),
      tied_(module.model().tied_parameters()) {
  const int stages = static_cast<int>(module_.cuts().size());
  TORCH_CHECK_VALUE(stages == group_.size() * options_.virtual_stages(), "a pipeline of ", group_.size(),
                    " ranks with ", options_.virtual_stages(), " stage(s) each needs ",
                    group_.size() * options_.virtual_stages(), " stages, got ", stages);
  for (const auto& [s, cut] : module_.held()) {
    TORCH_CHECK_VALUE(s % group_.size() == group_.rank(), "pipeline rank ", group_.rank(), " holds stage ", s,
                      ", which lives on rank ", s % group_.size());
  }
}

const Schedule& PipelineParallel::schedule_for(int microbatches) {
  if (!schedule_ || schedule_->options().microbatches() != microbatches) {
    schedule_ = make_schedule(options_.schedule(), ScheduleOptions()
                                                       .ranks(group_.size())
                                                       .microbatches(microbatches)
                                                       .virtual_stages(options_.virtual_stages()));
  }
  return *schedule_;
}

bool PipelineParallel::counts_gradient(const std::string& name) const {
  // A tied weight's copies hold the same summed gradient: the first stage's counts.
  return holds_first() || std::find(tied_.begin(), tied_.end(), name) == tied_.end();
}

void PipelineParallel::sum_over_group(torch::Tensor& sq) {
  // Sync point: each stage's rank holds its own parameters' gradients; the
  // global norm needs every stage's share.
  group_.all_reduce(sq);
}

std::shared_ptr<void> PipelineParallel::gather_full_params(TrainingModule&, bool) {
  // The stage module's parameters are whole already (each rank holds its
  // stages'); the whole model is gather_parameters()'.
  return nullptr;
}

std::vector<StatePiece> PipelineParallel::to_global(std::vector<StatePiece> pieces, StateUse use) const {
  if (use == StateUse::kLoad || holds_first()) return pieces;
  // A tied weight and its optimizer state are saved once, by the first stage.
  std::vector<StatePiece> out;
  for (auto& piece : pieces) {
    if (std::find(tied_.begin(), tied_.end(), param_of_piece(piece.name)) == tied_.end()) out.push_back(std::move(piece));
  }
  return out;
}

std::vector<double> PipelineParallel::share(std::vector<double> values, int root) {
  auto t = torch::tensor(values, torch::kFloat64).to(group_.device());
  group_.set_flight_label("the last stage's numbers");
  // Sync point: what the last stage computed (losses, validation sums) is
  // what every stage's rank logs and decides on.
  group_.broadcast(t, root);
  if (t.is_meta()) return values;  // the dry run: no values
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::vector<double> PipelineParallel::forward_backward(Strategy& strategy, TrainingModule&,
                                                       const std::vector<Batch>& batches, const StepContext& context,
                                                       MicroBatchTimes& times) {
  const int m = static_cast<int>(batches.size());
  const Schedule& schedule = schedule_for(m);
  StepInputs in;
  for (const auto& b : batches) {
    in.inputs.push_back(b.input);
    in.targets.push_back(b.target);
  }
  const auto options = ExecutorOptions()
                           .activation_shape(module_.model().activation_shape(batches.front().input))
                           .loss_scale(context.loss_scale)
                           .on_loss(context.hooks.before_backward)
                           .on_backward_done(context.hooks.after_backward);
  if (context.hooks.phase) context.hooks.phase("pipeline");
  StepSeconds seconds;
  std::vector<double> losses;
  {
    // Every backward only accumulates: a stage's gradients are complete
    // once the schedule ends, when the strategy's reduce_gradients() syncs
    // them over the stage's data-parallel group.
    const NoSyncGuard accumulate = strategy.no_sync();
    AutocastGuard autocast(context.precision, strategy.device().type());
    // FSDP: the stage's units stay gathered for every micro-batch in flight.
    strategy.begin_scheduled_step(/*training=*/true);
    losses = run_pipeline_step(schedule, module_.stages(), in, lanes_, options, &seconds);
  }
  // Outside no_sync: the gradients' reductions start here (FSDP) or in
  // reduce_gradients() (the others).
  strategy.end_scheduled_step();
  last_step_ = seconds;
  times.forward_s += seconds.forward;
  const double backward = seconds.backward + seconds.input + seconds.weight;
  times.backward_s += backward;
  times.backward_compute_s += backward;
  losses.resize(size_t(m));  // zeros where this rank holds no last stage
  return share(std::move(losses), last_rank());
}

void PipelineParallel::after_gradient_sync(Strategy& strategy) {
  const auto params = module_.module().named_parameters();
  const int first = 0, last = last_rank(), me = group_.rank();
  if (me != first && me != last) return;
  for (const auto& name : tied_) {
    // Not held, or frozen (LoRA's base embedding): nothing to sum.
    const auto* weight = params.find(name);
    if (weight == nullptr || !weight->requires_grad()) continue;
    group_.set_flight_label("tied " + name);
    // Sync point (the first and the last stage's ranks, each with its
    // data-parallel group when the gradient is sharded there): both copies
    // take the summed gradient, so they stay equal.
    strategy.add_gradient_of_copy(name, [&](const torch::Tensor& mine) {
      return swap_with_peer(mine, me == first ? last : first, lanes_);
    });
  }
}

ValidationStep PipelineParallel::validation_step(Strategy& strategy, TrainingModule&, const Batch& batch) {
  const auto shape = module_.model().activation_shape(batch.input);
  const int size = group_.size(), me = group_.rank();
  torch::Tensor x;
  ValidationStep out;
  // Each held stage in order, micro-batch by micro-batch: a chain, so the
  // sends waited at once cannot deadlock.
  strategy.begin_scheduled_step(/*training=*/false);
  for (const auto& [s, cut] : module_.held()) {
    torch::Tensor input = batch.input;
    if (s > 0 && module_.held().count(s - 1) != 0) {
      input = x;
    } else if (s > 0) {
      input = torch::empty(shape, torch::TensorOptions(torch::kFloat32).device(strategy.device()));
      group_.recv_async(input, (s - 1) % size, kValidationTag + s - 1).wait();
    }
    x = module_.forward_stage(s, input);
    if (cut.last) {
      out = module_.validate_output(x, batch);
    } else if ((s + 1) % size != me) {
      group_.send_async(x.to(torch::kFloat32).contiguous(), (s + 1) % size, kValidationTag + s).wait();
    }
  }
  strategy.end_scheduled_step();
  const auto v = share({out.loss_sum, double(out.tokens), double(out.correct_samples), double(out.samples)},
                       last_rank());
  return {v[0], int64_t(v[1]), int64_t(v[2]), int64_t(v[3])};
}

std::vector<std::pair<std::string, torch::Tensor>> PipelineParallel::gather_parameters() {
  // Which stage first lists each parameter: its rank sends it.
  std::map<std::string, int> owner;
  for (size_t s = 0; s < module_.cuts().size(); ++s) {
    for (const auto& [child, m] : module_.model().stage_children(module_.cuts()[s])) {
      for (const auto& p : m->named_parameters()) owner.emplace(child + "." + p.key(), int(s) % group_.size());
    }
  }
  const auto held = module_.module().named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  int tag = kGatherTag;
  for (const auto& item : module_.whole().module().named_parameters()) {
    const int from = owner.at(item.key());
    ++tag;
    if (from == group_.rank() && from == 0) {
      out.emplace_back(item.key(), held[item.key()].detach().cpu().clone());
    } else if (from == group_.rank()) {
      // Waited at once: rank 0 receives in this same order.
      group_.send_async(held[item.key()].detach().contiguous(), 0, tag).wait();
    } else if (group_.rank() == 0) {
      auto t = torch::empty(item.value().sizes(), item.value().options().device(group_.device()));
      group_.recv_async(t, from, tag).wait();
      out.emplace_back(item.key(), t.cpu());
    }
  }
  return out;
}

std::string PipelineParallel::describe() const {
  std::string stages;
  for (size_t s = 0; s < module_.cuts().size(); ++s) {
    const auto& cut = module_.cuts()[s];
    stages += c10::str(s ? ", " : "", "stage ", s, " (rank ", int(s) % group_.size(), "): blocks ",
                       cut.blocks.first, "..", cut.blocks.second - 1, cut.first ? " + embedding" : "",
                       cut.last ? " + head" : "");
  }
  return c10::str("pipeline: ", group_.size(), " ranks, schedule ", options_.schedule(),
                  options_.virtual_stages() > 1 ? c10::str(", ", options_.virtual_stages(), " stages each") : "",
                  "; ", stages);
}

}  // namespace strata::pp
