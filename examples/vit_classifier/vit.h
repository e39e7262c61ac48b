#pragma once
// A small vision transformer classifying generated images: a model that is
// not a GPT, trained through strata's library API. Its blocks are wrap units
// called through the unit seam (strata/core/training_module.h), so FSDP
// shards them one by one and activation checkpointing recomputes them.
#include <strata/core/training_module.h>
#include <strata/trainer/data_source.h>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vit {

struct ViTOptions {
  TORCH_ARG(int64_t, image) = 16;     ///< square images of image x image pixels, one channel
  TORCH_ARG(int64_t, patch) = 4;      ///< patches of patch x patch pixels: the tokens
  TORCH_ARG(int64_t, dim) = 32;
  TORCH_ARG(int64_t, depth) = 2;      ///< transformer blocks (the wrap units)
  TORCH_ARG(int64_t, heads) = 2;
  TORCH_ARG(int64_t, mlp) = 64;
  TORCH_ARG(int64_t, classes) = 4;

 public:  // (TORCH_ARG leaves the section private)
  int64_t tokens() const { return (image_ / patch_) * (image_ / patch_); }
};

/// Pre-LN transformer block: attention and MLP, each around a residual.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t dim, int64_t heads, int64_t mlp);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Block);

/// The module strategies see: patch embedding, position embedding, blocks, head.
class ViTImpl : public torch::nn::Module {
 public:
  explicit ViTImpl(const ViTOptions& options);
  ViTOptions options;
  torch::nn::Linear embed{nullptr};
  torch::Tensor position;
  std::vector<Block> blocks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ViT);

/// The ViT as a strata TrainingModule: cross-entropy on the class labels.
class ViTClassifier : public strata::TrainingModule {
 public:
  explicit ViTClassifier(const ViTOptions& options) : model_(options) {}
  torch::nn::Module& module() override { return *model_; }
  torch::Tensor training_step(const strata::Batch& batch) override;
  strata::ValidationStep validation_step(const strata::Batch& batch) override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override;
  /// Logits [B, classes] for images [B, 1, H, W].
  torch::Tensor forward(const torch::Tensor& images);

 private:
  ViT model_;
};

/// Generated images, deterministic by sample index: class 0 a horizontal bar,
/// 1 a vertical bar, 2 the diagonal, 3 a square outline, at a random place,
/// under Gaussian noise. Batch::input holds images [B, 1, H, W] (float) and
/// Batch::target the classes [B] (int64): strata's "tokens" are pixels here.
class GeneratedImages : public strata::DataSource {
 public:
  explicit GeneratedImages(const ViTOptions& options, uint64_t seed = 0) : options_(options), seed_(seed) {}
  std::string name() const override { return "generated-images"; }
  strata::Batch train_batch(int64_t index, int64_t batch_size, strata::ShardInfo shard) const override;
  strata::Batch val_batch(int64_t index, int64_t batch_size, strata::ShardInfo shard) const override;
  int64_t num_val_samples() const override { return 512; }
  int64_t vocab_size() const override { return options_.classes(); }
  int64_t block_size() const override { return options_.tokens(); }
  bool has_accuracy() const override { return true; }

 private:
  strata::Batch samples(uint64_t stream, int64_t first, int64_t count) const;
  ViTOptions options_;
  uint64_t seed_;
};

}  // namespace vit
