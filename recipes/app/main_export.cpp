// strata-export: a strata checkpoint -> its model's weights in a format of
// the model's family (recipes/app/export.h): nanoGPT-named torch.save files
// and transformers GPT-2 directories for the GPT, transformers directories
// for the Llama family.
//
//   strata-export runs/gpt/checkpoints/step-500 gpt.pt
//   strata-export runs/gpt gpt.pt                   # an output directory: its newest checkpoint
//   strata-export --format hf runs/gpt hf-gpt2/     # transformers' from_pretrained
#include "strata/recipes/app/export.h"

int main(int argc, char** argv) { return strata::recipes::run_export(argc, argv); }
