#include "tests/builtin_strategies.h"
#include "strata/recipes/app/pipeline_plan.h"
#include "strata/recipes/app/planner.h"
#include "strata/recipes/models/gpt/spec.h"
#include "strata/trainer/memory.h"

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>

using namespace strata;
using namespace strata::recipes;

namespace {

GPTOptions nano() { return gpt_preset("gpt-nano").vocab_size(96).block_size(32); }

/// The planner asks a ModelConfig: these take the GPT's options.
PlanRequest plan(const GPTOptions& model, const std::string& strategy, int world) {
  return PlanRequest(gpt_model(model), strategy, world);
}
ActivationProfile probe_activations(const GPTOptions& model, int64_t micro_batch, Precision precision,
                                    const std::string& policy = "full") {
  return recipes::probe_activations(*gpt_model(model), micro_batch, precision, policy);
}
ActivationProfile estimate_activations(const GPTOptions& model, int64_t micro_batch, Precision precision,
                                       const std::string& policy = "full") {
  return recipes::estimate_activations(*gpt_model(model), micro_batch, precision, policy);
}

const strata::StrategyRegistry& builtins() { return strata::testing::builtin_strategies(); }

ModelStatePrediction predict_model_state(const PlanRequest& r) { return recipes::predict_model_state(builtins(), r); }
MemoryPrediction predict_peak(const PlanRequest& r, const ActivationProfile& a) {
  return recipes::predict_peak(builtins(), r, a);
}
std::vector<PlanChoice> plan_candidates(const PlanRequest& r, const ActivationProfile& a, int64_t budget) {
  return recipes::plan_candidates(builtins(), r, a, budget);
}

}  // namespace

TEST(PlannerTest, ModelStateFollowsTheZeroFormulas) {
  const auto model = nano();
  const int64_t p = count_parameters(model);
  const auto half = (p + 1) / 2;
  auto state = [&](const std::string& strategy, int world, const std::string& optimizer = "adamw") {
    return predict_model_state(plan(model, strategy, world).optimizer(optimizer));
  };
  EXPECT_EQ(state("single", 1).total(), 16 * p);
  EXPECT_EQ(state("ddp", 2).total(), 16 * p);
  EXPECT_EQ(state("oss", 2).params, 4 * p);
  EXPECT_EQ(state("oss", 2).grads, 4 * p);
  EXPECT_EQ(state("oss", 2).optimizer, 8 * half);
  EXPECT_EQ(state("sdp", 2).grads, 4 * half);
  EXPECT_EQ(state("sdp", 2).optimizer, 8 * half);
  EXPECT_EQ(state("fsdp", 2).total(), 16 * half);
  EXPECT_EQ(state("ddp", 2, "sgd").optimizer, 0);
  // SGD with momentum keeps one buffer per parameter.
  EXPECT_EQ(predict_model_state(plan(model, "ddp", 2).optimizer("sgd").momentum(0.9)).optimizer, 4 * p);
  EXPECT_EQ(predict_model_state(plan(model, "fsdp", 2).optimizer("sgd").momentum(0.9)).optimizer, 4 * half);
  EXPECT_EQ(predict_model_state(plan(model, "fsdp", 2).offload("disk")).total(), 0);
  // The other strategies offload their optimizer state only.
  const auto ddp_offloaded = predict_model_state(plan(model, "ddp", 2).offload("disk"));
  EXPECT_EQ(ddp_offloaded.optimizer, 0);
  EXPECT_EQ(ddp_offloaded.params + ddp_offloaded.grads, 8 * p);
  EXPECT_EQ(predict_model_state(plan(model, "sdp", 2).offload("disk")).grads, 4 * half);
  EXPECT_THROW(state("zero9", 2), c10::ValueError);
}

TEST(PlannerTest, LoraCountsOnlyTrainableParameters) {
  // t trainable adapters, f frozen: frozen parameters have no gradient,
  // state or staging; fsdp shards and gathers them (measured on gpt2 x2: README).
  const auto model = gpt_preset("gpt2").vocab_size(50257).block_size(64).lora_rank(4);
  const int64_t p = count_parameters(model), t = count_trainable_parameters(model), f = p - t;
  EXPECT_EQ(t, 12 * 4 * (768 + 3 * 768 + 768 + 768));  // attn.c_attn and attn.c_proj, rank 4
  auto state = [&](const std::string& s) { return predict_model_state(plan(model, s, 2)); };
  EXPECT_EQ(state("ddp").grads, 4 * t);
  EXPECT_EQ(state("ddp").optimizer, 8 * t);
  EXPECT_EQ(state("oss").params, 4 * p);
  EXPECT_EQ(state("oss").optimizer, 8 * (t / 2));
  EXPECT_EQ(state("sdp").grads, 4 * (t / 2));
  EXPECT_EQ(state("fsdp").params, 4 * (f / 2) + 4 * (t / 2));
  const ActivationProfile none;
  auto full = model;
  full.lora_rank(0);
  // fsdp gathers frozen blocks and root like full fine-tuning, without their
  // gradients (root 4 bytes, not 8; blocks' gradients the adapters' only).
  const int64_t block = 12 * 768 * 768 + 13 * 768, root = 50257 * 768 + 64 * 768 + 2 * 768;
  EXPECT_EQ(predict_peak(plan(full, "fsdp", 2), none).gathered, 8 * root + block * (2 * 4 + 4 + 8));
  EXPECT_EQ(predict_peak(plan(model, "fsdp", 2), none).gathered,
            4 * root + (block + t / 12) * 2 * 4 + (t / 12) * (4 + 8));
  EXPECT_LT(predict_peak(plan(model, "oss", 2), none).overhead,
            predict_peak(plan(full, "oss", 2), none).overhead / 100);
}

