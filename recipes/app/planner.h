#pragma once
// Memory planner: predicts each strategy's per-rank peak tensor bytes for a
// model (models/spec.h) before anything trains, so strata-gpt can refuse a run that
// cannot fit (the pre-flight check) and `--strategy auto` can pick the
// fastest strategy that does.
//
//   peak = model state (the strategy's memory model, StrategySpec::memory)
//        + activations (from a probe: one micro-step of a 1- and a 2-block model
//          at the real micro-batch x block size, under a MemoryTracker; the
//          difference is one block, scaled by n_layer; or a formula when the
//          probe itself would be too large), scaled by the strategy's
//          activation_scale
//        + what the strategy gathers during a step (fsdp's units)
//        + a framework overhead constant (calibrated), or the strategy's
//          staging buffers when they outgrow the activations (oss, sdp)
//
// The planner keeps no formula of a strategy's: each registered spec says
// what one rank holds (strategies/spec.h); the built-ins say, with fp32 AdamW
// (16 bytes per parameter, Ψ' the parameter count, N ranks): single/ddp 16Ψ',
// oss 8Ψ' + 8Ψ'/N, sdp 4Ψ' + 12Ψ'/N, fsdp 16Ψ'/N.
//
// Example:
//   auto model = gpt_model(gpt_preset("gpt-micro").vocab_size(12).block_size(11));
//   auto profile = activation_profile(*model, /*micro_batch=*/8, Precision::kFp32);
//   auto rows = plan_candidates(registry, PlanRequest(model, name, 2).micro_batch(8), profile, budget);
//   std::cout << format_plan_table(rows, budget);
#include "strata/core/precision.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

/// Framework overhead per rank beyond model state, activations and what a
/// strategy gathers. Calibrated on strata-gpt runs (gpt-nano/micro/mini,
/// block 128, batch 8, 2 ranks): ddp/oss/sdp/fsdp peaks equal state + the
/// probe's activations (+ gathered) plus these 16 KiB to within 0.1% (DDP's
/// gradients are views of its buckets, and the probe counts the step's
/// transients).
inline constexpr int64_t kPlannerOverheadBytes = 16 << 10;

/// Strategy options as text, key -> value (as RunConfig::strategy_options).
using OptionTexts = std::map<std::string, std::string>;

/// One configuration to predict the peak of.
struct PlanRequest {
  PlanRequest(ModelPtr model, std::string strategy, int world_size)
      : model_(std::move(model)), strategy_(std::move(strategy)), world_size_(world_size) {}
  /// The model (models/spec.h): its sizes, activations and tensor-parallel crossings.
  TORCH_ARG(ModelPtr, model);
  /// A registered strategy's name (or alias).
  TORCH_ARG(std::string, strategy);
  /// Its options; empty: its spec's defaults.
  TORCH_ARG(OptionTexts, strategy_options) = {};
  TORCH_ARG(int, world_size);
  /// Ranks per node (hybrid sharding's group); 0: the world.
  TORCH_ARG(int, local_world_size) = 0;
  /// Samples per micro-batch per rank.
  TORCH_ARG(int64_t, micro_batch) = 1;
  TORCH_ARG(Precision, precision) = Precision::kFp32;
  /// 0 off, n: every n-th block (as --activation-checkpointing).
  TORCH_ARG(int64_t, activation_checkpointing) = 0;
  /// none, cpu, disk: what moves to the tier is the strategy's choice.
  TORCH_ARG(std::string, offload) = "none";
  /// adamw (8 bytes of state per parameter) or sgd (none; 4 with momentum).
  TORCH_ARG(std::string, optimizer) = "adamw";
  TORCH_ARG(double, momentum) = 0.0;
  /// Micro-batches per optimizer step (communication per step).
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Tensor-parallel ranks per group (--tp-size): the strategy then runs
  /// over world_size data-parallel ranks, each holding a 1/tp_size part of
  /// the split parameters (strategies/tp/spec.h adds what tp sends).
  TORCH_ARG(int, tp_size) = 1;
  TORCH_ARG(bool, sequence_parallel) = false;
};

