// strata-micro-bench: the kernels under strata's throughput, in isolation.
//
//   BM_Matmul, BM_MatmulBf16       n×n products (2n³ FLOPs) on 1 or 2 threads; counter FLOP/s
//   BM_AllReduce/bytes             Comm::all_reduce, in-place SUM, 2 ranks as threads (Gloo)
//   BM_Broadcast/bytes, BM_Reduce/bytes   Comm::broadcast / Comm::reduce from/to rank 0
//   BM_ReduceScatterEmulated/bytes Comm::reduce_scatter (emulated with one all-to-all)
//   BM_AllGatherInto/bytes         Comm::all_gather_into (flat output, emulated with a
//                                  list all-gather into views)
//   BM_GlooAllReduce/bytes         c10d ProcessGroupGloo::allreduce directly (the yardstick)
//   BM_GlooReduceScatterBase, BM_GlooAllGatherBase   LibTorch 2.x Gloo's native flat
//                                  collectives, called directly (what Comm would use
//                                  instead of its emulation)
//   BM_GlooAllReduceBf16/bytes     Gloo's native bf16 all-reduce of the same bytes
//                                  collectives: 64 KiB - 64 MiB; counters GB (GB/s) and
//                                  vs_gloo_allreduce (Gloo all-reduce time of the same
//                                  bytes, interleaved call by call, ÷ this call's; > 1 is faster)
//   BM_FlattenUnit, BM_UnflattenUnit, BM_AdamW*PerParam, BM_AdamWFlatShard  (flat_bench.cpp)
//   BM_AdamW*, BM_Copy*, BM_Memcpy  the optimizer step (adamw_bench.cpp)
//   BM_Attention/T/fused           causal attention core forward + backward, B 4, H 6,
//                                  head 64 (gpt-mini's), fused (kernels/attention.h)
//                                  or naive; 2 threads (and 1)
//   BM_AttentionMemory/T/fused     the same once under trainer/memory.h's tracker:
//                                  counters saved_bytes (held from forward to backward)
//                                  and peak_bytes (fwd + bwd peak above the inputs)
//   BM_FlightRecorder              one collective's flight-recorder bookkeeping (flight_bench.cpp)
//
// Collective sizes are the full flat buffer (what ZeRO shards); bytes_per_second
// is that size per call, so the three compare as "time to sync S bytes". Each
// collective iteration is one call on every rank; ranks are threads in one
// process sharing the cores (strategies/thread_world.h).
//
//   build/bin/strata-micro-bench                       # ~20 s on 2 cores
//   build/bin/strata-micro-bench --benchmark_filter=Matmul
//   build/bin/strata-micro-bench --benchmark_filter=Attention
#include "strata/bench/micro/scoped_threads.h"
#include "strata/kernels/attention.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/thread_world.h"
#include "strata/trainer/memory.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <chrono>