TEST(PlannerTest, ActivationTotalScalesWithLayersAndCheckpointing) {
  ActivationProfile a;
  a.per_block = 1000;
  a.base = 500;
  a.checkpointed_per_block = 100;
  a.checkpointed_base = 2000;
  EXPECT_EQ(a.total(4, 0), 500 + 4 * 1000);
  // Every block checkpointed: 4 inputs kept, the checkpointed peak once.
  EXPECT_EQ(a.total(4, 1), 2000 + 4 * 100);
  // Every 2nd block (0 and 2): two kept whole, two inputs.
  EXPECT_EQ(a.total(4, 2), 2000 + 2 * 1000 + 2 * 100);
}

TEST(PlannerTest, AutoPicksTheFastestStrategyThatFits) {
  const auto base = plan(gpt_preset("gpt-mini").vocab_size(96).block_size(64), "ddp", 2).micro_batch(4);
  ActivationProfile a;
  a.per_block = 4 << 20;
  a.base = 2 << 20;
  a.checkpointed_per_block = 256 << 10;
  a.checkpointed_base = 8 << 20;
  const auto all = plan_candidates(base, a, int64_t(1) << 40);
  // ddp, oss, sdp, fsdp, sdp+offload-disk, fsdp+ac, single+tp2, single+ac+tp2, fsdp+offload-disk.
  ASSERT_EQ(all.size(), 9u);
  std::vector<int64_t> peaks;
  for (const auto& c : all) peaks.push_back(c.prediction.peak());
  EXPECT_EQ(all[*pick_fastest_fitting(all)].label, "ddp");
  // fsdp's gathered units can cost more than sdp saves on a small model, so
  // memory is not monotonic in the speed order: at a budget equal to
  // candidate i's peak, the pick is the first candidate whose peak is <= it.
  for (size_t i = 0; i < all.size(); ++i) {
    const auto rows = plan_candidates(base, a, peaks[i]);
    const auto pick = pick_fastest_fitting(rows);
    ASSERT_TRUE(pick.has_value()) << all[i].label;
    size_t expected = 0;
    while (peaks[expected] > peaks[i]) ++expected;
    EXPECT_EQ(rows[*pick].label, all[expected].label) << "budget " << peaks[i];
    EXPECT_LE(rows[*pick].prediction.peak(), peaks[i]);
  }
  EXPECT_EQ(all[*pick_fastest_fitting(plan_candidates(base, a, peaks[0] - 1))].label == "ddp", false);
  const int64_t smallest = *std::min_element(peaks.begin(), peaks.end());
  EXPECT_EQ(all.back().prediction.peak(), smallest) << "offload is the last resort and the smallest";
  EXPECT_FALSE(pick_fastest_fitting(plan_candidates(base, a, smallest - 1)).has_value());
  const auto table = format_plan_table(all, int64_t(1) << 40);
  EXPECT_NE(table.find("fsdp+ac"), std::string::npos) << table;
  EXPECT_NE(table.find("fits?"), std::string::npos) << table;
}

