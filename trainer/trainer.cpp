#include "strata/trainer/trainer.h"

#include "strata/kernels/fused_adamw_optimizer.h"
#include "strata/trainer/checkpoint.h"
#include "strata/trainer/lr_schedule.h"
#include "strata/trainer/resume_state.h"

#include <ATen/record_function.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

namespace strata {

Batch to_device(Batch batch, const torch::Device& device) {
  if (batch.input.device() == device && batch.target.device() == device) return batch;
  // Non-blocking: the copy is ordered before the forward on the same stream.
  return {batch.input.to(device, /*non_blocking=*/true), batch.target.to(device, /*non_blocking=*/true)};
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check_optimizer_name(const std::string& name) {
  const auto known = optimizer_names();
  TORCH_CHECK_VALUE(std::find(known.begin(), known.end(), name) != known.end(), "unknown optimizer '",
                    name, "'; available: ", c10::Join(", ", known));
}

/// torch's SGD with the trainer's learning rate, momentum and Nesterov
/// (dampening 0: what Nesterov needs, and DeepSpeed's and torch's default).
torch::optim::SGDOptions sgd_options(const TrainerOptions& options) {
  TORCH_CHECK_VALUE(options.momentum() >= 0.0 && options.momentum() < 1.0, "SGD momentum must be in [0, 1), got ",
                    options.momentum());
  TORCH_CHECK_VALUE(!options.nesterov() || options.momentum() > 0.0,
                    "SGD with Nesterov needs a momentum above 0 (got ", options.momentum(), ")");
  return torch::optim::SGDOptions(options.lr()).momentum(options.momentum()).nesterov(options.nesterov());
}

/// Options of the configured optimizer for one parameter group.
std::unique_ptr<torch::optim::OptimizerOptions> group_options(const TrainerOptions& options,
                                                              double weight_decay) {
  if (options.optimizer() == "sgd") {
    return std::make_unique<torch::optim::SGDOptions>(sgd_options(options).weight_decay(weight_decay));
  }
  check_optimizer_name(options.optimizer());
  return std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(options.lr())
          .betas({options.beta1(), options.beta2()})
          .eps(options.eps())
          .weight_decay(weight_decay));
}
}  // namespace

std::vector<std::string> optimizer_names() { return {"adamw", "sgd"}; }

WarmupCosineSchedule lr_schedule_of(const TrainerOptions& o, int64_t max_steps) {
  return WarmupCosineSchedule(
      LrScheduleOptions(o.lr()).warmup_steps(o.warmup_steps()).decay_steps(max_steps).min_lr(o.min_lr()));
}

std::vector<torch::optim::OptimizerParamGroup> make_optimizer_groups(torch::nn::Module& module,
                                                                     const TrainerOptions& options) {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, group_options(options, options.weight_decay()));
  if (!no_decay.empty()) groups.emplace_back(no_decay, group_options(options, 0.0));
  return groups;
}

OptimizerFactory optimizer_factory(const TrainerOptions& options) {
  if (options.optimizer() == "sgd") {
    return [options](std::vector<torch::optim::OptimizerParamGroup> groups) {
      return with_exact_group_options(std::move(groups), [&](std::vector<torch::optim::OptimizerParamGroup> g) {
        return std::make_unique<torch::optim::SGD>(std::move(g),
                                                   sgd_options(options).weight_decay(options.weight_decay()));
      });
    };
  }
  check_optimizer_name(options.optimizer());
  return [options](std::vector<torch::optim::OptimizerParamGroup> groups) {
    const auto defaults = torch::optim::AdamWOptions(options.lr())
                              .betas({options.beta1(), options.beta2()})
                              .eps(options.eps())
                              .weight_decay(options.weight_decay());
    return with_exact_group_options(std::move(groups), [&](std::vector<torch::optim::OptimizerParamGroup> g)
                                                           -> std::unique_ptr<torch::optim::Optimizer> {
      if (options.fused_adamw()) {
        return std::make_unique<FusedAdamW>(std::move(g), defaults, options.fused_adamw_kernel());
      }
      return std::make_unique<torch::optim::AdamW>(std::move(g), defaults);
    });
  };
}

