#pragma once
// Memory planner: predicts each strategy's per-rank peak tensor bytes for a
// GPT recipe before anything trains, so strata-gpt can refuse a run that
// cannot fit (the pre-flight check) and `--strategy auto` can pick the
// fastest strategy that does.
//
//   peak = model state (the ZeRO formulas, per rank)
//        + activations (from a probe: one micro-step of a 1- and a 2-block GPT
//          at the real micro-batch x block size, under a MemoryTracker; the
//          difference is one block, scaled by n_layer; or a formula when the
//          probe itself would be too large)
//        + FSDP's gathered units (<= kMaxUnitsGathered units' full params and
//          grads, and the root's)
//        + a framework overhead constant (buckets, Gloo staging: calibrated)
//
// Model state per rank, fp32 AdamW (4 + 4 + 8 bytes per parameter, Ψ' the
// parameter count, N ranks): single/ddp 16Ψ', oss 8Ψ' + 8Ψ'/N, sdp 4Ψ' +
// 12Ψ'/N, fsdp 16Ψ'/N (SGD: no optimizer state). Offloaded fsdp keeps its
// shards on disk: nothing of them in memory.
//
// Example:
//   auto profile = activation_profile(model, /*micro_batch=*/8, Precision::kFp32);
//   auto rows = plan_candidates(PlanRequest(model, "ddp", 2).micro_batch(8), profile, budget);
//   std::cout << format_plan_table(rows);
#include "core/precision.h"
#include "recipes/gpt.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

/// One configuration to predict the peak of.
struct PlanRequest {
  PlanRequest(GPTOptions model, std::string strategy, int world_size)
      : model_(std::move(model)), strategy_(std::move(strategy)), world_size_(world_size) {}
  TORCH_ARG(GPTOptions, model);
  /// Canonical name: single, ddp, oss, sdp, fsdp.
  TORCH_ARG(std::string, strategy);
  TORCH_ARG(int, world_size);
  /// Samples per micro-batch per rank.
  TORCH_ARG(int64_t, micro_batch) = 1;
  TORCH_ARG(Precision, precision) = Precision::kFp32;
  /// 0 off, n: every n-th block (as --activation-checkpointing).
  TORCH_ARG(int64_t, activation_checkpointing) = 0;
  /// none, cpu, disk: fsdp keeps its whole model state in the tier, the
  /// other strategies their optimizer state.
  TORCH_ARG(std::string, offload) = "none";
  /// adamw (8 bytes of state per parameter) or sgd (none).
  TORCH_ARG(std::string, optimizer) = "adamw";
};

/// Bytes of model state one rank holds by the ZeRO formulas.
struct ModelStatePrediction {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

/// The ZeRO formula for `request` (see the header comment); fsdp's gathered
/// units are not model state (they are in MemoryPrediction::gathered).
ModelStatePrediction predict_model_state(const PlanRequest& request);

/// Activation bytes of one micro-step of a GPT, per rank.
struct ActivationProfile {
  int64_t per_block = 0;   ///< kept for backward by one block (its output included)
  int64_t base = 0;        ///< everything else at the backward peak: embeddings, head, logits, loss, transients
  /// The same with every block checkpointed: what one block adds (its input,
  /// kept for the recomputation) and the rest (the head's peak, or one
  /// block's recomputed activations and its backward, whichever is larger).
  int64_t checkpointed_per_block = 0;
  int64_t checkpointed_base = 0;
  bool measured = false;   ///< false: the formula (the probe would have been too large)
  /// Activations of the whole model with every `checkpoint_every`-th block
  /// checkpointed (0: none).
  int64_t total(int64_t n_layer, int64_t checkpoint_every) const;
};

/// Runs the probe: one forward + backward of a GPT with 1 and with 2 blocks
/// (`model`'s widths, vocabulary and block size) on a [micro_batch, block]
/// batch under its own MemoryTracker, gradients allocated up front; and the
/// same with every block checkpointed. Parameters stay out of the numbers.
/// About 2 x (params of 2 blocks + embeddings) + the activations of 2 blocks
/// in memory, briefly.
ActivationProfile probe_activations(const GPTOptions& model, int64_t micro_batch, Precision precision);

/// The formula the probe stands in for (fp32 bytes; bf16-mixed halves block
/// activations): per block ~kBlockFloats x B·T·C floats (+ B·H·T² x 3 for naive
/// attention), base ~kLogitFloats x B·T·V + 4 x B·T·C.
ActivationProfile estimate_activations(const GPTOptions& model, int64_t micro_batch, Precision precision);

/// The probe when its own footprint is under `probe_limit_bytes`, else the formula.
ActivationProfile activation_profile(const GPTOptions& model, int64_t micro_batch, Precision precision,
                                     int64_t probe_limit_bytes = int64_t(1) << 30);

/// A per-rank peak prediction.
struct MemoryPrediction {
  ModelStatePrediction state;
  int64_t gathered = 0;     ///< fsdp: full params + grads of the root and the units held at once
  int64_t activations = 0;
  int64_t overhead = 0;     ///< framework constant (buckets, collective staging)
  int64_t peak() const { return state.total() + gathered + activations + overhead; }
};

MemoryPrediction predict_peak(const PlanRequest& request, const ActivationProfile& activations);

/// One row of the `--strategy auto` table.
struct PlanChoice {
  std::string label;        ///< "ddp", "fsdp+ac", "fsdp+offload-disk"
  PlanRequest request;
  MemoryPrediction prediction;
  bool fits = false;
};

/// The candidates for `base`'s model, world, micro-batch, precision and
/// optimizer, fastest first (the documented speed order):
///   world 1: single, single+ac
///   world N: ddp, oss, sdp, fsdp, fsdp+ac, fsdp+offload-disk
/// each with its prediction and whether it fits `budget_bytes` per rank.
std::vector<PlanChoice> plan_candidates(const PlanRequest& base, const ActivationProfile& activations,
                                        int64_t budget_bytes);

/// Index of the first candidate that fits; nullopt when none does.
std::optional<size_t> pick_fastest_fitting(const std::vector<PlanChoice>& candidates);

/// The table strata-gpt prints: strategy, predicted peak per rank, fits?
std::string format_plan_table(const std::vector<PlanChoice>& candidates, int64_t budget_bytes);

/// "4GiB", "512MiB", "1.5G", "1000000" (bytes; K/M/G/T and KiB..TiB are powers
/// of 1024, KB..TB powers of 1000). Throws c10::ValueError naming the text.
int64_t parse_byte_size(const std::string& text);

/// MemAvailable from /proc/meminfo, bytes; 0 if unknown.
int64_t available_memory_bytes();

}  // namespace strata::recipes
