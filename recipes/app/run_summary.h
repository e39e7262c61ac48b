#pragma once
// What strata-gpt writes about a run: the resolved config (config.ini and the
// printed header) and summary.json's document.
#include "strata/recipes/config/cli.h"
#include "strata/recipes/models/spec.h"
#include "strata/recipes/app/peak_flops.h"
#include "strata/recipes/app/planner.h"
#include "strata/recipes/app/run_checks.h"
#include "strata/callbacks/throughput.h"
#include "strata/trainer/trainer.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

/// What the run resolved, for the printed config and config.ini: the model's
/// sizes, the thread count and the data's vocabulary instead of the flags'
/// "0: automatic" defaults.
RunConfig resolved_config(RunConfig c, const ModelConfig& model, int threads);

/// summary.json's measured part: the run's result per rank, model state,
/// communication bytes and their ratio to the ZeRO paper's multiple.
/// `mfu`: nullopt when unknown or above 1 (written as null); `peak` is what
/// it divides by, with its source.
nlohmann::json summary_json(const RunConfig& config, const FitResult& r, int world_size, int64_t n_params,
                            const std::string& data_name, const PeakFlops& peak, std::optional<double> mfu);

/// What the models predict for the ranks of one pipeline rank's stages (of
/// the whole model without a pipeline).
struct StagePrediction {
  ModelStatePrediction state;
  std::optional<int64_t> peak;  ///< nullopt: the strategy models no peak
};

/// Adds the strategy's models' predictions beside the measured numbers: per
/// rank "predicted" (its memory model's params/grads/optimizer, and the
/// planner's whole peak when it models one, with measured ÷ predicted
/// ratios), "predicted_peak_bytes" (the largest rank's), and
/// "predicted_comm_bytes_per_step" (its communication model's bytes per step
/// by collective, when it has one). `stages`: one per pipeline rank, in
/// order (one without a pipeline); world rank r runs pipeline rank
/// r / (ranks / stages)'s stages (the mesh's outermost dimension).
void add_predictions(nlohmann::json& summary, const std::vector<StagePrediction>& stages,
                     const std::optional<CommEstimate>& comm);

/// Rank 0's checkpoint saves among `callbacks`: how long each held the step
/// loop and how long its write took (summary.json's checkpoint_saves; empty
/// without checkpoints).
nlohmann::json checkpoint_saves(const std::vector<std::shared_ptr<Callback>>& callbacks);

/// "12.3%".
std::string percent(double fraction);

/// Rank 0: summary.json (written last: it marks a finished run) and the
/// closing line. `ceiling`: the job's GEMM-bound tokens/s (0: none).
/// --eval-only's report: "== eval: ..." on stdout and --output-dir's
/// eval.json {"eval_only": true, val_loss, perplexity, samples, tokens,
/// data, step} (a run's config.ini and summary.json stay as they were).
void write_eval_summary(const CheckedRun& run, const ValidationMetrics& metrics);

void write_summary(const CheckedRun& run, const StrategyRegistry& registry, const FitResult& result,
                   Strategy& strategy, const Throughput& throughput, PeakFlops peak, int64_t n_params,
                   const torch::Device& device, const nlohmann::json& saves, int local_world, double ceiling);

}  // namespace strata::recipes
