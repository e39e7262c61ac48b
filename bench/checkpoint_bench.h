#pragma once
// strata-bench --suite checkpoint (bench/checkpoint_bench.cpp): save / load
// time, bytes per rank and peak memory of checkpoints under fsdp x 4.
#include "strata/recipes/models/spec.h"

namespace strata::bench {

/// main() for `strata-bench --suite checkpoint ...`; also each rank's entry
/// point when the suite launches itself (the launcher's environment is set).
/// --presets are `models`' (each built with GPT-2's vocabulary and a 1024
/// context).
int run_checkpoint_suite(int argc, char** argv, const recipes::ModelRegistry& models);

}  // namespace strata::bench
