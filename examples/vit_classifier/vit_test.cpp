// vit_test: the ViT trains under every built-in strategy at 2 ranks (ranks as
// threads) with activation checkpointing through the unit seam, and ends
// where one process ends with the same global batch. Exit 0 when every
// strategy matches, 1 naming the first that does not.
#include "vit.h"

#include <strata/strategies/activation_checkpoint.h>
#include <strata/strategies/registry.h>
#include <strata/strategies/thread_world.h>
#include <strata/trainer/trainer.h>

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr int64_t kSteps = 6, kBatch = 8;  // per rank at 2 ranks; one process takes 2 x kBatch

/// The parameters after training `strategy` on `world` ranks (rank 0's, full).
std::vector<torch::Tensor> train(const strata::StrategyRegistry& registry, const std::string& strategy, int world) {
  std::vector<torch::Tensor> out;
  std::mutex mu;
  // Built here, one after the other: thread-ranks share torch's default
  // generator, so models built side by side would draw each other's numbers.
  std::vector<std::unique_ptr<vit::ViTClassifier>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(7);
    models.push_back(std::make_unique<vit::ViTClassifier>(vit::ViTOptions{}));
    strata::apply_activation_checkpointing(*models.back(), strata::ActivationCheckpointOptions().every_n(1));
  }
  strata::run_thread_world(world, [&](strata::Comm& comm) {
    auto& model = *models[comm.rank()];
    std::shared_ptr<strata::Strategy> s = registry.create(strategy, comm);
    // SGD without momentum: a step is linear in the gradient, so a gradient
    // of the wrong scale (not averaged, averaged twice) shows in the weights.
    strata::Trainer(strata::TrainerOptions()
                        .max_steps(kSteps)
                        .batch_size(2 * kBatch / world)
                        .optimizer("sgd")
                        .lr(0.5)
                        .min_lr(0.5)
                        .limit_val_batches(0),
                    s)
        .fit(model, vit::GeneratedImages(vit::ViTOptions{}));
    const auto full = s->full_params();
    if (comm.rank() != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : model.module().parameters()) out.push_back(p.detach().clone());
  });
  return out;
}

}  // namespace

int main() {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  at::set_num_threads(1);
  const auto reference = train(registry, "single", 1);
  const auto initial = [&] {
    torch::manual_seed(7);
    vit::ViTClassifier model(vit::ViTOptions{});
    std::vector<torch::Tensor> p;
    for (const auto& t : model.module().parameters()) p.push_back(t.detach().clone());
    return p;
  }();
  double moved = 0;
  for (size_t i = 0; i < reference.size(); ++i) moved = std::max(moved, (reference[i] - initial[i]).abs().max().item<double>());
  if (moved < 1e-3) {
    std::cerr << "FAIL: single did not train (largest change " << moved << ")" << std::endl;
    return 1;
  }
  for (const auto* spec : registry.specs()) {
    if (spec->max_world_size() == 1) continue;
    const auto got = train(registry, spec->name(), 2);
    double worst = 0;
    for (size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, (got[i] - reference[i]).abs().max().item<double>());
    // Reduction order differs between 1 and 2 ranks: fp32 rounding, ~1e-7.
    const bool ok = got.size() == reference.size() && worst < 1e-5;
    std::cout << (ok ? "ok   " : "FAIL ") << spec->name() << " x2 + activation checkpointing vs single: max |diff| "
              << worst << " (training moved weights by up to " << moved << ")" << std::endl;
    if (!ok) return 1;
  }
  return 0;
}
