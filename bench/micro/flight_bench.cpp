// BM_FlightRecorder: what the flight recorder adds to each collective, in
// isolation: a strategy's label (a fresh string, as FSDP and DDP make one),
// start() and finish(), the work Comm does per collective when recording is
// on. Times one collective's bookkeeping; multiplied by a step's collective
// count it bounds the recorder's share of a step (docs/debugging.md).
//
//   build/bin/strata-micro-bench --benchmark_filter=FlightRecorder
#include "strata/strategies/flight_recorder.h"

#include <benchmark/benchmark.h>

#include <string>

namespace {

void BM_FlightRecorder(benchmark::State& state) {
  strata::FlightRecorder recorder(static_cast<size_t>(state.range(0)));
  recorder.set_phase("step 12 backward");
  int64_t unit = 0;
  for (auto _ : state) {
    recorder.set_label("unit h" + std::to_string(unit++ % 12));
    const int64_t id = recorder.start("world", "reduce_scatter", "Float", 1779456);
    recorder.finish(id);
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_FlightRecorder)->Arg(2048)->ArgName("capacity")->Unit(benchmark::kNanosecond)->MinTime(0.5);
