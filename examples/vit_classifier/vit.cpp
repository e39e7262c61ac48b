#include "vit.h"

#include <cmath>

namespace vit {

BlockImpl::BlockImpl(int64_t dim, int64_t heads, int64_t mlp) : heads_(heads) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
  proj_ = register_module("proj", torch::nn::Linear(dim, dim));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  fc1_ = register_module("fc1", torch::nn::Linear(dim, mlp));
  fc2_ = register_module("fc2", torch::nn::Linear(mlp, dim));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), n = x.size(1), d = x.size(2), dh = d / heads_;
  auto qkv = qkv_->forward(ln1_->forward(x)).view({b, n, 3, heads_, dh}).permute({2, 0, 3, 1, 4});
  auto scores = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(double(dh));
  auto attended = torch::matmul(torch::softmax(scores, -1), qkv[2]).transpose(1, 2).reshape({b, n, d});
  auto h = x + proj_->forward(attended);
  return h + fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(h))));
}

ViTImpl::ViTImpl(const ViTOptions& o) : options(o) {
  embed = register_module("embed", torch::nn::Linear(o.patch() * o.patch(), o.dim()));
  position = register_parameter("position", torch::randn({1, o.tokens(), o.dim()}) * 0.02);
  for (int64_t i = 0; i < o.depth(); ++i) {
    blocks.push_back(register_module("block" + std::to_string(i), Block(o.dim(), o.heads(), o.mlp())));
  }
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim()})));
  head = register_module("head", torch::nn::Linear(o.dim(), o.classes()));
}

torch::Tensor ViTClassifier::forward(const torch::Tensor& images) {
  const auto& o = model_->options;
  const int64_t b = images.size(0), side = o.image() / o.patch();
  // [B, 1, H, W] -> [B, tokens, patch*patch]
  auto patches = images.reshape({b, side, o.patch(), side, o.patch()}).permute({0, 1, 3, 2, 4}).reshape(
      {b, side * side, o.patch() * o.patch()});
  auto x = model_->embed->forward(patches) + model_->position;
  for (size_t i = 0; i < model_->blocks.size(); ++i) {
    // The unit seam: strategies and activation checkpointing act around each block.
    x = run_unit(static_cast<int64_t>(i), x, [block = model_->blocks[i].ptr()](const torch::Tensor& t) {
      return block->forward(t);
    });
  }
  return model_->head->forward(model_->norm->forward(x).mean(1));
}

torch::Tensor ViTClassifier::training_step(const strata::Batch& batch) {
  return torch::nn::functional::cross_entropy(forward(batch.input), batch.target);
}

strata::ValidationStep ViTClassifier::validation_step(const strata::Batch& batch) {
  const auto logits = forward(batch.input);
  strata::ValidationStep out;
  out.loss_sum = torch::nn::functional::cross_entropy(
                     logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                     .item<double>();
  out.tokens = out.samples = batch.target.size(0);
  out.correct_samples = logits.argmax(-1).eq(batch.target).sum().item<int64_t>();
  return out;
}

std::vector<std::shared_ptr<torch::nn::Module>> ViTClassifier::wrap_units() {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (auto& block : model_->blocks) units.push_back(block.ptr());
  return units;
}

strata::Batch GeneratedImages::samples(uint64_t stream, int64_t first, int64_t count) const {
  const int64_t side = options_.image();
  auto images = torch::zeros({count, 1, side, side});
  auto labels = torch::empty({count}, torch::kInt64);
  for (int64_t i = 0; i < count; ++i) {
    // Each sample from its own generator: the same image whichever batch, rank or world asks for it.
    auto gen = at::detail::createCPUGenerator(seed_ * 1000003 + stream * (uint64_t(1) << 40) + uint64_t(first + i));
    const auto draw = torch::randint(0, 1 << 20, {3}, gen, torch::kInt64);
    const int64_t label = draw[0].item<int64_t>() % options_.classes();
    const int64_t at = 2 + draw[1].item<int64_t>() % (side - 4), size = 3 + draw[2].item<int64_t>() % (side / 2);
    auto img = images[i][0];
    if (label == 0) img.index_put_({at, torch::indexing::Slice()}, 1.0);
    if (label == 1) img.index_put_({torch::indexing::Slice(), at}, 1.0);
    if (label == 2) img.copy_(torch::eye(side));
    if (label == 3) {
      const int64_t lo = std::min(at, side - size), hi = lo + size - 1;
      img.index_put_({lo, torch::indexing::Slice(lo, hi + 1)}, 1.0);
      img.index_put_({hi, torch::indexing::Slice(lo, hi + 1)}, 1.0);
      img.index_put_({torch::indexing::Slice(lo, hi + 1), lo}, 1.0);
      img.index_put_({torch::indexing::Slice(lo, hi + 1), hi}, 1.0);
    }
    img.add_(torch::randn({side, side}, gen) * 0.3);
    labels[i] = label;
  }
  return {images, labels};
}

strata::Batch GeneratedImages::train_batch(int64_t index, int64_t batch_size, strata::ShardInfo shard) const {
  return samples(0, (index * shard.world_size + shard.rank) * batch_size, batch_size);
}

strata::Batch GeneratedImages::val_batch(int64_t index, int64_t batch_size, strata::ShardInfo shard) const {
  return samples(1, (index * shard.world_size + shard.rank) * batch_size, batch_size);
}

}  // namespace vit
