// tp_comm_test - tensor parallelism's communication operators (ranks as
// threads over Gloo): each one's forward and backward by hand, then a
// Megatron MLP (column-parallel W1, row-parallel W2) at 2 and 3 ranks, with
// and without sequence parallelism, against the same MLP in one process:
// output, input gradient and every weight shard's gradient. And the dp x tp
// mesh: its groups, its refusals, and Comm subgroups built from it.
#include "strata/strategies/fake_world.h"
#include "strata/strategies/thread_world.h"
#include "strata/strategies/tp/mesh.h"
#include "strata/strategies/tp/parallel.h"
#include "strata/strategies/tp/plan.h"
#include "strata/strategies/tp/tp_comm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using strata::Comm;
using namespace strata::tp;

TEST(TpCommTest, CopyToTpSumsGradientsAndReduceFromTpSumsValues) {
  strata::run_thread_world(3, [](Comm& comm) {
    const double r = comm.rank() + 1;  // 1, 2, 3
    auto x = torch::arange(4, torch::kFloat).requires_grad_(true);
    const auto y = copy_to_tp(x, comm) * r;
    EXPECT_TRUE(torch::equal(y, torch::arange(4, torch::kFloat) * r));
    y.sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), torch::full({4}, 6.0))) << x.grad();  // 1 + 2 + 3 on every rank

    auto part = torch::full({4}, r).requires_grad_(true);
    const auto total = reduce_from_tp(part, comm);
    EXPECT_TRUE(torch::allclose(total, torch::full({4}, 6.0))) << total;
    (total * torch::arange(4, torch::kFloat)).sum().backward();
    EXPECT_TRUE(torch::equal(part.grad(), torch::arange(4, torch::kFloat))) << part.grad();  // passed through
  });
}

TEST(TpCommTest, GatherAndReduceScatterAlongTheSequenceAreEachOthersConjugate) {
  strata::run_thread_world(3, [](Comm& comm) {
    const int64_t r = comm.rank();
    // [batch 2, sequence 2 per rank, width 3]; rank r's slice holds 10r + position.
    auto mine = (torch::arange(12, torch::kFloat).view({2, 2, 3}) + 10.0 * r).requires_grad_(true);
    const auto full = gather_from_sp(mine, comm, 1);
    ASSERT_EQ(full.sizes(), (std::vector<int64_t>{2, 6, 3}));
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(torch::equal(full.narrow(1, 2 * k, 2), torch::arange(12, torch::kFloat).view({2, 2, 3}) + 10.0 * k));
    }
    // Rank r weighs the gathered sequence by r + 1: its slice's gradient is
    // the sum over ranks, 1 + 2 + 3.
    (full * static_cast<double>(r + 1)).sum().backward();
    EXPECT_TRUE(torch::allclose(mine.grad(), torch::full({2, 2, 3}, 6.0))) << mine.grad();

    auto partial = (torch::ones({2, 6, 3}) * static_cast<double>(r + 1)).requires_grad_(true);
    const auto slice = reduce_scatter_to_sp(partial, comm, 1);
    ASSERT_EQ(slice.sizes(), (std::vector<int64_t>{2, 2, 3}));
    EXPECT_TRUE(torch::allclose(slice, torch::full({2, 2, 3}, 6.0)));
    // Rank r's output gradient is r + 1: every rank's input gradient holds
    // rank k's at slice k.
    (slice * static_cast<double>(r + 1)).sum().backward();
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(torch::allclose(partial.grad().narrow(1, 2 * k, 2), torch::full({2, 2, 3}, k + 1.0)));
    }
  });
}

/// The MLP of a GPT block, y = W2 gelu(W1 x), in one process.
struct Mlp {
  torch::Tensor x, w1, w2;
};

Mlp reference_mlp() {
  torch::manual_seed(7);
  return {torch::randn({2, 6, 8}, torch::kDouble), torch::randn({24, 8}, torch::kDouble) * 0.3,
          torch::randn({8, 24}, torch::kDouble) * 0.3};
}

