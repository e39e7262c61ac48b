// fsdp_mixed_precision_test - FSDP's MixedPrecision-style options, ranks as
// threads: param_dtype bf16 all-gathers half the bytes and matches
// single-process bf16-mixed training; reduce_dtype bf16 reduce-scatters half
// the bytes and still trains.
#include "tests/strategies/fsdp/fsdp_harness.h"

#include <gtest/gtest.h>

namespace {
using strata::CollectiveKind;
using strata::FSDPOptions;
using namespace strata::testing;

/// Bytes this rank's Comm sent during step 2 per collective kind, and every
/// step's loss.
class StepRecorder : public strata::Callback {
 public:
  std::string name() const override { return "StepRecorder"; }
  void on_train_batch_start(strata::Trainer& t, strata::TrainingModule&, int64_t step) override {
    if (step == 2) before = t.strategy().comm().bytes();
  }
  void on_train_batch_end(strata::Trainer& t, strata::TrainingModule&, const strata::StepMetrics& m) override {
    if (m.step == 2) after = t.strategy().comm().bytes();
    losses.push_back(m.loss);
  }
  int64_t sent(CollectiveKind kind) const { return after[kind] - before[kind]; }
  strata::CommBytes before, after;
  std::vector<double> losses;
};

struct Run {
  std::vector<Trained> ranks;
  std::shared_ptr<StepRecorder> rank0;
};

Run run_bf16_mixed(FSDPOptions options, int64_t steps, int world = 2) {
  auto recorder = std::make_shared<StepRecorder>();
  FsdpRun run;
  run.world = world;
  run.options = options;
  run.callbacks = [&](int rank) {
    std::vector<std::shared_ptr<strata::Callback>> out;
    if (rank == 0) out.push_back(recorder);
    return out;
  };
  auto trainer_options = fsdp_test_options(2, 1, 0.0, steps).precision(strata::Precision::kBf16Mixed);
  return {train_fsdp(gpt_nano(), trainer_options, run), recorder};
}

TEST(FsdpMixedPrecisionTest, Bf16ParamDtypeHalvesAllGatherBytesAndMatchesSingleProcess) {
  const int64_t steps = 4;
  const auto fp32 = run_bf16_mixed(FSDPOptions(), steps);
  const auto bf16 = run_bf16_mixed(FSDPOptions().param_dtype(torch::kBFloat16), steps);
  const int64_t ag32 = fp32.rank0->sent(CollectiveKind::kAllGather);
  const int64_t ag16 = bf16.rank0->sent(CollectiveKind::kAllGather);
  const int64_t rs32 = fp32.rank0->sent(CollectiveKind::kReduceScatter);
  const int64_t rs16 = bf16.rank0->sent(CollectiveKind::kReduceScatter);
  std::cout << "[ fsdp bf16 ] step 2, rank 0: all-gather " << ag32 << " B (fp32) -> " << ag16
            << " B (bf16); reduce-scatter " << rs32 << " B -> " << rs16 << " B (reduce_dtype fp32)\n";
  ASSERT_GT(ag32, 0);
  EXPECT_EQ(2 * ag16, ag32);
  EXPECT_EQ(rs16, rs32);  // gradients still reduced in fp32 by default

  // Against single-process bf16-mixed on the same global batch: autocast
  // casts the weights of matmuls to bf16 anyway (the same values a bf16
  // gather gives); other ops see bf16-rounded weights. fsdp_test's bf16
  // tolerance.
  const auto reference = train_single(gpt_nano(), fsdp_test_options(4, 1, 0.0, steps).precision(strata::Precision::kBf16Mixed));
  const double diff = max_param_diff(reference.params, bf16.ranks[0].params);
  std::cout << "[ fsdp bf16 ] max |param - single-process| after " << steps << " steps: " << diff << "\n";
  EXPECT_LE(diff, 5e-3);
  const double relative = relative_update_error(clone_params(*gpt_nano()()), reference.params, bf16.ranks[0].params);
  std::cout << "[ fsdp bf16 ] relative update error " << relative << "\n";
  EXPECT_LE(relative, 0.1);
  // The master shards are fp32 and summon_full_params gathers them exactly.
  for (const auto& p : bf16.ranks[0].params) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
}

TEST(FsdpMixedPrecisionTest, Bf16ReduceDtypeHalvesReduceScatterBytesAndStillTrains) {
  const int64_t steps = 8;
  const auto fp32 = run_bf16_mixed(FSDPOptions().param_dtype(torch::kBFloat16), steps);
  const auto bf16 = run_bf16_mixed(FSDPOptions().param_dtype(torch::kBFloat16).reduce_dtype(torch::kBFloat16), steps);
  const int64_t rs32 = fp32.rank0->sent(CollectiveKind::kReduceScatter);
  const int64_t rs16 = bf16.rank0->sent(CollectiveKind::kReduceScatter);
  std::cout << "[ fsdp bf16 ] reduce-scatter " << rs32 << " B (fp32) -> " << rs16 << " B (bf16)\n";
  ASSERT_GT(rs32, 0);
  EXPECT_EQ(2 * rs16, rs32);
  const auto& losses = bf16.rank0->losses;
  ASSERT_EQ(losses.size(), static_cast<size_t>(steps));
  std::cout << "[ fsdp bf16 ] reduce_dtype bf16 loss: step 1 " << losses.front() << ", step " << steps
            << " " << losses.back() << "\n";
  EXPECT_LT(losses.back(), losses.front());
  // Close to the fp32 reduction (bf16 sums of two ranks' gradients).
  EXPECT_LE(max_param_diff(fp32.ranks[0].params, bf16.ranks[0].params), 5e-3);
}

TEST(FsdpMixedPrecisionTest, HybridShardReducesInBf16InsideTheNodeAndInFp32AcrossNodes) {
  // World 4 as 2 nodes of 2: the reduce-scatter inside the node runs in bf16
  // (half the bytes), the replicate all-reduce on the upcast fp32 shard
  // gradient (Gloo cannot sum bf16); training matches the fp32 reduction.
  const int64_t steps = 6;
  const auto hybrid = FSDPOptions()
                          .sharding_strategy(strata::ShardingStrategy::kHybridShard)
                          .node_size(2)
                          .param_dtype(torch::kBFloat16);
  auto bf16_options = hybrid;
  bf16_options.reduce_dtype(torch::kBFloat16);
  const auto fp32 = run_bf16_mixed(hybrid, steps, 4);
  const auto bf16 = run_bf16_mixed(bf16_options, steps, 4);
  const int64_t rs32 = fp32.rank0->sent(CollectiveKind::kReduceScatter);
  const int64_t rs16 = bf16.rank0->sent(CollectiveKind::kReduceScatter);
  ASSERT_GT(rs32, 0);
  EXPECT_EQ(2 * rs16, rs32);
  EXPECT_EQ(bf16.rank0->sent(CollectiveKind::kAllReduce), fp32.rank0->sent(CollectiveKind::kAllReduce));
  EXPECT_LT(bf16.rank0->losses.back(), bf16.rank0->losses.front());
  EXPECT_LE(max_param_diff(fp32.ranks[0].params, bf16.ranks[0].params), 5e-3);
}

TEST(FsdpMixedPrecisionTest, CommMovesBf16ThroughGlooBitExact) {
  // Gloo has no bfloat16: Comm sends bf16 as fp16 bit patterns. The gather
  // must return every rank's values bit for bit, and the reduce-scatter the
  // bf16 sum (values chosen so that bf16 sums are exact).
  strata::run_thread_world(3, [](strata::Comm& comm) {
    const auto r = static_cast<double>(comm.rank());
    auto mine = (torch::arange(4, torch::kFloat32) * 0.0625 + r + 1.0 / 3.0).to(torch::kBFloat16);
    auto gathered = torch::empty({12}, mine.options());
    comm.all_gather_into(gathered, mine);
    for (int k = 0; k < 3; ++k) {
      auto want = (torch::arange(4, torch::kFloat32) * 0.0625 + k + 1.0 / 3.0).to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(gathered.narrow(0, 4 * k, 4), want)) << "rank " << comm.rank() << " chunk " << k;
    }
    auto input = torch::full({6}, r + 1.0, torch::kBFloat16);
    auto output = torch::empty({2}, input.options());
    comm.reduce_scatter(output, input);
    EXPECT_EQ(output.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(output, torch::full({2}, 6.0, torch::kBFloat16))) << output;
  }, std::chrono::seconds(10));
}

}  // namespace

