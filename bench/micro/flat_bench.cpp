// Flat-parameter micro-benchmarks, on one block's parameters of the bench
// family's medium preset (ModelRegistry::bench_family; the built-ins':
// gpt-mini, width 192, weights and biases, 445k floats) and on its whole
// parameter list for the optimizer:
//
//   BM_FlattenUnit/threads     copy a unit's parameters into one flat buffer (FlatParam's
//                              layout: each parameter a contiguous range)
//   BM_UnflattenUnit/threads   copy the flat buffer back into the parameters
//   BM_AdamWTorchPerParam/threads  torch::optim::AdamW::step over the model's per-parameter
//                              tensors (what a non-sharded strategy steps)
//   BM_AdamWFlatShard/threads  the fused AdamW kernel over one flat buffer of the same
//                              element count (what OSS/SDP/FSDP step on a rank's shard);
//                              counter vs_torch_per_param: torch's time ÷ this one's,
//                              the two stepped alternately
//   BM_AdamWFusedPerParam/threads/kernel  FusedAdamW over the model's per-parameter tensors
//                              (what single/ddp step), kernel 0: strata's, 1: ATen's
//                              _fused_adamw_; counter vs_other: the other kernel's time
//                              ÷ this one's, the two stepped alternately
//
// Counter GB (GB/s): flatten/unflatten count read + write bytes; the AdamW steps count the
// fused step's 7 x 4 bytes per element (read p, g, m, v; write p, m, v).
//
//   build/bin/strata-micro-bench --benchmark_filter='Flatten|Unflatten|PerParam|FlatShard'
#include "strata/kernels/fused_adamw.h"
#include "strata/kernels/fused_adamw_optimizer.h"

#include "strata/bench/micro/scoped_threads.h"
#include "strata/recipes/models/spec.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>