Trainer::Trainer(TrainerOptions options, std::shared_ptr<Strategy> strategy,
                 std::vector<std::shared_ptr<Callback>> callbacks, const MemoryTracker* memory)
    : options_(std::move(options)),
      strategy_(std::move(strategy)),
      callbacks_(std::move(callbacks)),
      memory_(memory) {
  const auto& o = options_;
  TORCH_CHECK(strategy_ != nullptr, "Trainer needs a strategy");
  TORCH_CHECK_VALUE(o.max_steps() > 0, "max_steps must be > 0 (got ", o.max_steps(), ")");
  TORCH_CHECK_VALUE(o.batch_size() > 0, "batch_size must be > 0 (got ", o.batch_size(), ")");
  TORCH_CHECK_VALUE(o.accumulate_grad_batches() > 0, "accumulate_grad_batches must be > 0 (got ",
                    o.accumulate_grad_batches(), ")");
  TORCH_CHECK_VALUE(o.gradient_clip_val() >= 0, "gradient_clip_val must be >= 0 (got ",
                    o.gradient_clip_val(), ")");
  TORCH_CHECK_VALUE(o.log_every_n_steps() > 0, "log_every_n_steps must be > 0 (got ",
                    o.log_every_n_steps(), ")");
  TORCH_CHECK_VALUE(o.val_check_interval() >= 0 && o.limit_val_batches() >= 0,
                    "val_check_interval and limit_val_batches must be >= 0 (got ",
                    o.val_check_interval(), ", ", o.limit_val_batches(), ")");
  check_optimizer_name(o.optimizer());
  const auto formats = checkpoint_formats();
  TORCH_CHECK_VALUE(o.checkpoint_format().empty() ||
                        std::find(formats.begin(), formats.end(), o.checkpoint_format()) != formats.end(),
                    "unknown checkpoint_format '", o.checkpoint_format(), "'; available: ", c10::Join(", ", formats),
                    " (or empty: the strategy's default)");
  TORCH_CHECK_VALUE(o.lr() > 0 && o.min_lr() >= 0 && o.min_lr() <= o.lr(),
                    "need 0 <= min_lr <= lr and lr > 0 (got lr ", o.lr(), ", min_lr ", o.min_lr(), ")");
  if (o.precision() == Precision::kFp16Mixed) scaler_.emplace(o.loss_scaler());
}

void Trainer::log(const std::string& key, double value) { pending_log_.emplace_back(key, value); }

void Trainer::request_stop(const std::string& reason) {
  stop_requested_ = true;
  if (stop_reason_.empty()) stop_reason_ = reason;
}

/// Sums over the steady steps (all but a fit's first, which pays one-off
/// costs) for FitResult's throughput and its per-rank step split.
struct Trainer::SteadyStats {
  double tokens = 0.0, seconds = 0.0, backward = 0.0, grad_sync = 0.0, rank_tokens = 0.0;
  int64_t steps = 0;
  RankStepStats mine;  ///< sums, divided in finish()

  void add(const StepMetrics& m, const CommBytes& before, const CommBytes& after, int world_size) {
    tokens += static_cast<double>(m.tokens);
    seconds += m.step_seconds;
    backward += m.backward_seconds;
    grad_sync += m.grad_sync_seconds;
    ++steps;
    mine.forward_s += m.forward_seconds;
    mine.backward_s += m.backward_compute_seconds;
    mine.comm_wait_s += m.comm_wait_seconds;
    mine.optimizer_s += m.optimizer_seconds;
    mine.step_s += m.step_seconds;
    rank_tokens += static_cast<double>(m.tokens) / world_size;
    for (size_t k = 0; k < mine.comm_bytes_per_step.size(); ++k) {
      mine.comm_bytes_per_step[k] += static_cast<double>(after.sent[k] - before.sent[k]);
    }
  }

  /// FitResult's rates, and this rank's per-step means.
  RankStepStats finish(FitResult& result) {
    result.tokens_per_s = seconds > 0 ? tokens / seconds : 0.0;
    mine.tokens_per_s = mine.step_s > 0 ? rank_tokens / mine.step_s : 0.0;
    if (steps == 0) return mine;
    const double n = static_cast<double>(steps);
    result.backward_s_per_step = backward / n;
    result.grad_sync_s_per_step = grad_sync / n;
    for (double* v : {&mine.forward_s, &mine.backward_s, &mine.comm_wait_s, &mine.optimizer_s, &mine.step_s}) *v /= n;
    for (double& b : mine.comm_bytes_per_step) b /= n;
    return mine;
  }
};