void expect_mlp_parity(int world, bool sequence_parallel) {
  const Mlp ref = reference_mlp();
  auto x = ref.x.clone().requires_grad_(true);
  auto w1 = ref.w1.clone().requires_grad_(true);
  auto w2 = ref.w2.clone().requires_grad_(true);
  const auto y = torch::linear(torch::gelu(torch::linear(x, w1)), w2);
  const auto target = torch::cos(torch::arange(y.numel(), torch::kDouble)).view_as(y);
  (y * target).sum().backward();

  strata::run_thread_world(world, [&](Comm& comm) {
    const int64_t r = comm.rank();
    const int64_t hidden = 24 / world;  // 24 hidden units: whole shards at 2 and 3 ranks
    const int64_t seq = 6 / world;
    // Column-parallel W1: rows [r·h, (r+1)·h); row-parallel W2: those columns.
    auto w1_shard = ref.w1.narrow(0, r * hidden, hidden).clone().requires_grad_(true);
    auto w2_shard = ref.w2.narrow(1, r * hidden, hidden).clone().requires_grad_(true);
    torch::Tensor x_in, out;
    if (sequence_parallel) {
      x_in = ref.x.narrow(1, r * seq, seq).clone().requires_grad_(true);
      const auto h = torch::gelu(torch::linear(gather_from_sp(x_in, comm, 1), w1_shard));
      out = reduce_scatter_to_sp(torch::linear(h, w2_shard), comm, 1);
      EXPECT_TRUE(torch::allclose(out, y.detach().narrow(1, r * seq, seq), 1e-12, 1e-12));
      (out * target.narrow(1, r * seq, seq)).sum().backward();
      EXPECT_TRUE(torch::allclose(x_in.grad(), x.grad().narrow(1, r * seq, seq), 1e-12, 1e-12));
    } else {
      x_in = ref.x.clone().requires_grad_(true);
      const auto h = torch::gelu(torch::linear(copy_to_tp(x_in, comm), w1_shard));
      out = reduce_from_tp(torch::linear(h, w2_shard), comm);
      EXPECT_TRUE(torch::allclose(out, y.detach(), 1e-12, 1e-12));
      (out * target).sum().backward();
      EXPECT_TRUE(torch::allclose(x_in.grad(), x.grad(), 1e-12, 1e-12)) << (x_in.grad() - x.grad()).abs().max();
    }
    EXPECT_TRUE(torch::allclose(w1_shard.grad(), w1.grad().narrow(0, r * hidden, hidden), 1e-12, 1e-12));
    EXPECT_TRUE(torch::allclose(w2_shard.grad(), w2.grad().narrow(1, r * hidden, hidden), 1e-12, 1e-12));
  });
}

TEST(TpCommTest, MegatronMlpMatchesOneProcessAtTwoAndThreeRanks) {
  expect_mlp_parity(2, /*sequence_parallel=*/false);
  expect_mlp_parity(3, /*sequence_parallel=*/false);
}

TEST(TpCommTest, SequenceParallelMlpMatchesOneProcessAtTwoAndThreeRanks) {
  expect_mlp_parity(2, /*sequence_parallel=*/true);
  expect_mlp_parity(3, /*sequence_parallel=*/true);
}

TEST(TpCommTest, AWorldOfOneIsTheIdentity) {
  const Comm one;
  const auto x = torch::arange(6, torch::kFloat).view({2, 3});
  EXPECT_TRUE(copy_to_tp(x, one).is_same(x));
  EXPECT_TRUE(reduce_from_tp(x, one).is_same(x));
  EXPECT_TRUE(gather_from_sp(x, one, 1).is_same(x));
  EXPECT_TRUE(reduce_scatter_to_sp(x, one, 1).is_same(x));
}

