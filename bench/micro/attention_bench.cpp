// strata's fused causal attention (kernels/attention.h) against ATen's
// scaled_dot_product_attention CPU kernel (LibTorch 2.x's flash-style CPU
// path), forward + backward, gpt-mini's heads (H 6, D 32), 2048 tokens per
// iteration (B = 2048 / T), fp32 and bf16, 1 and 2 threads:
//
//   BM_AttentionStrata/T/threads/bf16   causal_attention (custom autograd Function)
//   BM_AttentionSdpa/T/threads/bf16     at::scaled_dot_product_attention(is_causal=true)
//
//   build/bin/strata-micro-bench --benchmark_filter='Attention'
#include "strata/kernels/attention.h"

#include "strata/bench/micro/scoped_threads.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>

namespace {

constexpr int64_t kTokens = 2048, kHeads = 6, kHeadDim = 32;

template <typename Attention>
void attention(benchmark::State& state, Attention&& run) {
  const int64_t T = state.range(0);
  strata::bench::ScopedThreads threads(state.range(1));
  const auto dtype = state.range(2) ? torch::kBFloat16 : torch::kFloat32;
  const int64_t B = std::max<int64_t>(1, kTokens / T);
  auto make = [&] { return torch::randn({B, kHeads, T, kHeadDim}).to(dtype).requires_grad_(true); };
  auto q = make(), k = make(), v = make();
  const auto grad = torch::randn({B, kHeads, T, kHeadDim}).to(dtype);
  for (auto _ : state) {
    auto y = run(q, k, v);
    y.backward(grad);
    benchmark::DoNotOptimize(q.grad().data_ptr());
    q.mutable_grad().reset();
    k.mutable_grad().reset();
    v.mutable_grad().reset();
  }
  state.SetItemsProcessed(state.iterations() * B * T);  // tokens/s
}

void BM_AttentionStrata(benchmark::State& state) {
  attention(state, [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return strata::kernels::causal_attention(q, k, v, /*dropout_p=*/0.0, /*training=*/true);
  });
}

void BM_AttentionSdpa(benchmark::State& state) {
  attention(state, [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  });
}

}  // namespace

BENCHMARK(BM_AttentionStrata)->ArgsProduct({{64, 128, 256, 512, 1024, 2048}, {1, 2}, {0, 1}})
    ->ArgNames({"T", "threads", "bf16"})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_AttentionSdpa)->ArgsProduct({{64, 128, 256, 512, 1024, 2048}, {1, 2}, {0, 1}})
    ->ArgNames({"T", "threads", "bf16"})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