FitResult Trainer::fit(TrainingModule& module, const DataSource& data) {
  module_ = &module;
  // Flight-recorder phases name what each collective was issued for (a hung
  // rank's dump says "step 12 backward, unit h5"); "step N ..." per step.
  setup(module);
  strategy_->comm().set_flight_phase("resume");
  const auto resumed = load_resume_checkpoint();
  const WarmupCosineSchedule schedule = lr_schedule_of(options_, options_.max_steps());
  FitResult result;
  SteadyStats steady;
  const auto fit_start = Clock::now();
  const int64_t first_step = step_;
  module.module().train();
  each_callback([&](Callback& cb) { cb.on_fit_start(*this, module); });
  // After on_fit_start, which may reset a callback for a new fit, or draw
  // random numbers (the generators must hold the saved state at step 1).
  if (resumed) restore_after_fit_start(*resumed);
  try {
    while (step_ < options_.max_steps() && !stop_requested_) {
      StepMetrics metrics = train_step(module, data, schedule(step_), step_ > first_step, steady);
      result.final_train_loss = metrics.loss;
      each_callback([&](Callback& cb) { cb.on_train_batch_end(*this, module, metrics); });
      log_step(metrics);
      validate_if_due(module, data, result);
      enter_phase("callbacks", step_);  // checkpoint saves
      each_callback([&](Callback& cb) { cb.on_train_step_end(*this, module, step_); });
    }
  } catch (const std::exception& error) {
    each_callback([&](Callback& cb) { cb.on_exception(*this, module, error); });
    throw;
  }
  strategy_->comm().set_flight_phase("fit end");
  each_callback([&](Callback& cb) { cb.on_fit_end(*this, module); });

  result.steps = step_;
  result.elapsed_s = seconds_since(fit_start);
  result.stopped_early = stop_requested_;
  result.stop_reason = stop_reason_;
  if (scaler_) {
    result.skipped_steps = scaler_->skipped_steps();
    result.loss_scale = scaler_->scale();
  }
  result.comm_bytes = strategy_->comm().bytes();
  const RankStepStats mine = steady.finish(result);
  gather_memory(result);
  gather_step_stats(result, mine);
  return result;
}

std::optional<std::map<std::string, std::string>> Trainer::load_resume_checkpoint() {
  if (options_.resume_from().empty()) {
    micro_batch_ = step_ * options_.accumulate_grad_batches();  // step-aligned, as in every fresh fit
    return std::nullopt;
  }
  const CheckpointMeta meta = load_resume_state();
  TORCH_CHECK_VALUE(step_ < options_.max_steps(), "checkpoint '", options_.resume_from(), "' is at step ", step_,
                    ", not below max_steps ", options_.max_steps(), ": nothing left to train (raise max_steps)");
  restore_trainer_state(meta.state);
  restore_loss_scaler(meta.state);
  each_callback([&](Callback& cb) { cb.on_load_checkpoint(*this, options_.resume_from()); });
  return meta.state;
}

CheckpointMeta Trainer::load_resume_state() {
  CheckpointMeta expected;
  expected.optimizer = options_.optimizer();
  // Every strategy loads its own pieces (FSDP: straight into its shards).
  CheckpointMeta meta = load_checkpoint(options_.resume_from(), *strategy_, *optimizer_, expected);
  step_ = meta.step;
  return meta;
}

void Trainer::restore_after_fit_start(const std::map<std::string, std::string>& state) {
  restore_rng(state);
  const auto keys = callback_state_keys();
  for (size_t i = 0; i < callbacks_.size(); ++i) {
    if (const auto it = state.find(keys[i]); it != state.end()) callbacks_[i]->load_state_dict(it->second);
  }
}

StepMetrics Trainer::train_step(TrainingModule& module, const DataSource& data, double lr, bool steady,
                                SteadyStats& stats) {
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  each_callback([&](Callback& cb) { cb.on_train_batch_start(*this, module, step_ + 1); });
  StepMetrics metrics;
  metrics.lr = lr;
  const CommBytes before = strategy_->comm().bytes();
  run_step(module, data, metrics);
  if (steady) stats.add(metrics, before, strategy_->comm().bytes(), strategy_->world_size());
  return metrics;
}

void Trainer::enter_phase(const char* phase, int64_t step) {
  strategy_->comm().set_flight_phase(c10::str("step ", step, " ", phase));
}

void Trainer::log_step(const StepMetrics& m) {
  if (step_ % options_.log_every_n_steps() == 0 || step_ == options_.max_steps()) {
    LogRow row{{"loss", m.loss},          {"lr", m.lr},
               {"grad_norm", m.grad_norm}, {"step_time_s", m.step_seconds},
               {"backward_s", m.backward_seconds}, {"grad_sync_s", m.grad_sync_seconds}};
    if (m.loss_scale) {
      row.emplace_back("loss_scale", *m.loss_scale);
      row.emplace_back("skipped_steps", static_cast<double>(scaler_->skipped_steps()));
    }
    emit_log(step_, row);
  }
  pending_log_.clear();
}

