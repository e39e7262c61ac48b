#pragma once
// strata-bench --suite checkpoint (bench/checkpoint_bench.cpp): save / load
// time, bytes per rank and peak memory of checkpoints under fsdp x 4.

namespace strata::bench {

/// main() for `strata-bench --suite checkpoint ...`; also each rank's entry
/// point when the suite launches itself (the launcher's environment is set).
int run_checkpoint_suite(int argc, char** argv);

}  // namespace strata::bench