/// Bytes of model state one rank holds by the ZeRO formulas.
struct ModelStatePrediction {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

/// What `request` asks its strategy's memory and communication models.
MemoryQuery memory_query(const StrategyRegistry& registry, const PlanRequest& request);

/// The strategy's memory estimate for `request`; nullopt when its spec has no
/// memory model for these options. Throws c10::ValueError for an unknown
/// strategy or bad options.
std::optional<MemoryEstimate> estimate_memory(const StrategyRegistry& registry, const PlanRequest& request);

/// The strategy's communication model for `request`: bytes one rank sends
/// per optimizer step by collective, tensor parallelism's added; nullopt
/// when it has none for these options.
std::optional<CommEstimate> predict_comm(const StrategyRegistry& registry, const PlanRequest& request);

/// Whether the planner can predict `request`'s peak: its strategy's memory
/// model covers these options (MemoryEstimate::predicts_peak).
bool plannable(const StrategyRegistry& registry, const PlanRequest& request);

/// The model state of `request` (see the header comment): what gathers during
/// a step is not model state (it is in MemoryPrediction::gathered). Throws
/// c10::ValueError when the strategy has no memory model for it.
ModelStatePrediction predict_model_state(const StrategyRegistry& registry, const PlanRequest& request);

/// `profile` for `factor` times its micro-batch (activations scale with it).
ActivationProfile scaled(ActivationProfile profile, int64_t factor);

/// Runs the probe: one forward + backward of the model with 1 and with 2
/// blocks (ModelConfig::with_layers: its widths, vocabulary and block size) on a [micro_batch, block]
/// batch under its own MemoryTracker, gradients allocated up front; and the
/// same with every block checkpointed under `ac_policy`
/// (ActivationCheckpointOptions::policy). Parameters stay out of the numbers.
/// About 2 x (params of 2 blocks + embeddings) + the activations of 2 blocks
/// in memory, briefly.
ActivationProfile probe_activations(const ModelConfig& model, int64_t micro_batch, Precision precision,
                                    const std::string& ac_policy = "full");

/// The formula the probe stands in for: the model's own
/// (ModelConfig::activation_formula).
ActivationProfile estimate_activations(const ModelConfig& model, int64_t micro_batch, Precision precision,
                                       const std::string& ac_policy = "full");

/// The probe when its own footprint is under `probe_limit_bytes`, else the formula.
ActivationProfile activation_profile(const ModelConfig& model, int64_t micro_batch, Precision precision,
                                     const std::string& ac_policy = "full",
                                     int64_t probe_limit_bytes = int64_t(1) << 30);

/// A per-rank peak prediction.
struct MemoryPrediction {
  ModelStatePrediction state;
  /// What the strategy gathers during a step (fsdp: full params + grads of
  /// the root and the units held at once) and holds beyond its model state.
  int64_t gathered = 0;
  int64_t activations = 0;
  int64_t overhead = 0;     ///< framework constant (buckets, collective staging)
  int64_t peak() const { return state.total() + gathered + activations + overhead; }
};

/// Throws like predict_model_state, and for a request that is not plannable().
MemoryPrediction predict_peak(const StrategyRegistry& registry, const PlanRequest& request,
                              const ActivationProfile& activations);

/// One row of the `--strategy auto` table.
struct PlanChoice {
  std::string label;        ///< PlanVariant::label: ddp, fsdp+ac, fsdp+offload-disk, ...
  PlanRequest request;
  MemoryPrediction prediction;
  bool fits = false;
  /// The variant trains what single trains (PlanVariant::exact): --strategy
  /// auto may pick it.
  bool exact = true;
  /// Whose peak `prediction` is when ranks differ ("pp rank 1": the fullest
  /// pipeline stage's); empty when every rank holds alike.
  std::string peak_at = "";
};

/// The rows plan_candidates predicts, unpredicted: every registered spec's
/// plan variants offered for `base` (see plan_candidates), fastest first,
/// each request set up (its strategy, options, checkpointing, offload,
/// tensor-parallel size and micro-batch).
std::vector<PlanChoice> plan_variants(const StrategyRegistry& registry, const PlanRequest& base);

/// The candidates for `base`'s model, world, micro-batch, precision and
/// optimizer: every registered spec's plan variants (StrategySpec::plan)
/// offered at this world size, fastest first by their speed rank (the
/// built-ins: world 1: single, single+ac; world N: ddp, oss, sdp, fsdp,
/// sdp+offload-disk, fsdp+ac, fsdp+offload-disk), each with its prediction and
/// whether it fits `budget_bytes` per rank.
std::vector<PlanChoice> plan_candidates(const StrategyRegistry& registry, const PlanRequest& base,
                                        const ActivationProfile& activations, int64_t budget_bytes);

/// Index of the first exact candidate that fits; nullopt when none does.
std::optional<size_t> pick_fastest_fitting(const std::vector<PlanChoice>& candidates);

/// The table strata-gpt prints: strategy, predicted peak per rank, fits?
std::string format_plan_table(const std::vector<PlanChoice>& candidates, int64_t budget_bytes);

/// --strategy auto in a precision whose matrix products run `slowdown` times
/// slower than fp32's on this CPU (> 1: bf16 without avx512_bf16, ATen's CPU
/// fp16): one line saying what the planner picks for `base` in fp32 under the
/// same budget (`fp32_activations`: the fp32 profile), or that nothing fits in
/// fp32, so the user can tell whether the slow precision buys needed memory.
std::string fp32_alternative(const StrategyRegistry& registry, const PlanRequest& base,
                             const ActivationProfile& fp32_activations, int64_t budget_bytes, double slowdown);

/// "4GiB", "512MiB", "1.5G", "1000000" (bytes; K/M/G/T and KiB..TiB are powers
/// of 1024, KB..TB powers of 1000). Throws c10::ValueError naming the text.
int64_t parse_byte_size(const std::string& text);

/// MemAvailable from /proc/meminfo, bytes; 0 if unknown.
int64_t available_memory_bytes();

}  // namespace strata::recipes