namespace {

constexpr int64_t kVocab = 65, kBlock = 256;

/// The bench family's medium model (the vocabulary of Shakespeare's
/// characters, block 256), built once.
strata::TrainingModule& bench_model() {
  static const std::unique_ptr<strata::TrainingModule> model = [] {
    strata::recipes::ModelRegistry models;
    strata::recipes::register_builtin_models(models);
    strata::recipes::ModelRequest request;
    request.preset = models.bench_family().bench().medium.preset;
    request.vocab_size = kVocab;
    request.block_size = kBlock;
    return models.resolve(request)->build(/*deferred=*/false);
  }();
  return *model;
}

/// One block's parameter shapes (its first wrap unit's).
std::vector<std::vector<int64_t>> block_shapes() {
  std::vector<std::vector<int64_t>> out;
  for (const auto& p : bench_model().wrap_units().at(0)->parameters()) out.push_back(p.sizes().vec());
  return out;
}

/// All of the model's parameters, as fresh tensors.
std::vector<torch::Tensor> model_params() {
  std::vector<torch::Tensor> out;
  for (const auto& p : bench_model().module().parameters()) out.push_back(torch::randn(p.sizes()));
  return out;
}

struct Unit {
  std::vector<torch::Tensor> params;
  torch::Tensor flat;
  int64_t numel = 0;
  Unit() {
    for (const auto& shape : block_shapes()) {
      params.push_back(torch::randn(shape));
      numel += params.back().numel();
    }
    flat = torch::empty({numel});
  }
  void flatten() {
    int64_t offset = 0;
    for (const auto& p : params) {
      flat.narrow(0, offset, p.numel()).copy_(p.reshape({-1}));
      offset += p.numel();
    }
  }
  void unflatten() {
    int64_t offset = 0;
    for (auto& p : params) {
      p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
};

void BM_FlattenUnit(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  Unit unit;
  unit.flatten();
  for (auto _ : state) {
    unit.flatten();
    benchmark::DoNotOptimize(unit.flat.data_ptr());
  }
  state.counters["GB"] = benchmark::Counter(2.0 * 4 * unit.numel / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_UnflattenUnit(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  Unit unit;
  unit.flatten();
  unit.unflatten();
  for (auto _ : state) {
    unit.unflatten();
    benchmark::DoNotOptimize(unit.params.back().data_ptr());
  }
  state.counters["GB"] = benchmark::Counter(2.0 * 4 * unit.numel / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

torch::optim::AdamWOptions adamw_options() {
  return torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1);
}

/// An AdamW (torch::optim::AdamW by default) over the model's per-parameter tensors.
struct TorchPerParam {
  std::vector<torch::Tensor> params = model_params();
  std::unique_ptr<torch::optim::AdamW> opt;
  int64_t numel = 0;
  explicit TorchPerParam(std::optional<strata::FusedAdamWKernel> fused = std::nullopt) {
    for (auto& p : params) {
      p.requires_grad_(true);
      p.mutable_grad() = torch::randn_like(p);
      numel += p.numel();
    }
    if (fused) {
      opt = std::make_unique<strata::FusedAdamW>(params, adamw_options(), *fused);
    } else {
      opt = std::make_unique<torch::optim::AdamW>(params, adamw_options());
    }
    opt->step();  // warm-up: state allocated and touched
  }
};

void BM_AdamWTorchPerParam(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  TorchPerParam t;
  for (auto _ : state) {
    t.opt->step();
    benchmark::DoNotOptimize(t.params[0].data_ptr());
  }
  state.counters["GB"] = benchmark::Counter(7.0 * 4 * t.numel / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

/// Runs `timed` and `yardstick` alternately, once each per iteration (a load
/// change on a shared machine slows both alike); the benchmark's time is
/// timed's. Returns the yardstick's total time ÷ timed's (0 if none ran).
template <typename Timed, typename Yardstick>
double time_alternately(benchmark::State& state, Timed&& timed, Yardstick&& yardstick) {
  double timed_s = 0.0, yardstick_s = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    timed();
    const auto t1 = std::chrono::steady_clock::now();
    yardstick();
    const auto t2 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    timed_s += std::chrono::duration<double>(t1 - t0).count();
    yardstick_s += std::chrono::duration<double>(t2 - t1).count();
  }
  return timed_s > 0 ? yardstick_s / timed_s : 0.0;
}

void BM_AdamWFlatShard(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  TorchPerParam reference;  // the same element count, and the yardstick
  const int64_t n = reference.numel;
  auto p = torch::randn({n}), g = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  int64_t step = 1;
  auto opts = strata::AdamWStepOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1);
  strata::fused_adamw_step(p, g, m, v, opts.step(step++));  // warm-up
  // torch's per-parameter step alternates with the fused one.
  const double ratio = time_alternately(
      state,
      [&] {
        strata::fused_adamw_step(p, g, m, v, opts.step(step++));
        benchmark::DoNotOptimize(p.data_ptr());
      },
      [&] { reference.opt->step(); });
  state.counters["GB"] = benchmark::Counter(7.0 * 4 * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (ratio > 0) state.counters["vs_torch_per_param"] = ratio;
}

void BM_AdamWFusedPerParam(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  const auto kernel = state.range(1) == 1 ? strata::FusedAdamWKernel::kAten : strata::FusedAdamWKernel::kStrata;
  const auto other = state.range(1) == 1 ? strata::FusedAdamWKernel::kStrata : strata::FusedAdamWKernel::kAten;
  TorchPerParam timed(kernel), yardstick(other);
  const double ratio = time_alternately(
      state,
      [&] {
        timed.opt->step();
        benchmark::DoNotOptimize(timed.params[0].data_ptr());
      },
      [&] { yardstick.opt->step(); });
  state.counters["GB"] = benchmark::Counter(7.0 * 4 * timed.numel / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (ratio > 0) state.counters["vs_other"] = ratio;
  state.SetLabel(strata::fused_adamw_kernel_name(kernel));
}

}  // namespace

// Real time: the main thread's CPU time misses the second intra-op thread's work.
BENCHMARK(BM_FlattenUnit)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_UnflattenUnit)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_AdamWTorchPerParam)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_AdamWFlatShard)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseManualTime()->MinTime(0.5);
BENCHMARK(BM_AdamWFusedPerParam)->ArgsProduct({{1, 2}, {0, 1}})->ArgNames({"threads", "kernel"})
    ->Unit(benchmark::kMillisecond)->UseManualTime()->MinTime(1.0);
