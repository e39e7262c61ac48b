// AdamW step micro-benchmarks (kernels/fused_adamw.h), one step per iteration
// over one flat fp32 parameter of 10M elements (a rank's flat shard):
//
//   BM_AdamWTorch/threads        torch::optim::AdamW::step (~10 tensor ops)
//   BM_AdamWFused/threads        strata::FusedAdamW::step (one fused pass)
//   BM_AdamWAtenFused/threads    ATen's fused CPU AdamW (at::_fused_adamw_, what
//                                torch.optim.AdamW(fused=True) calls)
//   BM_AdamWFusedKernel/threads/isa   the bare kernel; isa 0: portable vectors, 1: AVX2+FMA
//   BM_AdamWFusedBf16/threads    the kernel plus the bf16 param copy in the same pass
//   BM_CopyBandwidth/threads     dst.copy_(src) over 4 x 10M floats (tensor copy)
//   BM_Memcpy                    std::memcpy of the same 160 MB (glibc: non-temporal stores)
//
// bytes_per_second is the traffic the fused step needs: 7 x 4 bytes per
// element (read p, g, m, v; write p, m, v; +2 with the bf16 copy) for every
// AdamW variant (so torch's figure is "effective"), and read + write bytes for
// the copies. The copy's rate is the bandwidth yardstick the fused step is
// measured against (a copy_ also pays a read-for-ownership of its output
// that the in-place AdamW buffers do not).
//
//   build/bin/strata-micro-bench --benchmark_filter='AdamW|Copy|Memcpy'
#include "strata/kernels/fused_adamw.h"
#include "strata/kernels/fused_adamw_optimizer.h"

#include "strata/bench/micro/scoped_threads.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstring>

namespace {

constexpr int64_t kParams = 10'000'000;
constexpr double kFusedBytesPerParam = 7 * 4;

template <typename Optimizer>
void optimizer_step(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  auto p = torch::randn({kParams}).requires_grad_(true);
  p.mutable_grad() = torch::randn({kParams});
  Optimizer opt({p}, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  opt.step();  // warm-up: state allocated and touched
  for (auto _ : state) {
    opt.step();
    benchmark::DoNotOptimize(p.data_ptr());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kParams * kFusedBytesPerParam));
}

void BM_AdamWTorch(benchmark::State& state) { optimizer_step<torch::optim::AdamW>(state); }

void BM_AdamWAtenFused(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  auto p = torch::randn({kParams}), g = torch::randn({kParams});
  auto m = torch::zeros({kParams}), v = torch::zeros({kParams});
  auto step = torch::zeros({}, torch::kFloat32);
  auto run = [&] {
    step.add_(1);
    at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, /*lr=*/1e-3, /*beta1=*/0.9, /*beta2=*/0.95,
                      /*weight_decay=*/0.1, /*eps=*/1e-8, /*amsgrad=*/false, /*maximize=*/false);
  };
  run();  // warm-up, as optimizer_step
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.data_ptr());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kParams * kFusedBytesPerParam));
}
void BM_AdamWFused(benchmark::State& state) { optimizer_step<strata::FusedAdamW>(state); }

void kernel_step(benchmark::State& state, bool bf16) {
  strata::bench::ScopedThreads threads(state.range(0));
  const auto isa = state.range(1) == 1 ? strata::AdamWIsa::kAvx2 : strata::AdamWIsa::kDefault;
  if (isa == strata::AdamWIsa::kAvx2 && !strata::adamw_avx2_available()) {
    state.SkipWithError("no AVX2+FMA kernel in this build or CPU");
    return;
  }
  auto p = torch::randn({kParams}), g = torch::randn({kParams}), m = torch::zeros({kParams}),
       v = torch::zeros({kParams});
  auto p16 = bf16 ? torch::empty({kParams}, torch::kBFloat16) : torch::Tensor();
  int64_t step = 1;
  auto opts = strata::AdamWStepOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1);
  strata::fused_adamw_step(p, g, m, v, opts.step(step++), p16, isa);  // warm-up
  for (auto _ : state) {
    strata::fused_adamw_step(p, g, m, v, opts.step(step++), p16, isa);
    benchmark::DoNotOptimize(p.data_ptr());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kParams * (kFusedBytesPerParam + (bf16 ? 2 : 0))));
  state.SetLabel(strata::adamw_isa_name(isa));
}

void BM_AdamWFusedKernel(benchmark::State& state) { kernel_step(state, false); }
void BM_AdamWFusedBf16(benchmark::State& state) { kernel_step(state, true); }

void BM_CopyBandwidth(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  auto src = torch::randn({4 * kParams}), dst = torch::zeros({4 * kParams});
  dst.copy_(src);
  for (auto _ : state) {
    dst.copy_(src);
    benchmark::DoNotOptimize(dst.data_ptr());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * src.nbytes()));
}

void BM_Memcpy(benchmark::State& state) {
  auto src = torch::randn({4 * kParams}), dst = torch::zeros({4 * kParams});
  std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
  for (auto _ : state) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    benchmark::DoNotOptimize(dst.data_ptr());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * src.nbytes()));
}

}  // namespace

// Real time: CPU time of the main thread misses the second intra-op thread's work.
BENCHMARK(BM_AdamWTorch)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_AdamWAtenFused)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_AdamWFused)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_AdamWFusedKernel)->ArgsProduct({{1, 2}, {0, 1}})->ArgNames({"threads", "isa"})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_AdamWFusedBf16)->ArgsProduct({{1, 2}, {1}})->ArgNames({"threads", "isa"})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_CopyBandwidth)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