namespace {

void matmul(benchmark::State& state, torch::Dtype dtype) {
  const int64_t n = state.range(0);
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(static_cast<int>(state.range(1)));
  auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
  auto c = torch::empty({n, n}, dtype);
  torch::mm_out(c, a, b);  // warm-up: thread pool, packing buffers
  for (auto _ : state) {
    torch::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
  at::set_num_threads(saved_threads);
}

void BM_Matmul(benchmark::State& state) { matmul(state, torch::kFloat32); }
void BM_MatmulBf16(benchmark::State& state) { matmul(state, torch::kBFloat16); }

enum class Collective {
  kAllReduce, kBroadcast, kReduce, kReduceScatter, kAllGather, kGlooAllReduce,
  kGlooReduceScatterBase, kGlooAllGatherBase, kGlooAllReduceBf16
};

using Seconds = std::chrono::duration<double>;

/// Runs one collective per benchmark iteration on a 2-rank thread world: rank 0
/// drives google/benchmark's loop, the peer makes the same number of calls
/// (state.max_iterations, fixed for one invocation), so every call pairs up.
/// Each iteration also runs Gloo's own all-reduce of the same bytes (the
/// ProcessGroup's, bypassing Comm) right after, timed apart: interleaved, so a
/// load change on a shared machine slows both alike. The benchmark's time is
/// the collective's alone (manual time). Counters: GB (the full buffer's bytes
/// per second, in GB) and vs_gloo_allreduce (Gloo all-reduce time ÷ this
/// collective's; > 1: faster than an all-reduce of the same bytes).
void collective(benchmark::State& state, Collective kind) {
  constexpr int kRanks = 2;
  const int64_t numel = state.range(0) / int64_t(sizeof(float));
  // Why one intra-op thread: the ranks are threads sharing the cores, as
  // strata-gpt's ranks share them with --threads-per-rank 1.
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(1);
  double ours_s = 0.0, gloo_s = 0.0;
  const bool yardstick = kind != Collective::kGlooAllReduce;
  strata::run_thread_world(
      kRanks,
      [&](strata::Comm& comm) {
        auto full = torch::ones({numel});
        auto shard = torch::ones({numel / kRanks});
        auto yard = torch::ones({numel});
        auto half = torch::ones({numel * 2}, torch::kBFloat16);  // the same bytes in bf16
        std::vector<torch::Tensor> tensors = {full}, yard_tensors = {yard}, bf16_tensors = {half};
        auto& pg = *comm.process_group();
        auto one_call = [&] {
          switch (kind) {
            case Collective::kAllReduce: comm.all_reduce(full); break;
            case Collective::kBroadcast: comm.broadcast(full, 0); break;
            case Collective::kReduce: comm.reduce(full, 0); break;
            case Collective::kReduceScatter: comm.reduce_scatter(shard, full); break;
            case Collective::kAllGather: comm.all_gather_into(full, shard); break;
            case Collective::kGlooAllReduce: pg.allreduce(tensors)->wait(); break;
            // LibTorch 2.x's Gloo has these natively; Comm emulates them
            // (strategies/comm.cpp says which won and by how much).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // the names 2.11 has too (strategies/comm.cpp)
            case Collective::kGlooReduceScatterBase: pg._reduce_scatter_base(shard, full)->wait(); break;
            case Collective::kGlooAllGatherBase: pg._allgather_base(full, shard)->wait(); break;
#pragma GCC diagnostic pop
            case Collective::kGlooAllReduceBf16: pg.allreduce(bf16_tensors)->wait(); break;
          }
        };
        auto gloo_call = [&] { comm.process_group()->allreduce(yard_tensors)->wait(); };
        one_call();  // warm-up: connections, buffers
        if (yardstick) gloo_call();
        comm.barrier();
        if (comm.rank() == 0) {
          for (auto _ : state) {
            const auto t0 = std::chrono::steady_clock::now();
            one_call();
            const auto t1 = std::chrono::steady_clock::now();
            if (yardstick) gloo_call();
            const auto t2 = std::chrono::steady_clock::now();
            state.SetIterationTime(Seconds(t1 - t0).count());
            ours_s += Seconds(t1 - t0).count();
            gloo_s += Seconds(t2 - t1).count();
          }
        } else {
          for (benchmark::IterationCount i = 0; i < state.max_iterations; ++i) {
            one_call();
            if (yardstick) gloo_call();
          }
        }
      },
      std::chrono::seconds(120));
  at::set_num_threads(saved_threads);
  state.SetBytesProcessed(state.iterations() * state.range(0));
  state.counters["GB"] =
      benchmark::Counter(double(state.range(0)) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (yardstick && ours_s > 0) state.counters["vs_gloo_allreduce"] = gloo_s / ours_s;
}

void BM_AllReduce(benchmark::State& state) { collective(state, Collective::kAllReduce); }
void BM_Broadcast(benchmark::State& state) { collective(state, Collective::kBroadcast); }
void BM_Reduce(benchmark::State& state) { collective(state, Collective::kReduce); }
void BM_ReduceScatterEmulated(benchmark::State& state) { collective(state, Collective::kReduceScatter); }
void BM_AllGatherInto(benchmark::State& state) { collective(state, Collective::kAllGather); }
void BM_GlooAllReduce(benchmark::State& state) { collective(state, Collective::kGlooAllReduce); }
void BM_GlooReduceScatterBase(benchmark::State& state) { collective(state, Collective::kGlooReduceScatterBase); }
void BM_GlooAllGatherBase(benchmark::State& state) { collective(state, Collective::kGlooAllGatherBase); }
void BM_GlooAllReduceBf16(benchmark::State& state) { collective(state, Collective::kGlooAllReduceBf16); }

/// The attention core as CausalSelfAttention runs it: q, k, v are head views
/// of one [B, T, 3C] projection, the result goes back to [B, T, C].
struct AttentionCase {
  static constexpr int64_t B = 4, H = 6, D = 64;
  int64_t T;
  bool fused;
  torch::Tensor qkv, grad;

  AttentionCase(int64_t t, bool f) : T(t), fused(f) {
    torch::manual_seed(0);
    qkv = torch::randn({B, T, 3 * H * D}).requires_grad_();
    grad = torch::randn({B, T, H * D});
  }
  torch::Tensor forward() const {
    auto parts = qkv.split(H * D, 2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
    auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    auto y = fused ? strata::kernels::causal_attention(q, k, v, 0.0, true)
                   : strata::kernels::naive_causal_attention(q, k, v);
    return y.transpose(1, 2).contiguous().view({B, T, H * D});
  }
  void step() {
    forward().backward(grad);
    qkv.mutable_grad() = torch::Tensor();
  }
};

void BM_Attention(benchmark::State& state) {
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(static_cast<int>(state.range(2)));
  AttentionCase c(state.range(0), state.range(1) != 0);
  c.step();  // warm-up
  for (auto _ : state) c.step();
  // Causal attention FLOPs (fwd 2 matmuls, bwd 4; half the T×T scores used):
  // 6 · 2·B·H·T²·D / 2.
  const double flops = 6.0 * AttentionCase::B * AttentionCase::H * double(c.T) * c.T * AttentionCase::D;
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  at::set_num_threads(saved_threads);
}

void BM_AttentionMemory(benchmark::State& state) {
  AttentionCase c(state.range(0), state.range(1) != 0);
  int64_t saved = 0, peak = 0;
  for (auto _ : state) {
    strata::MemoryTracker tracker;  // counts allocations made from here on
    const int64_t base = tracker.current_bytes();
    auto y = c.forward();
    saved = tracker.current_bytes() - base - y.nbytes();  // what autograd holds for backward
    y.backward(c.grad);
    peak = tracker.peak_bytes() - base;
    c.qkv.mutable_grad() = torch::Tensor();
  }
  state.counters["saved_bytes"] = double(saved);
  state.counters["peak_bytes"] = double(peak);
}

// LayerNorm forward + backward on a GPT block's activations (batch 8, block
// 128, width 192): the same ATen kernel PyTorch runs, timed here to compare
// with a Python loop over the same shapes.
void BM_LayerNorm(benchmark::State& state) {
  strata::bench::ScopedThreads threads(state.range(0));
  torch::manual_seed(0);
  auto x = torch::randn({8, 128, 192}).requires_grad_(true);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({192}));
  auto g = torch::randn({8, 128, 192});
  for (auto _ : state) {
    auto y = ln(x);
    if (state.range(1) == 1) y.backward(g);
    benchmark::DoNotOptimize(y.data_ptr());
  }
}

}  // namespace

BENCHMARK(BM_LayerNorm)->ArgsProduct({{1, 2}, {0, 1}})->ArgNames({"threads", "backward"})
    ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.3);

// Real time throughout: the main thread's CPU time misses the other intra-op
// thread's (or the peer rank's) work and the waits.
// Args: {n, intra-op threads}; 1 thread is a rank under --threads-per-rank 1.
BENCHMARK(BM_Matmul)->ArgsProduct({{256, 512, 1024}, {1, 2}})->ArgNames({"n", "threads"})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_MatmulBf16)->ArgsProduct({{256, 512, 1024}, {1, 2}})->ArgNames({"n", "threads"})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
// Collectives: 64 KiB to 64 MiB of fp32 (x4 steps), 2 thread-ranks.
#define STRATA_COLLECTIVE_BENCH(fn)                                                                          \
  BENCHMARK(fn)->RangeMultiplier(4)->Range(64 << 10, 64 << 20)->ArgName("bytes")->Unit(benchmark::kMillisecond) \
      ->UseManualTime()->MinTime(0.3)
STRATA_COLLECTIVE_BENCH(BM_AllReduce);
STRATA_COLLECTIVE_BENCH(BM_Broadcast);
STRATA_COLLECTIVE_BENCH(BM_Reduce);
STRATA_COLLECTIVE_BENCH(BM_ReduceScatterEmulated);
STRATA_COLLECTIVE_BENCH(BM_AllGatherInto);
STRATA_COLLECTIVE_BENCH(BM_GlooAllReduce);
STRATA_COLLECTIVE_BENCH(BM_GlooReduceScatterBase);
STRATA_COLLECTIVE_BENCH(BM_GlooAllGatherBase);
STRATA_COLLECTIVE_BENCH(BM_GlooAllReduceBf16);

// Args: {T, fused (1) or naive (0), intra-op threads}.
BENCHMARK(BM_Attention)->ArgsProduct({{128, 256, 512, 1024, 2048}, {0, 1}, {2, 1}})
    ->ArgNames({"T", "fused", "threads"})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_AttentionMemory)->ArgsProduct({{1024}, {0, 1}})->ArgNames({"T", "fused"})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

BENCHMARK_MAIN();