namespace {

/// Peak tensor bytes (this process: both thread-ranks) of a few FSDP steps
/// under bf16-mixed on a model whose parameters dwarf its activations.
int64_t peak_bytes_of_bf16_mixed_run(c10::optional<torch::ScalarType> param_dtype) {
  const ModuleFactory wide = [] {
    torch::manual_seed(11);
    return std::make_unique<strata::recipes::GPTModule>(
        strata::recipes::gpt_preset("gpt-nano").n_layer(6).n_embd(96).vocab_size(16).block_size(8).bias(false));
  };
  FsdpRun run;
  run.options.param_dtype(param_dtype);
  strata::MemoryTracker memory;
  train_fsdp(wide, fsdp_test_options(2, 1, 0.0, 2).precision(strata::Precision::kBf16Mixed), run);
  return memory.peak_bytes();
}

}  // namespace

TEST(FsdpMixedPrecisionTest, Bf16UnitsComputeInBf16WithoutAutocastCopiesOfEveryUnit) {
  // Under CPU autocast a fp32 parameter is cast to bf16 for each matmul, and
  // that copy lives until the op's backward (and in autocast's cache until
  // the forward ends): with fp32 units, every unit's bf16 copy would be alive
  // at the end of the forward, reshard or not. With param_dtype bf16 the
  // units are gathered into bf16 buffers that the parameters view (FSDP frees
  // them after forward and gathers them again for backward), so nothing else
  // is cast: the peak must be lower by at least the bf16 copies of the units
  // (6 blocks x 12 x 96^2 x 2 bytes x 2 ranks, ~2.6 MB) minus the two bf16
  // units at most gathered at once.
  const int64_t fp32 = peak_bytes_of_bf16_mixed_run(c10::nullopt);
  const int64_t bf16 = peak_bytes_of_bf16_mixed_run(torch::kBFloat16);
  std::cout << "[ fsdp bf16 ] peak tensor bytes, 2 thread-ranks: fp32 units " << fp32 << ", bf16 units " << bf16 << "\n";
  const int64_t unit_bf16 = 12 * 96 * 96 * 2;
  EXPECT_GE(fp32 - bf16, 2 * (6 - 2) * unit_bf16);
}