void Trainer::validate_if_due(TrainingModule& module, const DataSource& data, FitResult& result) {
  const bool last = step_ == options_.max_steps() || stop_requested_;
  const bool periodic = options_.val_check_interval() > 0 && step_ % options_.val_check_interval() == 0;
  if (options_.limit_val_batches() == 0 || !(periodic || last)) return;
  enter_phase("validation", step_);
  auto val = validate(module, data);
  result.val_loss = val.loss;
  result.val_accuracy = val.accuracy;
  each_callback([&](Callback& cb) { cb.on_validation_end(*this, module, val); });
  LogRow row{{"val_loss", val.loss}};
  if (val.accuracy) row.emplace_back("val_accuracy", *val.accuracy);
  emit_log(step_, row);
  pending_log_.clear();
}

void Trainer::run_step(TrainingModule& module, const DataSource& data, StepMetrics& metrics) {
  const auto start = Clock::now();
  const Comm& comm = strategy_->comm();
  const double wait_at_start = comm.wait_seconds();
  const int64_t accum = options_.accumulate_grad_batches();
  const ShardInfo shard{strategy_->rank(), strategy_->world_size()};
  // Wall time of `part` less the communication waits inside it.
  auto seconds_outside_waits = [&comm](auto&& part) {
    const auto part_start = Clock::now();
    const double wait_before = comm.wait_seconds();
    part();
    return seconds_since(part_start) - (comm.wait_seconds() - wait_before);
  };
  // fp16: the loss is scaled before backward, the gradients unscaled by the clip.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  if (scaler_) metrics.loss_scale = loss_scale;
  // The step's micro-batches (token ids: small), then their forwards and
  // backwards as the strategy's runner schedules them (step_runner.h).
  std::vector<Batch> batches;
  int64_t tokens = 0, samples = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    batches.push_back(to_device(data.train_batch(micro_batch_++, options_.batch_size(), shard), strategy_->device()));
    tokens += batches.back().input.numel();
    samples += batches.back().input.size(0);
  }
  StepContext context;
  context.loss_scale = loss_scale;
  context.precision = options_.precision();
  context.hooks.phase = [this](const char* phase) { enter_phase(phase, step_ + 1); };
  context.hooks.before_backward = [&](const torch::Tensor& loss) {
    each_callback([&](Callback& cb) { cb.on_before_backward(*this, module, loss); });
  };
  context.hooks.after_backward = [&] { each_callback([&](Callback& cb) { cb.on_after_backward(*this, module); }); };
  MicroBatchTimes times;
  const std::vector<double> losses = strategy_->step_runner().forward_backward(*strategy_, module, batches, context, times);
  metrics.forward_seconds = times.forward_s;
  metrics.backward_seconds = times.backward_s;
  metrics.backward_compute_seconds = times.backward_compute_s;
  double loss_sum = 0.0;
  for (double l : losses) loss_sum += l;
  enter_phase("gradient sync", step_ + 1);
  const auto sync_start = Clock::now();
  strategy_->reduce_gradients();
  strategy_->step_runner().after_gradient_sync(*strategy_);
  metrics.grad_sync_seconds = seconds_since(sync_start);
  // Clipping, the optimizer step and zeroing count as the optimizer's time.
  enter_phase("optimizer", step_ + 1);
  metrics.optimizer_seconds += seconds_outside_waits([&] {
    metrics.grad_norm = strategy_->clip_grad_norm(options_.gradient_clip_val(), loss_scale);
  });
  // Every rank decides alike: the norm is global (all-reduced when sharded).
  // A non-finite norm without a scaler is stepped as before (fp32 / bf16).
  metrics.skipped = scaler_ && scaler_->update(!std::isfinite(metrics.grad_norm), step_ + 1);
  if (!metrics.skipped) {
    each_callback([&](Callback& cb) { cb.on_before_optimizer_step(*this, module, *optimizer_); });
    metrics.optimizer_seconds += seconds_outside_waits([&] {
      RECORD_FUNCTION("strata::optimizer_step", std::vector<c10::IValue>());  // a span in --profile traces
      strategy_->optimizer_step(*optimizer_);
    });
    // Measured once, here, while gradients still exist (so they show in the
    // report) and after the optimizer made its state; model state keeps its
    // size from the first step on.
    if (last_state_bytes_.total() == 0) last_state_bytes_ = strategy_->model_state_bytes(*optimizer_);
  }
  metrics.optimizer_seconds += seconds_outside_waits([&] { strategy_->zero_grad(*optimizer_); });
  ++step_;
  enter_phase("loss", step_);
  metrics.step = step_;
  metrics.loss = strategy_->mean_over_ranks(loss_sum / static_cast<double>(accum));
  metrics.comm_wait_seconds = comm.wait_seconds() - wait_at_start;
  metrics.tokens = tokens * strategy_->world_size();
  metrics.samples = samples * strategy_->world_size();
  metrics.step_seconds = seconds_since(start);
}

