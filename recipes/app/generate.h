#pragma once
// strata-generate: text from a trained model (recipes/app/main_generate.cpp).
//
//   strata-generate MODEL --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
//
// MODEL is a model directory a registered family recognizes (a transformers
// Llama, Mistral or Qwen directory, or what strata-export --format hf and
// --export-weights write), with --adapter a PEFT LoRA directory on it; or a
// strata-gpt run (an output directory's newest checkpoint, or a
// checkpoints/step-N), its model resolved from the run's config.ini. The prompt is tokenized with MODEL's tokenizer
// (or --tokenizer), or given as ids (--prompt-ids "1 2 3"). Tokens come one
// at a time through the family's KV-cached decoder (ModelConfig::decoder):
// greedy with --temperature 0, else sampled (temperature, top-k, top-p) from
// --seed. Generation stops at the model's EOS (config.json's eos_token_id,
// else the tokenizer's), at --stop TEXT, or after --max-new-tokens. The text
// streams to stdout as it is made (--ids: the new ids on one line instead);
// the speed goes to stderr. Bad input: one line, exit 2.
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

namespace strata::recipes {

/// `strategies`: to read a run's config.ini, which names their options.
int run_generate(int argc, char** argv, const StrategyRegistry& strategies, const ModelRegistry& models);

}  // namespace strata::recipes