TEST(TpMeshTest, TensorParallelRanksAreInnermostAndBadSizesAreRefused) {
  const auto mesh = MeshDims::of(6, 3);
  EXPECT_EQ(mesh.dp, 2);
  EXPECT_EQ(mesh.tp_groups(), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(mesh.dp_groups(), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(mesh.tp_rank(4), 1);
  EXPECT_EQ(mesh.dp_rank(4), 1);
  EXPECT_EQ(MeshDims::of(4, 4).dp_groups().size(), 4u);  // pure tensor parallelism
  try {
    MeshDims::of(4, 3);
    ADD_FAILURE() << "tp 3 of 4 ranks was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "tensor-parallel size 3 must be >= 1 and divide the world size 4 (data-parallel groups of world / tp "
              "ranks)");
  }
  EXPECT_THROW(MeshDims::of(4, 0), c10::ValueError);
}

// 4 ranks as dp 2 x tp 2: each subgroup sums exactly its members.
TEST(TpMeshTest, CommSubgroupsFromTheMeshSumTheirMembers) {
  strata::run_thread_world(4, [](Comm& world) {
    const auto mesh = MeshDims::of(4, 2);
    Comm tp = world.split("tp", mesh.tp_groups());
    Comm dp = world.split("dp", mesh.dp_groups());
    const int r = world.rank();
    EXPECT_EQ(tp.size(), 2);
    EXPECT_EQ(tp.rank(), mesh.tp_rank(r));
    EXPECT_EQ(dp.rank(), mesh.dp_rank(r));
    auto t = torch::full({1}, static_cast<float>(r));
    tp.all_reduce(t);
    EXPECT_EQ(t.item<float>(), r < 2 ? 0 + 1 : 2 + 3);
    auto d = torch::full({1}, static_cast<float>(r));
    dp.all_reduce(d);
    EXPECT_EQ(d.item<float>(), r % 2 == 0 ? 0 + 2 : 1 + 3);
  });
}

// --- the plan and the vocabulary-parallel loss ----------------------------------

TEST(TpPlanTest, RulesMatchModulePathsAndGiveEachParameterItsSplit) {
  const Plan plan{{"wte", Style::kVocab}, {"h*.attn.c_attn", Style::kColwise, 3}, {"h*.c_proj", Style::kRowwise}};
  EXPECT_TRUE(path_matches("h*.attn.c_attn", "h11.attn.c_attn"));
  EXPECT_TRUE(path_matches("layers.*.wq", "layers.3.wq"));
  EXPECT_FALSE(path_matches("h*.c_proj", "h1.attn.c_proj"));
  const auto qkv = layout_of(plan, "h3.attn.c_attn.bias", 1);
  ASSERT_TRUE(qkv.has_value());
  EXPECT_EQ(qkv->dim, 0);
  EXPECT_EQ(qkv->chunks, 3);
  EXPECT_EQ(layout_of(plan, "h3.c_proj.weight", 2)->dim, 1);
  EXPECT_FALSE(layout_of(plan, "h3.c_proj.bias", 1).has_value()) << "a row-parallel bias is added once, whole";
  EXPECT_FALSE(layout_of(plan, "h3.ln_1.weight", 1).has_value());
  EXPECT_THROW(layout_of({{"h*.c_proj", Style::kRowwise}, {"h1.*", Style::kColwise}}, "h1.c_proj.weight", 2),
               c10::ValueError);
}

TEST(TpPlanTest, ARuleNamingOneParameterSplitsItAsAWeightAndLeavesTheRestWhole) {
  // A LoRA adapter beside a column-parallel Linear: its B splits by output
  // features (3 chunks, as the QKV beside it), its A stays whole.
  const Plan plan{{"h*.attn.c_attn_lora", Style::kColwise, 3, "B"}, {"h*.c_proj_lora", Style::kRowwise, 1, "A"}};
  const auto b = layout_of(plan, "h0.attn.c_attn_lora.B", 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->dim, 0);
  EXPECT_EQ(b->chunks, 3);
  EXPECT_FALSE(layout_of(plan, "h0.attn.c_attn_lora.A", 2).has_value());
  const auto a = layout_of(plan, "h1.c_proj_lora.A", 2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->dim, 1);
  EXPECT_FALSE(layout_of(plan, "h1.c_proj_lora.B", 2).has_value());
  EXPECT_TRUE(rule_matches(plan[0], "h3.attn.c_attn_lora.B"));
  EXPECT_FALSE(rule_matches(plan[0], "h3.attn.c_attn_lora.A"));
}

/// Each rank's draws in a rank_random scope, and the shared stream's after
/// it, with the default CPU generator seeded alike first (one thread: the
/// ranks are Parallels over a fake world of 2, which moves no data).
std::pair<torch::Tensor, torch::Tensor> draws_of(int rank, bool draws) {
  const Parallel parallel(Comm(strata::fake_process_group(rank, 2), torch::kCPU), /*sequence_parallel=*/false);
  torch::manual_seed(11);
  torch::Tensor inside;
  {
    const auto scope = parallel.rank_random(draws);
    inside = torch::rand({8});
  }
  return {inside, torch::rand({8})};
}

TEST(TpRandomTest, EachRankDrawsItsOwnMasksInsideAndTheSharedStreamAfter) {
  const auto [in0, after0] = draws_of(0, true);
  const auto [in1, after1] = draws_of(1, true);
  EXPECT_FALSE(torch::equal(in0, in1)) << "the ranks' heads (or tokens) would share dropout masks";
  EXPECT_TRUE(torch::equal(after0, after1)) << "replicated dropout after the region must agree across ranks";
  // Stateless: the same generator state gives the same draws (a recompute).
  EXPECT_TRUE(torch::equal(draws_of(0, true).first, in0));
  // The shared stream moved on: a second region is not the first one again.
  torch::manual_seed(11);
  const Parallel parallel(Comm(strata::fake_process_group(0, 2), torch::kCPU), false);
  { const auto first = parallel.rank_random(true); }
  torch::Tensor second;
  {
    const auto scope = parallel.rank_random(true);
    second = torch::rand({8});
  }
  EXPECT_FALSE(torch::equal(second, in0));
  // No dropout, or off: nothing drawn, nothing changed.
  const auto [plain, plain_after] = draws_of(1, false);
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(plain, torch::rand({8})));
  EXPECT_FALSE(Parallel().rank_random(true).has_value());
}

TEST(TpPlanTest, UnevenAndChunkedShardsPutBackTogetherExactly) {
  // 3 chunks of 5 rows over 2 ranks: rank 0 holds rows 0-1 of each chunk, rank 1 rows 2-4.
  const auto full = torch::arange(15 * 2, torch::kFloat).view({15, 2});
  const Layout chunked{0, 3};
  std::vector<torch::Tensor> parts = {shard_of(full, chunked, 0, 2), shard_of(full, chunked, 1, 2)};
  EXPECT_EQ(parts[0].sizes(), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(shard_shape({15, 2}, chunked, 1, 2), (std::vector<int64_t>{9, 2}));
  EXPECT_TRUE(torch::equal(parts[0].narrow(0, 2, 2), full.narrow(0, 5, 2))) << "rank 0's rows of the second chunk";
  EXPECT_TRUE(torch::equal(unshard(parts, chunked), full));
  const Layout columns{1, 1};
  const auto wide = torch::arange(3 * 7, torch::kFloat).view({3, 7});
  std::vector<torch::Tensor> thirds;
  for (int r = 0; r < 3; ++r) thirds.push_back(shard_of(wide, columns, r, 3));
  EXPECT_EQ(thirds[0].size(1), 2);
  EXPECT_EQ(thirds[2].size(1), 3);
  EXPECT_TRUE(torch::equal(unshard(thirds, columns), wide));
}

TEST(TpPlanTest, VocabParallelCrossEntropyEqualsTheWholeOneWithItsGradient) {
  // Vocabulary 7 over 3 ranks (2, 2, 3 columns); ignored targets included.
  torch::manual_seed(3);
  auto logits = torch::randn({2, 4, 7}, torch::kDouble);
  const auto target = torch::tensor({{0, 6, -1, 3}, {2, 5, 4, -1}}, torch::kLong);
  // Sample 0 predicted exactly (its targets on ranks 0, 2 and 1), sample 1 not.
  for (int64_t t : {0, 1, 3}) logits[0][t][target[0][t].item<int64_t>()] += 10.0;
  auto whole = logits.clone().requires_grad_(true);
  const auto want = torch::nn::functional::cross_entropy(
      whole.reshape({-1, 7}), target.reshape({-1}), torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  want.backward();
  strata::run_thread_world(3, [&](Comm& comm) {
    const Parallel tp(comm, false);
    const auto [lo, hi] = split_range(7, comm.rank(), 3);
    auto mine = logits.narrow(2, lo, hi - lo).clone().requires_grad_(true);
    const auto got = vocab_parallel_cross_entropy(mine, target, tp, 7);
    EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-5);
    got.backward();
    EXPECT_TRUE(torch::allclose(mine.grad().to(torch::kDouble), whole.grad().narrow(2, lo, hi - lo), 1e-5, 1e-6))
        << "rank " << comm.rank();
    const strata::Batch batch{torch::zeros({2, 4}, torch::kLong), target};
    const auto v = vocab_parallel_validation(mine.detach(), batch, tp, 7);
    EXPECT_EQ(v.tokens, 6);
    EXPECT_NEAR(v.loss_sum, want.item<double>() * 6, 1e-5);
    const auto right = logits.argmax(-1).eq(target).logical_or(target.eq(-1)).all(1).sum().item<int64_t>();
    ASSERT_EQ(right, 1);
    EXPECT_EQ(v.correct_samples, right);
  });
}

}  // namespace