TEST(PlannerTest, AutoConsidersTensorParallelismWhereItFits) {
  // Wide blocks and short sequences: fsdp's gathered block dominates its
  // peak, and tensor parallelism gathers half of it.
  const auto model = gpt_preset("gpt-mini").n_embd(768).n_head(12).n_layer(8).vocab_size(96).block_size(8);
  const auto base = plan(model, "ddp", 4).micro_batch(1);
  ActivationProfile a;
  a.per_block = 64 << 10;
  a.base = 256 << 10;
  a.checkpointed_per_block = 16 << 10;
  a.checkpointed_base = 128 << 10;
  const auto all = plan_candidates(base, a, int64_t(1) << 40);
  std::vector<std::string> labels;
  for (const auto& c : all) labels.push_back(c.label);
  auto at = [&](const std::string& label) {
    return static_cast<size_t>(std::find(labels.begin(), labels.end(), label) - labels.begin());
  };
  // fsdp over 2 data-parallel ranks x tp 2; pure tp 4 (single); never fsdp x
  // tp 4 (one data-parallel rank, fewer than fsdp's 2).
  ASSERT_LT(at("fsdp+tp2"), all.size());
  ASSERT_LT(at("single+tp4"), all.size());
  EXPECT_EQ(at("fsdp+tp4"), all.size());
  EXPECT_EQ(at("single+tp2"), all.size()) << "single runs over one data-parallel rank";
  EXPECT_LT(at("fsdp+ac"), at("fsdp+tp2"));
  EXPECT_LT(at("fsdp+tp2"), at("single+tp4")) << "less tensor parallelism first";
  EXPECT_LT(at("single+ac+tp4"), at("fsdp+offload-disk"));
  const auto& tp = all[at("fsdp+tp2")];
  EXPECT_EQ(tp.request.tp_size(), 2);
  EXPECT_EQ(tp.request.world_size(), 2);
  EXPECT_EQ(tp.request.micro_batch(), 2) << "the global batch stays 4";
  EXPECT_TRUE(tp.request.sequence_parallel());
  // Below every candidate before it, so at its own peak it is the pick.
  for (size_t i = 0; i < at("fsdp+tp2"); ++i) {
    EXPECT_GT(all[i].prediction.peak(), tp.prediction.peak()) << all[i].label;
  }
  const auto rows = plan_candidates(base, a, tp.prediction.peak());
  EXPECT_EQ(rows[*pick_fastest_fitting(rows)].label, "fsdp+tp2");
  // A model whose heads do not split gets no tensor-parallel candidate.
  auto three_heads = model;
  three_heads.n_head(3);
  for (const auto& c : plan_candidates(plan(three_heads, "ddp", 4), a, int64_t(1) << 40)) {
    EXPECT_EQ(c.request.tp_size(), 1) << c.label;
  }
}

TEST(PlannerTest, APipelineRanksStagesHoldTheirBlocksAndTheTiedWeightOnEachEnd) {
  // gpt-nano with 4 blocks (tied wte) in 2 stages of 2: each rank holds its
  // blocks, the first the embeddings, the last the final norm and the tied
  // head, so the two ranks hold the whole model plus one more wte.
  const auto model = gpt_model(nano().n_layer(4));
  RunConfig c;
  c.pp_size = 2;
  c.pp_split = "2,2";
  c.accumulate_grad_batches = 4;
  const auto layout = pipeline_layout(c, *model);
  ASSERT_EQ(layout.ranks.size(), 2u);
  const int64_t wte = 96 * 48, wpe = 32 * 48;
  EXPECT_EQ(layout.ranks[0].params + layout.ranks[1].params, model->parameters() + wte);
  EXPECT_EQ(layout.ranks[0].params - layout.ranks[1].params, wpe - 2 * 48) << "wpe against ln_f's weight and bias";
  EXPECT_EQ(layout.held[0], "stage 0: blocks 0..1 + embedding");
  // --strategy auto over each stage's 2 ranks: every row is its fullest
  // rank's (the last here: the head's activations), and ddp holds 16 bytes
  // per parameter of that rank's stages.
  ActivationProfile a;
  a.per_block = 1 << 20;
  a.base = 4 << 20;
  a.checkpointed_per_block = 1 << 18;
  a.checkpointed_base = 2 << 20;
  const auto rows = plan_pipeline_candidates(builtins(), plan(nano().n_layer(4), "", 2).micro_batch(1), c, layout, a,
                                             int64_t(1) << 40);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.front().label, "ddp");
  const int fullest = rows.front().peak_at == "pp rank 1" ? 1 : 0;
  EXPECT_EQ(rows.front().prediction.state.total(), 16 * layout.ranks[size_t(fullest)].params);
  for (const auto& row : rows) {
    EXPECT_NE(row.label, "fsdp+offload-disk") << "not composed with a pipeline: never offered";
    const auto peaks = predict_stage_peaks(builtins(), row.request, layout, a);
    ASSERT_TRUE(peaks.has_value()) << row.label;
    EXPECT_EQ(row.prediction.peak(), std::max((*peaks)[0].peak(), (*peaks)[1].peak())) << row.label;
    EXPECT_EQ(row.peak_at.rfind("pp rank ", 0), 0u) << row.label;
  }
}

