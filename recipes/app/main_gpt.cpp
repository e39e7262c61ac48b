// strata-gpt: train a GPT with any strategy.
//
//   strata-gpt                                        # gpt-micro on 3-digit addition, 1 process
//   strata-gpt --strategy ddp --nproc 2 --preset gpt-mini --max-steps 200
//   strata-gpt --data input.txt --preset gpt-mini --block-size 128
//   strata-gpt --help
#include "strata/recipes/app/run.h"

int main(int argc, char** argv) { return strata::recipes::run_gpt(argc, argv); }
