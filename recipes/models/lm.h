#pragma once
// What every language model of the recipes shares: the next-token loss, the
// validation sums over logits, and the fused attention under selective
// activation checkpointing.
#include "strata/core/training_module.h"
#include "strata/strategies/pp/stage_module.h"
#include "strata/strategies/tp/parallel.h"

#include <torch/torch.h>

namespace strata::recipes {

/// Next-token cross-entropy of logits [B, T, V] against targets [B, T]
/// (-1 = ignored), the mean over scored positions, computed in fp32.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& target);

/// Validation sums for logits [B, T, V]: summed loss and scored positions,
/// and samples whose every scored position is predicted exactly (argmax).
ValidationStep lm_validation(const torch::Tensor& logits, const Batch& batch);

/// The same for a model that may run tensor parallel: with `tp` on, `logits`
/// are this rank's part of a `vocab`-wide vocabulary, and the vocabulary-
/// parallel cross-entropy and validation (strategies/tp/parallel.h) run.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& target, const tp::Parallel& tp, int64_t vocab);
ValidationStep lm_validation(const torch::Tensor& logits, const Batch& batch, const tp::Parallel& tp, int64_t vocab);

/// strata's fused CPU causal attention (kernels/attention.h; k and v may have
/// fewer heads, grouped queries), kept for the recompute by a selective
/// activation-checkpointing policy (its output, fp32 output and logsumexp).
torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout_p, bool training);

/// What every language model's pipeline stages share (pp::PipelineModel):
/// the last stage's next-token loss and validation sums of its logits, and
/// the activation between stages, each as the model runs: with tensor
/// parallelism, vocabulary-split logits and, under sequence parallelism,
/// this rank's part of the sequence.
class LanguageModelStages : public pp::PipelineModel {
 public:
  torch::Tensor stage_loss(const torch::Tensor& output, const torch::Tensor& target) override {
    return lm_loss(output, target, stage_parallel(), stage_vocab());
  }
  ValidationStep stage_validation(const torch::Tensor& output, const Batch& batch) override {
    return lm_validation(output, batch, stage_parallel(), stage_vocab());
  }
  std::vector<int64_t> activation_shape(const torch::Tensor& input) const override {
    const auto& tp = stage_parallel();
    return {input.size(0), tp.sequence_parallel() ? input.size(1) / tp.size() : input.size(1), stage_width()};
  }

 protected:
  /// The model's tensor-parallel calls (off without tensor parallelism).
  virtual const tp::Parallel& stage_parallel() const = 0;
  virtual int64_t stage_vocab() const = 0;
  /// The residual stream's width (n_embd).
  virtual int64_t stage_width() const = 0;
};

}  // namespace strata::recipes
