// vit-classifier: the ViT of vit.h trained on generated images through
// strata's library API, under any registered strategy picked by a flag, with
// activation checkpointing through the unit seam and resumable checkpoints.
//
//   vit-classifier --strategy fsdp --nproc 2 --steps 60 --activation-checkpointing 1 --checkpoint-dir ckpt
//   vit-classifier --strategy fsdp --nproc 2 --steps 60 --resume ckpt/step-30
//   vit-classifier --strategy fsdp --nproc 2 --sharding-strategy shard_grad_op   # a strategy's own option
//
// Every flag is `--key value`. Keys this program does not know go to the
// strategy as its options (its spec parses and checks them: an unknown or bad
// one is one line naming it, exit 2). The last line is the result:
//   done: <steps> steps | val loss <L> | val accuracy <A> | params checksum <C>
// (C: the sum of every parameter, and of its square, after training, in full
// precision: equal sums mean an exact resume.)
#include "vit.h"

#include <strata/callbacks/model_checkpoint.h>
#include <strata/launch/launcher.h>
#include <strata/recipes/app/world.h>
#include <strata/strategies/activation_checkpoint.h>
#include <strata/strategies/registry.h>
#include <strata/trainer/trainer.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <string>

namespace {

struct Flags {
  std::string strategy = "single";
  int nproc = 1;
  int64_t steps = 60, batch_size = 32, activation_checkpointing = 0, checkpoint_every = 0, seed = 7;
  double lr = 3e-3;
  std::string checkpoint_dir, resume;
  std::map<std::string, std::string> strategy_options;  ///< the rest, for the strategy's spec
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    TORCH_CHECK_VALUE(key.rfind("--", 0) == 0 && i + 1 < argc, "expected --key value, got '", key, "'");
    const std::string value = argv[i + 1], name = key.substr(2);
    if (name == "strategy") f.strategy = value;
    else if (name == "nproc") f.nproc = std::stoi(value);
    else if (name == "steps") f.steps = std::stoll(value);
    else if (name == "batch-size") f.batch_size = std::stoll(value);
    else if (name == "lr") f.lr = std::stod(value);
    else if (name == "activation-checkpointing") f.activation_checkpointing = std::stoll(value);
    else if (name == "checkpoint-every") f.checkpoint_every = std::stoll(value);
    else if (name == "checkpoint-dir") f.checkpoint_dir = value;
    else if (name == "resume") f.resume = value;
    else if (name == "seed") f.seed = std::stoll(value);
    else f.strategy_options[name] = value;
  }
  return f;
}

/// Σp and Σp² over every parameter, in double: the run's final weights in two numbers.
std::string checksum(torch::nn::Module& module) {
  double sum = 0, squares = 0;
  for (const auto& p : module.parameters()) {
    sum += p.detach().to(torch::kDouble).sum().item<double>();
    squares += p.detach().to(torch::kDouble).pow(2).sum().item<double>();
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g/%.17g", sum, squares);
  return text;
}

int train(const Flags& f, const strata::StrategyRegistry& registry, strata::recipes::World& world) {
  torch::manual_seed(f.seed);  // every rank builds the same model (strategies broadcast rank 0's anyway)
  const vit::ViTOptions options;
  vit::ViTClassifier model(options);
  // Before the strategy's setup, so a strategy that wraps units (fsdp) installs its layer outside.
  if (f.activation_checkpointing > 0) {
    strata::apply_activation_checkpointing(model, strata::ActivationCheckpointOptions().every_n(f.activation_checkpointing));
  }
  std::shared_ptr<strata::Strategy> strategy = registry.create(f.strategy, world.comm, f.strategy_options, world.context());
  std::vector<std::shared_ptr<strata::Callback>> callbacks;
  if (!f.checkpoint_dir.empty()) {
    callbacks.push_back(std::make_shared<strata::ModelCheckpoint>(
        strata::ModelCheckpointOptions(f.checkpoint_dir).every_n_train_steps(f.checkpoint_every).keep_last(0)));
  }
  strata::Trainer trainer(strata::TrainerOptions()
                              .max_steps(f.steps)
                              .batch_size(f.batch_size)
                              .lr(f.lr)
                              .min_lr(f.lr / 10)
                              .warmup_steps(5)
                              .gradient_clip_val(1.0)
                              .val_check_interval(0)
                              .limit_val_batches(4)
                              .log_every_n_steps(20)
                              .seed(static_cast<uint64_t>(f.seed))
                              .resume_from(f.resume),
                          strategy, callbacks);
  const vit::GeneratedImages data(options);
  const auto result = trainer.fit(model, data);
  const auto full = strategy->full_params();  // a collective: fsdp gathers its shards
  if (world.comm.rank() == 0) {
    std::cout << "done: " << result.steps << " steps | val loss " << result.val_loss.value_or(-1) << " | val accuracy "
              << result.val_accuracy.value_or(-1) << " | params checksum " << checksum(model.module()) << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every strategy strata has; a project with its own would add it here.
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  Flags flags;
  std::optional<strata::recipes::World> world;
  try {
    flags = parse(argc, argv);
    // Bad input before any rank starts: the strategy's name, options and world.
    const auto& spec = registry.spec(flags.strategy);
    spec.parse_args(flags.strategy_options);
    TORCH_CHECK_VALUE(spec.max_world_size() == 0 || flags.nproc <= spec.max_world_size(), "strategy '",
                      spec.name(), "' runs at most ", spec.max_world_size(), " process(es); got --nproc ", flags.nproc);
    world = strata::recipes::launch_or_join({argv, argv + argc}, strata::recipes::WorldOptions().nproc(flags.nproc));
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const std::logic_error& e) {  // std::stoi and friends
    std::cerr << "error: bad number in the arguments: " << e.what() << std::endl;
    return 2;
  }
  if (world->launcher_exit_code) return *world->launcher_exit_code;
  try {
    return train(flags, registry, *world);
  } catch (const c10::Error& e) {
    // The launcher names the first rank that failed, with this line.
    strata::record_rank_error(e.what_without_backtrace());
    std::cerr << "[rank " << world->comm.rank() << "] error: " << e.what_without_backtrace() << std::endl;
    return 1;
  }
}
