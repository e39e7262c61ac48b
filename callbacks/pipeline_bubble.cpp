#include "strata/callbacks/pipeline_bubble.h"

#include "strata/core/atomic_file.h"
#include "strata/trainer/trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace strata {

namespace {

constexpr int kFields = 6;  // forward, backward, input, weight, waiting, total

/// The closed form of the schedule's idle share with free transfers and
/// per-micro-batch costs F, I, W of a rank's share.
double formula(const std::string& schedule, int p, int m, int v, const pp::StageCosts& c) {
  if (schedule.find("zero") != std::string::npos || schedule == "ZBH1") {
    const double bubble = (p - 1) * std::max(0.0, c.forward + c.backward_input - c.backward_weight);
    const double work = m * (c.forward + c.backward_input + c.backward_weight);
    return bubble / (bubble + work);
  }
  return double(p - 1) / double(v * m + p - 1);
}

}  // namespace

PipelineBubble::PipelineBubble(std::shared_ptr<pp::PipelineParallel> pipeline, std::string path)
    : pipeline_(std::move(pipeline)), path_(std::move(path)) {
  TORCH_CHECK(pipeline_ != nullptr, "PipelineBubble: no pipeline");
}

void PipelineBubble::on_fit_start(Trainer&, TrainingModule&) {
  sums_ = {};
  steps_ = 0;
  first_ = true;
}

void PipelineBubble::on_train_batch_end(Trainer& trainer, TrainingModule&, const StepMetrics&) {
  // The first step pays one-off costs (allocations, the schedule's lists).
  if (first_) {
    first_ = false;
    return;
  }
  sums_ += pipeline_->last_step();
  ++steps_;
}

void PipelineBubble::on_fit_end(Trainer& trainer, TrainingModule&) {
  Comm job = trainer.strategy().job_comm();
  const double n = std::max<int64_t>(1, steps_);
  auto mine = torch::tensor({sums_.forward / n, sums_.backward / n, sums_.input / n, sums_.weight / n,
                             sums_.waiting / n, sums_.total / n},
                            torch::kFloat64)
                  .to(job.device());
  auto all = torch::empty({job.size() * kFields}, mine.options());
  // Sync point: rank 0 writes every rank's split.
  job.all_gather_into(all, mine);
  // No steady step (a fit of one step, or a resume with one left): nothing
  // measured. Every rank counted the same steps, so all return here alike.
  if (job.rank() != 0 || steps_ == 0) return;
  all = all.cpu();
  const auto a = all.accessor<double, 1>();
  const int p = pipeline_->group().size(), v = pipeline_->options().virtual_stages();
  const auto m = static_cast<int>(trainer.options().accumulate_grad_batches());
  nlohmann::json ranks = nlohmann::json::array();
  pp::StageCosts mean{0, 0, 0};
  // The step ends when its slowest rank does: each rank's idle share is of
  // that (the makespan), as simulate() counts it.
  double makespan = 0.0;
  for (int r = 0; r < job.size(); ++r) makespan = std::max(makespan, a[r * kFields + 5]);
  for (int r = 0; r < job.size(); ++r) {
    pp::StepSeconds s;
    s.forward = a[r * kFields + 0];
    s.backward = a[r * kFields + 1];
    s.input = a[r * kFields + 2];
    s.weight = a[r * kFields + 3];
    s.waiting = a[r * kFields + 4];
    s.total = a[r * kFields + 5];
    ranks.push_back({{"rank", r}, {"forward_s", s.forward}, {"backward_s", s.backward + s.input + s.weight},
                     {"wait_s", s.waiting}, {"step_s", s.total},
                     {"idle_share", makespan > 0 ? 1.0 - s.compute() / makespan : 0.0}});
    // Per micro-batch; a whole backward counted half input, half weight.
    mean.forward += s.forward / m / job.size();
    mean.backward_input += (s.input + s.backward / 2) / m / job.size();
    mean.backward_weight += (s.weight + s.backward / 2) / m / job.size();
  }
  const auto& name = pipeline_->options().schedule();
  const auto schedule =
      pp::make_schedule(name, pp::ScheduleOptions().ranks(p).microbatches(m).virtual_stages(v));
  const auto simulated = pp::simulate(*schedule, mean).idle_share;
  const nlohmann::json out = {{"schedule", name},
                              {"pp_size", p},
                              {"virtual_stages", v},
                              {"microbatches", m},
                              {"steady_steps", steps_},
                              {"per_rank", ranks},
                              {"simulated_idle_share_per_stage_rank", simulated},
                              {"formula_idle_share", formula(name, p, m, v, mean)},
                              {"costs_per_microbatch_s",
                               {{"forward", mean.forward}, {"input", mean.backward_input},
                                {"weight", mean.backward_weight}}}};
  write_file_atomically(path_, out.dump(2) + "\n");
}

}  // namespace strata
