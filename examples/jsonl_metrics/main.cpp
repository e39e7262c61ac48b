// jsonl-metrics: strata's GPT trained through the library API (not
// strata-gpt) with a callback of the user's own, JsonlMetrics, beside
// strata's progress bar.
//
//   jsonl-metrics OUT.jsonl [STEPS]
#include "jsonl_metrics.h"

#include <strata/callbacks/progress.h>
#include <strata/recipes/data/data.h>
#include <strata/recipes/models/gpt/gpt.h>
#include <strata/strategies/registry.h>
#include <strata/trainer/trainer.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: jsonl-metrics OUT.jsonl [STEPS]" << std::endl;
    return 2;
  }
  const int64_t steps = argc == 3 ? std::stoll(argv[2]) : 40;
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  const auto data = strata::recipes::make_data("addition", 0, 0, 1337);
  torch::manual_seed(1337);
  strata::recipes::GPTModule model(strata::recipes::gpt_preset("gpt-nano")
                                       .vocab_size(data->vocab_size())
                                       .block_size(data->block_size()));
  std::vector<std::shared_ptr<strata::Callback>> callbacks = {
      std::make_shared<strata::ProgressBar>(strata::ProgressBarOptions().mode(strata::ProgressMode::kPlain)),
      std::make_shared<jsonl::JsonlMetrics>(argv[1])};
  strata::Trainer trainer(strata::TrainerOptions().max_steps(steps).batch_size(32).lr(3e-3).log_every_n_steps(10),
                          registry.create("single", strata::Comm()), callbacks);
  const auto result = trainer.fit(model, *data);
  std::cout << "done: " << result.steps << " steps, final loss " << result.final_train_loss << ", metrics in "
            << argv[1] << std::endl;
  return 0;
}