void Trainer::emit_log(int64_t step, const LogRow& base) {
  LogRow row = base;
  row.insert(row.end(), pending_log_.begin(), pending_log_.end());
  each_callback([&](Callback& cb) { cb.on_log(*this, step, row); });
}

void Trainer::setup(TrainingModule& module) {
  strategy_->comm().set_flight_phase("setup");
  peak_rss_before_setup_ = peak_rss_bytes();
  setup_rss_ = current_rss_bytes();
  const bool measured = reset_peak_rss();
  strategy_->setup(module);
  optimizer_ = strategy_->setup_optimizer(make_optimizer_groups(module.module(), options_),
                                          optimizer_factory(options_));
  setup_peak_rss_ = measured ? peak_rss_bytes() : -1;
}

void Trainer::gather_memory(FitResult& result) {
  // Over the whole job: beside tensor parallelism the strategy's group is
  // one tensor-parallel rank's data-parallel ranks only.
  const int n = strategy_->job_size();
  // The process's peak: setup reset the kernel's to measure its own.
  const int64_t peak_rss = std::max(peak_rss_before_setup_, peak_rss_bytes());
  constexpr int kFields = 7;
  auto mine = torch::tensor({memory_ ? memory_->peak_bytes() : int64_t{0}, last_state_bytes_.params,
                             last_state_bytes_.grads, last_state_bytes_.optimizer, peak_rss, setup_rss_,
                             setup_peak_rss_},
                            torch::kInt64)
                  .to(strategy_->device());
  auto all = torch::empty({n * kFields}, mine.options());
  // Sync point: rank 0 writes summary.json with every rank's numbers.
  strategy_->job_comm().all_gather_into(all, mine);
  all = all.cpu();
  auto acc = all.accessor<int64_t, 1>();
  for (int r = 0; r < n; ++r) {
    const auto* v = &acc[r * kFields];
    result.peak_tensor_bytes.push_back(v[0]);
    result.model_state_bytes.push_back({v[1], v[2], v[3]});
    result.peak_rss_bytes.push_back(v[4]);
    result.setup_rss_bytes.push_back(v[5]);
    result.setup_peak_rss_bytes.push_back(v[6]);
  }
}

void Trainer::gather_step_stats(FitResult& result, const RankStepStats& mine) {
  const int n = strategy_->job_size();  // every rank of the job, as gather_memory
  constexpr int kKinds = static_cast<int>(CollectiveKind::kCount);
  constexpr int kFields = 6 + kKinds;
  std::vector<double> values = {mine.forward_s, mine.backward_s, mine.comm_wait_s,
                                mine.optimizer_s, mine.step_s,     mine.tokens_per_s};
  values.insert(values.end(), mine.comm_bytes_per_step.begin(), mine.comm_bytes_per_step.end());
  auto local = torch::tensor(values, torch::kFloat64).to(strategy_->device());
  auto all = torch::empty({n * kFields}, local.options());
  // Sync point: rank 0 writes summary.json with every rank's step split.
  strategy_->job_comm().all_gather_into(all, local);
  all = all.cpu();
  auto acc = all.accessor<double, 1>();
  for (int r = 0; r < n; ++r) {
    RankStepStats s;
    const int o = r * kFields;
    s.forward_s = acc[o + 0];
    s.backward_s = acc[o + 1];
    s.comm_wait_s = acc[o + 2];
    s.optimizer_s = acc[o + 3];
    s.step_s = acc[o + 4];
    s.tokens_per_s = acc[o + 5];
    for (int k = 0; k < kKinds; ++k) s.comm_bytes_per_step[k] = acc[o + 6 + k];
    result.per_rank.push_back(s);
  }
}

}  // namespace strata