TEST(PlannerTest, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("4GiB"), int64_t(4) << 30);
  EXPECT_EQ(parse_byte_size("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("512m"), int64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("1.5G"), int64_t(3) << 29);
  EXPECT_EQ(parse_byte_size("2GB"), int64_t(2000000000));
  EXPECT_EQ(parse_byte_size("1000"), 1000);
  for (const char* bad : {"", "abc", "-1", "4XB", "0", "1.2.3G", "GiB"}) {
    EXPECT_THROW(parse_byte_size(bad), c10::ValueError) << bad;
  }
}

TEST(PlannerTest, ProbeMeasuresBlocksThatScaleWithTheBatch) {
  const auto model = gpt_preset("gpt-micro").vocab_size(96).block_size(64);
  const auto small = probe_activations(model, 2, Precision::kFp32);
  const auto large = probe_activations(model, 4, Precision::kFp32);
  ASSERT_TRUE(small.measured);
  EXPECT_GT(small.per_block, 0);
  EXPECT_GT(small.base, 0);
  // Activations are linear in the batch (to allocator-independent exactness
  // up to small per-call buffers).
  EXPECT_NEAR(double(large.per_block) / double(small.per_block), 2.0, 0.1);
  // The formula the planner falls back to for big probes stays within 35%.
  const auto formula = estimate_activations(model, 4, Precision::kFp32);
  std::cout << "probe per_block " << large.per_block << " base " << large.base << " | formula per_block "
            << formula.per_block << " base " << formula.base << "\n";
  EXPECT_NEAR(double(formula.per_block) / double(large.per_block), 1.0, 0.35);
  EXPECT_NEAR(double(formula.total(4, 0)) / double(large.total(4, 0)), 1.0, 0.35);
  // Checkpointing every block keeps less than keeping every block.
  EXPECT_LT(large.total(4, 1), large.total(4, 0));
  EXPECT_GT(large.checkpointed_per_block, 0);
  EXPECT_LT(large.checkpointed_per_block, large.per_block);
}

TEST(PlannerTest, SelectivePoliciesAreProbedWithWhatTheyKeep) {
  // A checkpointed block keeps its input under "full", attention's output
  // besides under "attention", and the c_attn and c_fc outputs besides under
  // "op": the probe measures each, and the formula follows it within 35%.
  const auto model = gpt_preset("gpt-micro").vocab_size(96).block_size(64);
  int64_t previous = 0;
  for (const std::string policy : {"full", "attention", "op"}) {
    SCOPED_TRACE(policy);
    const auto probe = probe_activations(model, 4, Precision::kFp32, policy);
    const auto formula = estimate_activations(model, 4, Precision::kFp32, policy);
    std::cout << policy << ": probe checkpointed_per_block " << probe.checkpointed_per_block << " | formula "
              << formula.checkpointed_per_block << "\n";
    EXPECT_GT(probe.checkpointed_per_block, previous);
    EXPECT_LT(probe.checkpointed_per_block, probe.per_block);
    EXPECT_NEAR(double(formula.checkpointed_per_block) / double(probe.checkpointed_per_block), 1.0, 0.35);
    previous = probe.checkpointed_per_block;
  }
  EXPECT_THROW(probe_activations(model, 4, Precision::kFp32, "most"), c10::ValueError);
}

TEST(PlannerTest, Fp32AlternativeSaysWhatFitsInFp32) {
  // bf16-mixed on a CPU where bf16 multiplies slower: the line names fp32's
  // pick under the same budget, or says that fp32 fits nowhere.
  const auto base = plan(gpt_preset("gpt-mini").vocab_size(96).block_size(64), "", 2)
                        .micro_batch(4)
                        .precision(Precision::kBf16Mixed);
  ActivationProfile a;
  a.per_block = 4 << 20;
  a.base = 2 << 20;
  a.checkpointed_per_block = 256 << 10;
  a.checkpointed_base = 8 << 20;
  PlanRequest fp32 = base;
  fp32.precision(Precision::kFp32);
  const auto rows = plan_candidates(fp32, a, int64_t(1) << 40);
  const int64_t ddp_peak = rows[*pick_fastest_fitting(rows)].prediction.peak();
  const std::string roomy = fp32_alternative(builtins(), base, a, int64_t(1) << 40, 9.84);
  EXPECT_NE(roomy.find("run 9.8x slower than fp32's"), std::string::npos) << roomy;
  EXPECT_NE(roomy.find("in fp32 the planner picks ddp (peak " + strata::format_bytes(ddp_peak)), std::string::npos) << roomy;
  EXPECT_NE(roomy.find("--precision 32 trains faster here"), std::string::npos) << roomy;
  // Just below ddp's fp32 peak, the pick is the next strategy that fits.
  const std::string tighter = fp32_alternative(builtins(), base, a, ddp_peak - 1, 9.84);
  EXPECT_EQ(tighter.find("picks ddp "), std::string::npos) << tighter;
  EXPECT_NE(tighter.find("in fp32 the planner picks "), std::string::npos) << tighter;
  const std::string none = fp32_alternative(builtins(), base, a, 1024, 9.84);
  EXPECT_NE(none.find("in fp32 nothing is predicted to fit 1.0 KiB per rank"), std::string::npos) << none;
}
