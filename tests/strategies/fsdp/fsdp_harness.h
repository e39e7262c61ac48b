#pragma once
// Helpers for the FSDP tests: train a module single-process or under
// FSDPStrategy on thread-ranks, and return the parameters (through
// summon_full_params: FSDP leaves the module holding shards only), the
// per-step gradient norms and what each rank's strategy reported.
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/fsdp/fully_sharded.h"
#include "strata/strategies/single/single_device.h"
#include "strata/strategies/thread_world.h"
#include "tests/toy_data.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace strata::testing {

using ModuleFactory = std::function<std::unique_ptr<TrainingModule>()>;

/// gpt-nano with a 16-token vocabulary and 8-token context, no Linear biases
/// (see strategy_threads_test: the key bias's gradient is pure rounding
/// noise), tied embeddings unless `tie` is false. Seeded: identical each call.
inline ModuleFactory gpt_nano(bool tie = true) {
  return [tie] {
    torch::manual_seed(11);
    return std::make_unique<recipes::GPTModule>(
        recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false).tie_weights(tie));
  };
}

inline TrainerOptions fsdp_test_options(int64_t batch, int64_t accum, double clip, int64_t steps) {
  return TrainerOptions().max_steps(steps).batch_size(batch).accumulate_grad_batches(accum)
      .gradient_clip_val(clip).lr(1e-3).min_lr(1e-4).warmup_steps(2).limit_val_batches(0);
}

/// Records each step's gradient norm (before clipping).
class GradNormRecorder : public Callback {
 public:
  std::string name() const override { return "GradNormRecorder"; }
  void on_train_batch_end(Trainer&, TrainingModule&, const StepMetrics& m) override {
    norms.push_back(m.grad_norm);
  }
  std::vector<double> norms;
};

struct Trained {
  std::vector<torch::Tensor> params;  ///< module.parameters() order, full values
  std::vector<double> grad_norms;
  FitResult result;
  int max_units_gathered = 0;         ///< FSDP only
};

inline std::vector<torch::Tensor> clone_params(TrainingModule& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.module().parameters()) out.push_back(p.detach().clone());
  return out;
}

inline Trained train_single(const ModuleFactory& make, const TrainerOptions& options) {
  auto module = make();
  ToyData data;
  auto recorder = std::make_shared<GradNormRecorder>();
  Trained out;
  out.result = Trainer(options, std::make_shared<SingleDeviceStrategy>(), {recorder}).fit(*module, data);
  out.params = clone_params(*module);
  out.grad_norms = recorder->norms;
  return out;
}

struct FsdpRun {
  int world = 2;
  FSDPOptions options;
  /// Called on each rank's module before the strategy sets it up (e.g. to
  /// apply activation checkpointing: FSDP(checkpoint(block))).
  std::function<void(TrainingModule&, int rank)> prepare;
  /// Extra callbacks for rank r (one set per rank: ranks run concurrently).
  std::function<std::vector<std::shared_ptr<Callback>>(int rank)> callbacks;
};

/// Trains on run.world thread-ranks; checks that every rank ends with the same
/// parameters and returns every rank's Trained. `options.batch_size` is per rank.
inline std::vector<Trained> train_fsdp(const ModuleFactory& make, const TrainerOptions& options,
                                       const FsdpRun& run) {
  // Built on this thread, before the ranks start: thread-ranks share torch's
  // default generator.
  std::vector<std::unique_ptr<TrainingModule>> modules;
  for (int r = 0; r < run.world; ++r) {
    modules.push_back(make());
    if (run.prepare) run.prepare(*modules.back(), r);
  }
  std::mutex mu;
  std::vector<Trained> per_rank(run.world);
  run_thread_world(run.world, [&](Comm& comm) {
    auto& module = *modules[comm.rank()];
    ToyData data;
    auto fsdp = std::make_shared<FSDPStrategy>(comm, run.options);
    auto recorder = std::make_shared<GradNormRecorder>();
    auto callbacks = run.callbacks ? run.callbacks(comm.rank()) : std::vector<std::shared_ptr<Callback>>{};
    callbacks.push_back(recorder);
    Trained out;
    out.result = Trainer(options, fsdp, callbacks).fit(module, data);
    {
      auto full = fsdp->summon_full_params();
      out.params = clone_params(module);
    }
    out.grad_norms = recorder->norms;
    out.max_units_gathered = fsdp->max_units_gathered();
    std::lock_guard<std::mutex> lock(mu);
    per_rank[comm.rank()] = std::move(out);
  }, std::chrono::seconds(30));
  for (int r = 1; r < run.world; ++r) {
    for (size_t i = 0; i < per_rank[0].params.size(); ++i) {
      EXPECT_TRUE(torch::equal(per_rank[0].params[i], per_rank[r].params[i])) << "rank " << r << " param " << i;
    }
  }
  return per_rank;
}

/// bf16-mixed parity: elements may differ by bf16 rounding (a few 1e-3) while
/// a few steps move no element by more than that, so an element check alone
/// passes a run that never steps. This compares what the runs did: the L2
/// norm over the model of (got - initial) - (reference - initial), relative
/// to the reference's update. A run without a step, or with twice the step,
/// is 1.0; correct bf16-mixed runs are a few percent (parity_test measures).
inline double relative_update_error(const std::vector<torch::Tensor>& initial,
                                    const std::vector<torch::Tensor>& reference,
                                    const std::vector<torch::Tensor>& got) {
  EXPECT_EQ(initial.size(), reference.size());
  EXPECT_EQ(initial.size(), got.size());
  double error2 = 0.0, update2 = 0.0;
  for (size_t i = 0; i < std::min({initial.size(), reference.size(), got.size()}); ++i) {
    const auto update = reference[i] - initial[i];
    error2 += (got[i] - initial[i] - update).pow(2).sum().item<double>();
    update2 += update.pow(2).sum().item<double>();
  }
  EXPECT_GT(update2, 0.0) << "the reference did not train";
  return update2 > 0.0 ? std::sqrt(error2 / update2) : 1e30;
}

/// Largest absolute difference over all parameters.
inline double max_param_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].sizes(), b[i].sizes()) << "param " << i;
    if (a[i].sizes() != b[i].sizes()) return 1e30;
    const double d = (a[i] - b[i]).abs().max().item<double>();
    if (std::isnan(d)) return 1e30;  // std::max would drop a NaN (a run that diverged) and report 0
    worst = std::max(worst, d);
  }
  return worst;
}

}  // namespace strata::testing
