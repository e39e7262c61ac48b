#pragma once
// MlpStackModule: "bring your own model" for the unit seam. A user's model,
// outside the recipes, that exposes its units the way GPTModule does: token
// embedding -> `depth` residual MLP blocks (the wrap units, each called through
// run_unit) -> linear head, next-token cross-entropy. Each block counts its
// forward calls, so tests can see what runners and recomputes do.
#include "strata/core/training_module.h"

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace strata::testing {

class MlpBlockImpl : public torch::nn::Module {
 public:
  MlpBlockImpl(int64_t width, double dropout) {
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc1_ = register_module("fc1", torch::nn::Linear(width, 4 * width));
    fc2_ = register_module("fc2", torch::nn::Linear(4 * width, width));
    dropout_ = register_module("dropout", torch::nn::Dropout(dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    return x + dropout_(fc2_(torch::gelu(fc1_(norm_(x)))));
  }
  int64_t calls = 0;  ///< forward calls so far

 private:
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(MlpBlock);

struct MlpStackNet : torch::nn::Module {
  MlpStackNet(int64_t vocab, int64_t width, int64_t depth, double dropout) {
    embed = register_module("embed", torch::nn::Embedding(vocab, width));
    for (int64_t i = 0; i < depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), MlpBlock(width, dropout)));
    }
    head = register_module("head", torch::nn::Linear(width, vocab));
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<MlpBlock> blocks;
  torch::nn::Linear head{nullptr};
};

class MlpStackModule : public TrainingModule {
 public:
  MlpStackModule(int64_t vocab, int64_t width, int64_t depth, double dropout = 0.0)
      : net_(std::make_shared<MlpStackNet>(vocab, width, depth, dropout)) {}

  torch::nn::Module& module() override { return *net_; }

  torch::Tensor training_step(const Batch& batch) override {
    auto logits = forward(batch.input);
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), batch.target.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  }

  ValidationStep validation_step(const Batch& batch) override {
    auto logits = forward(batch.input).to(torch::kFloat32);
    ValidationStep out;
    out.loss_sum = torch::nn::functional::cross_entropy(
                       logits.reshape({-1, logits.size(-1)}), batch.target.reshape({-1}),
                       torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum))
                       .item<double>();
    out.tokens = batch.target.ne(-1).sum().item<int64_t>();
    out.samples = batch.input.size(0);
    return out;
  }

  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override {
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& block : net_->blocks) units.push_back(block.ptr());
    return units;
  }

  MlpStackNet& net() { return *net_; }

 private:
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = net_->embed(tokens);
    for (size_t i = 0; i < net_->blocks.size(); ++i) {
      // The block by value (its shared_ptr): a runner may call this forward
      // again during backward.
      x = run_unit(static_cast<int64_t>(i), x,
                   [block = net_->blocks[i].ptr()](const torch::Tensor& t) { return block->forward(t); });
    }
    return net_->head(x);
  }

  std::shared_ptr<MlpStackNet> net_;
};

}  // namespace strata::testing
