// bench_test - Unit tests for bench/harness.cpp and bench/report.cpp (the pure
// logic; strata-gpt subprocesses run only in the bench_smoke_gate ctest).
#include "tests/builtin_models.h"
#include "tests/error_text.h"
#include "tests/builtin_strategies.h"
#include "strata/bench/charts.h"
#include "strata/bench/gate.h"
#include "strata/bench/harness.h"
#include "strata/bench/peer_suite.h"
#include "strata/bench/report.h"
#include "strata/bench/sweep.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/llama/spec.h"
#include "strata/strategies/registry.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace strata::bench;
namespace fs = std::filesystem;

const strata::StrategyRegistry& builtins() { return strata::testing::builtin_strategies(); }
const strata::recipes::ModelRegistry& models() { return strata::testing::builtin_models(); }

/// A summary.json as strata-gpt writes it, with 2 ranks.
nlohmann::json fake_summary(double tokens_per_s, int64_t peak0, int64_t peak1, int64_t parameters = 1000,
                            const std::string& strategy = "ddp") {
  return {{"strategy", strategy},
          {"world_size", 2},
          {"parameters", parameters},
          {"steps", 10},
          {"tokens_per_s", tokens_per_s},
          {"mfu", 0.5},
          {"peak_flops_per_rank", 1e11},
          {"peak_tensor_bytes", {peak0, peak1}},
          {"model_state_bytes",
           {{{"params", 4000}, {"grads", 4000}, {"optimizer", 8000}},
            {{"params", 4000}, {"grads", 4000}, {"optimizer", 8004}}}},
          {"comm_bytes_rank0", {{"all_reduce", 900}, {"broadcast", 100}, {"reduce", 0}}}};
}

/// `summary` with strata-gpt's per-rank prediction of the strategy's memory
/// model (its model state: params, grads, optimizer bytes).
nlohmann::json with_prediction(nlohmann::json summary, int64_t params, int64_t grads, int64_t optimizer) {
  summary["per_rank"] = nlohmann::json::array();
  for (int r = 0; r < summary.at("world_size").get<int>(); ++r) {
    summary["per_rank"].push_back(
        {{"rank", r}, {"predicted", {{"params", params}, {"grads", grads}, {"optimizer", optimizer}}}});
  }
  return summary;
}

BenchCase make_case(const std::string& name, const std::string& strategy = "ddp", const std::string& reference = "") {
  BenchCase c;
  c.name = name;
  c.suite = name.substr(0, name.find('/'));
  c.strategy = strategy;
  c.nproc = 2;
  c.reference = reference;
  return c;
}

TEST(BenchTest, StateVersusTheStrategysMemoryModel) {
  // The report divides measured model state by what strata-gpt's summary says
  // the strategy's memory model predicts (per rank "predicted"); none: "–".
  const BenchCase c = make_case("zero/gpt-mini/ddp-2x1");
  auto summary = fake_summary(100, 10, 20);
  const std::string none = render_markdown({Suite{"zero", "", {c}}}, {aggregate(c, {summary})}, ReportHeader());
  EXPECT_NE(none.find("| 0.02 MiB | – |"), std::string::npos) << none;
  summary = with_prediction(summary, 4000, 4000, 8000);
  const std::string md = render_markdown({Suite{"zero", "", {c}}}, {aggregate(c, {summary})}, ReportHeader());
  EXPECT_NE(md.find("| 1.000 ✓ |"), std::string::npos) << md;  // 16004 ÷ 16000
  CaseRun run;
  run.bench_case = &c;
  run.summary = summary;
  EXPECT_DOUBLE_EQ(run_record(run, ReportHeader()).at("model_state_formula_bytes").get<double>(), 16000.0);
}

TEST(BenchTest, StatsMedianMinMax) {
  const Stats odd = compute_stats({3.0, 1.0, 2.0});
  EXPECT_DOUBLE_EQ(odd.median, 2.0);
  EXPECT_DOUBLE_EQ(odd.min, 1.0);
  EXPECT_DOUBLE_EQ(odd.max, 3.0);
  const Stats even = compute_stats({4.0, 1.0, 10.0, 2.0});
  EXPECT_DOUBLE_EQ(even.median, 3.0);
  EXPECT_DOUBLE_EQ(compute_stats({7.0}).median, 7.0);
  EXPECT_THROW(compute_stats({}), c10::Error);
}

TEST(BenchTest, AggregateTakesMedianAndExactMemory) {
  const BenchCase c = make_case("zero/gpt-mini/ddp-2x1");
  const CaseResult r = aggregate(c, {fake_summary(300, 10, 20), fake_summary(100, 10, 20), fake_summary(200, 10, 20)});
  EXPECT_EQ(r.runs, 3);
  EXPECT_DOUBLE_EQ(r.tokens_per_s.median, 200);
  EXPECT_DOUBLE_EQ(r.tokens_per_s.min, 100);
  EXPECT_EQ(r.peak_tensor_bytes_max, 20);
  EXPECT_EQ(r.model_state_bytes_max, 16004);  // the larger rank
  EXPECT_EQ(r.peak_tensor_bytes_min, 20);
  EXPECT_EQ(r.model_state_bytes_min, 16004);
  EXPECT_DOUBLE_EQ(r.comm_bytes_per_step, 100.0);  // (900 + 100) / 10 steps
  const CaseResult varied = aggregate(c, {fake_summary(1, 10, 20), fake_summary(1, 10, 21)});
  EXPECT_EQ(varied.peak_tensor_bytes_min, 20);
  EXPECT_EQ(varied.peak_tensor_bytes_max, 21);
  ReportHeader header;
  const std::string md = render_markdown({Suite{"zero", "", {c}}}, {varied}, header);
  EXPECT_NE(md.find("0.00 MiB * |"), std::string::npos) << md;  // the peak cell is flagged
  EXPECT_NE(md.find("zero/gpt-mini/ddp-2x1: peak tensor bytes 20–21"), std::string::npos) << md;
}

TEST(BenchTest, AggregateReportsBackwardAndGradSyncWaitMedians) {
  const BenchCase c = make_case("ddp/gpt-mini/ddp-2x1");
  std::vector<nlohmann::json> runs;
  for (double wait : {0.004, 0.001, 0.002}) {
    auto s = fake_summary(100, 10, 20);
    s["backward_s_per_step"] = 0.1 + wait;
    s["grad_sync_s_per_step"] = wait;
    runs.push_back(s);
  }
  const CaseResult r = aggregate(c, runs);
  EXPECT_DOUBLE_EQ(r.grad_sync_s_per_step, 0.002);
  EXPECT_DOUBLE_EQ(r.backward_s_per_step, 0.102);
  const std::string md = render_markdown({Suite{"ddp", "", {c}}}, {r}, ReportHeader());
  EXPECT_NE(md.find("| 102.0 | 2.0 |"), std::string::npos) << md;
  // Older summaries without the fields aggregate to 0.
  EXPECT_DOUBLE_EQ(aggregate(c, {fake_summary(1, 1, 1)}).grad_sync_s_per_step, 0.0);
}

TEST(BenchTest, SelectSuitesAndErrors) {
  const auto suites = select_suites("zero,smoke");
  ASSERT_EQ(suites.size(), 2u);
  EXPECT_EQ(suites[0].name, "zero");
  EXPECT_EQ(suites[1].name, "smoke");
  // Case names are unique across all suites, and references name existing cases.
  const auto cases =
      all_cases(select_suites("single,ddp,oss,sdp,fsdp,zero,memory,smoke,attention,kernels,scale,planner,peer"));
  std::vector<std::string> names;
  for (const auto& c : cases) names.push_back(c.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  for (const auto& c : cases) {
    if (!c.reference.empty()) {
      EXPECT_TRUE(std::binary_search(names.begin(), names.end(), c.reference)) << c.name;
    }
  }

  try {
    select_suites("zero,fast");
    FAIL() << "unknown suite accepted";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("'fast'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("single, ddp, oss, sdp, fsdp, zero, memory, smoke, attention, kernels, scale"), std::string::npos)
        << msg;
  }
  EXPECT_THROW(select_suites("zero,zero"), c10::ValueError);
  EXPECT_THROW(select_suites(""), c10::ValueError);
  EXPECT_THROW(select_suites("smoke,"), c10::ValueError);
}

TEST(BenchTest, DdpSuiteKeepsTheGlobalBatch) {
  // The reference strategy's suite compares it with one process at the same
  // global batch on the same cores.
  const auto suites = select_suites("ddp");
  std::map<std::string, int64_t> global_batch;  // per preset
  for (const auto& c : suites.at(0).cases) {
    const int64_t global = c.batch_size * c.nproc;
    EXPECT_EQ(global_batch.emplace(c.preset, global).first->second, global) << c.name;
    EXPECT_EQ(c.nproc * c.threads_per_rank, 2) << c.name;  // same cores
  }
  EXPECT_EQ(global_batch.size(), 2u);
}

TEST(BenchTest, GptCommandCarriesTheCase) {
  BenchCase c = make_case("ddp/gpt-micro/ddp-2x1-1mib-after-bw");
  c.block_size = 128;
  c.extra = {"--overlap-comm", "false"};
  const auto cmd = gpt_command(c, "/bin/strata-gpt", "/tmp/w/generated.txt", "/tmp/w/out");
  auto value_of = [&](const std::string& flag) {
    auto it = std::find(cmd.begin(), cmd.end(), flag);
    return it == cmd.end() || it + 1 == cmd.end() ? std::string("<absent>") : *(it + 1);
  };
  EXPECT_EQ(cmd.front(), "/bin/strata-gpt");
  EXPECT_EQ(value_of("--strategy"), "ddp");
  EXPECT_EQ(value_of("--nproc"), "2");
  EXPECT_EQ(value_of("--data"), "/tmp/w/generated.txt");
  EXPECT_EQ(value_of("--block-size"), "128");
  EXPECT_EQ(value_of("--output-dir"), "/tmp/w/out");
  EXPECT_EQ(value_of("--overlap-comm"), "false");
  EXPECT_EQ(value_of("--preset"), c.preset);
  // Shared weights in a transformers directory name the model themselves.
  c.shared_init = true;
  c.shared_init_format = "hf";
  const auto from_dir = gpt_command(c, "g", "generated.txt", "o");
  EXPECT_EQ(std::find(from_dir.begin(), from_dir.end(), "--preset"), from_dir.end());
  c.shared_init = false;
  c.data = "addition";  // anything but the generated text is passed through
  const auto addition = gpt_command(c, "g", "generated.txt", "o");
  EXPECT_NE(std::find(addition.begin(), addition.end(), "addition"), addition.end());
  EXPECT_EQ(std::find(addition.begin(), addition.end(), "generated.txt"), addition.end());
}

TEST(BenchTest, PeerCommandMapsStrategiesToPyTorchModes) {
  BenchCase c = make_case("peer/gpt-mini-384/oss-2x1-fp32/pytorch-eager", "oss");
  c.preset = "gpt-mini";
  c.program = "peer";
  c.block_size = 256;
  c.model_flags = {"--n-embd", "384"};
  c.extra = {"--activation-checkpointing", "1"};
  EXPECT_THROW(peer_command(c, "p", "s", "d", "o"), c10::ValueError);  // the case names no peer mode
  c.peer_mode = "ZeroRedundancyOptimizer";
  const auto cmd2 = peer_command(c, "/venv/bin/python", "/src/bench/peers/gpt_peer.py", "/w/text", "/w/out");
  auto value2 = [&](const std::string& flag) {
    auto it = std::find(cmd2.begin(), cmd2.end(), flag);
    return it == cmd2.end() || it + 1 == cmd2.end() ? std::string("<absent>") : *(it + 1);
  };
  EXPECT_EQ(cmd2[0], "/venv/bin/python");
  EXPECT_EQ(cmd2[1], "/src/bench/peers/gpt_peer.py");
  EXPECT_EQ(value2("--mode"), "ZeroRedundancyOptimizer");
  EXPECT_EQ(value2("--nproc"), "2");
  EXPECT_EQ(value2("--data"), "/w/text");
  EXPECT_EQ(value2("--output-dir"), "/w/out");
  EXPECT_EQ(value2("--n-embd"), "384");
  // The suite takes the mode from each spec; one without (sdp: PyTorch has no
  // ZeRO-2 of its own) is left out.
  std::map<std::string, std::string> modes;
  for (const auto& pc : peer_suite(builtins(), models()).cases) {
    if (pc.program == "peer") modes[pc.strategy] = pc.peer_mode;
  }
  EXPECT_EQ(modes, (std::map<std::string, std::string>{{"ddp", "DistributedDataParallel"},
                                                       {"fsdp", "fully_shard"},
                                                       {"oss", "ZeroRedundancyOptimizer"},
                                                       {"single", "local"}}));
  // The initial weights depend on the model's shape only.
  EXPECT_EQ(model_shape_flags(c),
            (std::vector<std::string>{"--preset", "gpt-mini", "--block-size", "256", "--n-embd", "384"}));
  // The Llama jobs run transformers' LlamaForCausalLM from one transformers
  // directory (DDP and FSDP2, as its users do; no ZeRO-1 job).
  std::map<std::string, std::string> llama;
  for (const auto& pc : peer_suite(builtins(), models()).cases) {
    if (pc.preset != "llama-mini") continue;
    EXPECT_EQ(pc.shared_init_format, "hf") << pc.name;
    if (pc.program == "peer") llama[pc.strategy] = pc.peer_mode;
  }
  EXPECT_EQ(llama, (std::map<std::string, std::string>{
                       {"ddp", "DistributedDataParallel"}, {"fsdp", "fully_shard"}, {"single", "local"}}));
}

TEST(BenchTest, PeerSuiteComparesWithTheFasterPyTorchAndVoidsDisagreeingLosses) {
  const Suite suite = peer_suite(builtins(), models());
  std::map<std::string, const BenchCase*> by_name;
  for (const auto& c : suite.cases) by_name[c.name] = &c;
  const std::string stem = "peer/gpt-mini/ddp-2x1-fp32/";
  ASSERT_TRUE(by_name.count(stem + "strata") && by_name.count(stem + "pytorch-eager") &&
              by_name.count(stem + "pytorch-compile"));
  for (const auto& c : suite.cases) EXPECT_TRUE(c.shared_init) << c.name;  // same initial weights
  EXPECT_EQ(by_name[stem + "pytorch-compile"]->program, "peer");
  EXPECT_EQ(by_name[stem + "strata"]->program, "strata-gpt");
  // Op-level selective checkpointing: the single-process job, both programs under the same policy.
  for (const char* system : {"strata", "pytorch-eager", "pytorch-compile"}) {
    const auto it = by_name.find(std::string("peer/gpt-mini/single-1x2-fp32-ac-op/") + system);
    ASSERT_NE(it, by_name.end()) << system;
    const auto& extra = it->second->extra;
    const std::vector<std::string> flag = {"--ac-policy", "op"};
    EXPECT_NE(std::search(extra.begin(), extra.end(), flag.begin(), flag.end()), extra.end()) << system;
  }
  auto result = [&](const std::string& system, double tps, double loss) {
    CaseResult r;
    r.bench_case = *by_name[stem + system];
    r.runs = 3;
    r.tokens_per_s = {tps, tps * 0.9, tps * 1.1};
    r.final_train_loss = loss;
    r.peak_rss_bytes_max = 400 << 20;
    return r;
  };
  std::vector<CaseResult> results = {result("strata", 6000, 3.5), result("pytorch-eager", 4000, 3.5002),
                                     result("pytorch-compile", 5000, 3.5001)};
  std::string md = peer_markdown(results, builtins(), models());
  // 6000 ÷ the faster (compiled, 5000); range: 5400 ÷ 5500 to 6600 ÷ 4500.
  EXPECT_NE(md.find("| 1.20× (0.98–1.47) |"), std::string::npos) << md;
  EXPECT_NE(md.find("3.5000 / 3.5001 (|Δ| 0.00010 ✓)"), std::string::npos) << md;
  // A run that did not train (loss off by far more than the tolerance) voids the comparison.
  results[0].final_train_loss = 3.5 + 10 * peer_loss_tolerance("32");
  md = peer_markdown(results, builtins(), models());
  EXPECT_NE(md.find("✗ void"), std::string::npos) << md;
  // The ceiling chart: each system's tokens/s over strata's ceiling (6000 at 0.75 -> 8000).
  EXPECT_TRUE(peer_ceiling_chart_data(results, builtins(), models()).panels.empty()) << "no ceiling known yet";
  results[0].ceiling_share = 0.75;
  const PanelChart ceiling = peer_ceiling_chart_data(results, builtins(), models());
  EXPECT_NE(ceiling.data.find("\"ddp x2\" 0.7500 0.5000 0.6250"), std::string::npos) << ceiling.data;
  EXPECT_EQ(ceiling.ylabel, "share of the GEMM-bound ceiling");
  EXPECT_NE(panel_chart_script(ceiling, "c.dat", "c.png", "png", "t").find("set yrange [0:1]"), std::string::npos);
}

TEST(BenchTest, MedianStepSecondsSkipsTheWarmUpStep) {
  const fs::path path = fs::temp_directory_path() / "strata_bench_test_metrics.csv";
  std::ofstream(path) << "step,loss,step_time_s,tokens_per_s\n"
                      << "1,5.5,9.0,\n2,5.4,0.2,100\n3,5.3,0.4,100\n4,5.2,5.0,100\n";
  EXPECT_DOUBLE_EQ(median_step_seconds(path.string()), 0.4);  // of 0.2, 0.4, 5.0
  std::ofstream(path) << "step,loss\n1,5.5\n";
  EXPECT_DOUBLE_EQ(median_step_seconds(path.string()), 0.0);
  fs::remove(path);
  EXPECT_DOUBLE_EQ(median_step_seconds(path.string()), 0.0);
}

TEST(BenchTest, GeneratedTextIsDeterministicAndPrintable) {
  const fs::path dir = fs::temp_directory_path() / "strata_bench_test_text";
  fs::create_directories(dir);
  write_generated_text((dir / "a.txt").string(), 4096);
  write_generated_text((dir / "b.txt").string(), 4096);
  std::ifstream a(dir / "a.txt"), b(dir / "b.txt");
  const std::string ta((std::istreambuf_iterator<char>(a)), {}), tb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(ta.size(), 4096u);
  EXPECT_EQ(ta, tb);
  EXPECT_TRUE(std::all_of(ta.begin(), ta.end(), [](char ch) { return ch >= 32 && ch < 127; }));
  fs::remove_all(dir);
}

TEST(BenchTest, MarkdownHasRowsRatiosAndFormula) {
  const BenchCase ddp = make_case("zero/gpt-mini/ddp-2x1");
  const BenchCase oss = make_case("zero/gpt-mini/oss-2x1", "oss", ddp.name);
  const Suite suite{"zero", "about zero", {ddp, oss}};
  // ddp at exactly 16Ψ' (within 5%); oss measured 16004 bytes vs 12000 formula.
  const std::vector<CaseResult> results = {
      aggregate(ddp, {with_prediction(fake_summary(1000, 10, 20), 4000, 4000, 8000)}),
      aggregate(oss, {with_prediction(fake_summary(500, 10, 10, 1000, "oss"), 4000, 4000, 4000)})};
  ReportHeader header;
  header.commit = "abc1234";
  header.machine.cpu_model = "Test CPU";
  const std::string md = render_markdown({suite}, results, header);
  EXPECT_NE(md.find("`abc1234`"), std::string::npos) << md;
  EXPECT_NE(md.find("Test CPU"), std::string::npos) << md;
  EXPECT_NE(md.find("### zero"), std::string::npos) << md;
  EXPECT_NE(md.find("| zero/gpt-mini/ddp-2x1 | ddp | 2×1 | 32 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 500 | 0.50× ddp-2x1 | – |"), std::string::npos) << md;  // oss ÷ ddp throughput
  EXPECT_NE(md.find("1.000 ✓"), std::string::npos) << md;  // ddp model state = its model's 16Ψ'
  EXPECT_NE(md.find("1.334 (+"), std::string::npos) << md;  // oss 16004 / its model's 12000, flagged
}

TEST(BenchTest, RunRecordHasProvenanceAndSummary) {
  const BenchCase c = make_case("smoke/gpt-nano/ddp-2x1");
  CaseRun run;
  run.bench_case = &c;
  run.command = "strata-gpt --strategy ddp";
  run.summary = with_prediction(fake_summary(123, 1, 2), 4000, 4000, 8000);
  ReportHeader header;
  header.commit = "abc1234";
  header.date = "2024-01-01T00:00:00Z";
  const auto j = run_record(run, header);
  EXPECT_EQ(j.at("case"), c.name);
  EXPECT_EQ(j.at("commit"), "abc1234");
  EXPECT_EQ(j.at("command"), run.command);
  EXPECT_EQ(j.at("tokens_per_s"), 123);
  EXPECT_EQ(j.at("peak_tensor_bytes_max"), 2);
  EXPECT_TRUE(j.at("machine").contains("cpu_model"));
  EXPECT_DOUBLE_EQ(j.at("model_state_formula_bytes").get<double>(), 16000);
}

TEST(BenchTest, RunRecordsReadBackForReRendering) {
  const BenchCase c = make_case("smoke/gpt-nano/ddp-2x1");
  const BenchCase other = make_case("smoke/gpt-nano/sdp-2x1", "sdp");
  ReportHeader header;
  header.commit = "abc1234";
  header.date = "2024-01-01T00:00:00Z";
  header.machine.cpu_model = "Test CPU";
  const fs::path path = fs::temp_directory_path() / "strata_bench_test_runs.jsonl";
  {
    std::ofstream out(path);
    for (int repeat = 0; repeat < 3; ++repeat) {
      CaseRun run;
      run.bench_case = &c;
      run.repeat = repeat;
      run.summary = fake_summary(100.0 * (repeat + 1), 10, 20);
      run.median_step_tokens_per_s = 50.0 * (repeat + 1);
      out << run_record(run, header).dump() << "\n";
    }
  }
  const std::vector<BenchCase> cases = {c, other};
  ReportHeader read_header;
  const auto runs = read_runs(path.string(), cases, &read_header);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].bench_case, &cases[0]);
  EXPECT_EQ(read_header.commit, "abc1234");
  EXPECT_EQ(read_header.machine.cpu_model, "Test CPU");
  EXPECT_EQ(read_header.repeats, 3);
  const auto results = aggregate_runs(cases, runs);
  ASSERT_EQ(results.size(), 1u);  // no runs of `other`
  EXPECT_DOUBLE_EQ(results[0].tokens_per_s.median, 200);
  EXPECT_DOUBLE_EQ(results[0].median_step_tokens_per_s, 100);
  EXPECT_EQ(results[0].model_state_bytes_max, 16004);
  EXPECT_THROW(read_runs(path.string(), {other}, &read_header), c10::ValueError);  // nothing for these cases
  fs::remove(path);
  EXPECT_THROW(read_runs(path.string(), cases, &read_header), c10::ValueError);
}

class BaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const BenchCase ref = make_case("smoke/gpt-nano/ddp-2x1");
    const BenchCase oss = make_case("smoke/gpt-nano/oss-2x1", "oss", ref.name);
    results_ = {aggregate(ref, {fake_summary(1000, 100, 100)}),
                aggregate(oss, {fake_summary(800, 100, 100, 1000, "oss")})};
    for (const auto& r : results_) baseline_[r.bench_case.name] = baseline_entry(r, results_);
  }
  std::vector<std::string> metrics(const std::vector<Regression>& regressions) {
    std::vector<std::string> out;
    for (const auto& r : regressions) out.push_back(r.case_name + ": " + r.metric);
    return out;
  }
  CaseResult& oss() { return results_[1]; }
  std::vector<CaseResult> results_;
  std::map<std::string, BaselineEntry> baseline_;
};

TEST_F(BaselineTest, EntryHoldsRatioDeviceAndBytesSent) {
  const BaselineEntry& e = baseline_.at("smoke/gpt-nano/oss-2x1");
  ASSERT_TRUE(e.tokens_per_s_vs_ref.has_value());
  EXPECT_DOUBLE_EQ(*e.tokens_per_s_vs_ref, 0.8);
  EXPECT_EQ(e.device, "cpu");
  EXPECT_DOUBLE_EQ(e.comm_bytes_per_step.at("all_reduce"), 90.0);  // 900 bytes / 10 steps
  EXPECT_FALSE(baseline_.at("smoke/gpt-nano/ddp-2x1").tokens_per_s_vs_ref.has_value());  // no reference
}

TEST_F(BaselineTest, PassesWithinTolerance) {
  oss().peak_tensor_bytes_min = oss().peak_tensor_bytes_max = 102;  // +2%
  results_[0].tokens_per_s.median = 500;  // absolute speed is not gated, only the ratio
  oss().tokens_per_s.median = 400;        // 0.8, as in the baseline
  EXPECT_TRUE(compare_to_baseline(results_, baseline_, GateOptions()).empty());
  oss().tokens_per_s.median = 350;  // 0.70: -12.5%
  EXPECT_TRUE(compare_to_baseline(results_, baseline_, GateOptions()).empty());
}

TEST_F(BaselineTest, FlagsARatioDropBeyondFifteenPercent) {
  oss().tokens_per_s.median = 670;  // 0.67 < 0.85 x 0.8 = 0.68
  const auto regressions = compare_to_baseline(results_, baseline_, GateOptions());
  ASSERT_EQ(regressions.size(), 1u) << render_regressions(regressions);
  EXPECT_EQ(regressions[0].metric, "tokens/s ÷ ref");
  EXPECT_EQ(regressions[0].measured, "0.670");
  EXPECT_NE(regressions[0].limit.find("0.680"), std::string::npos) << regressions[0].limit;
}

TEST_F(BaselineTest, FlagsMemoryGrowthOverTwoPercent) {
  oss().peak_tensor_bytes_min = oss().peak_tensor_bytes_max = 103;
  oss().model_state_bytes_min = oss().model_state_bytes_max = 20000;
  const auto regressions = compare_to_baseline(results_, baseline_, GateOptions());
  EXPECT_EQ(metrics(regressions), (std::vector<std::string>{"smoke/gpt-nano/oss-2x1: peak tensor bytes",
                                                             "smoke/gpt-nano/oss-2x1: model-state bytes"}));
  const std::string msg = regressions[0].message();
  EXPECT_NE(msg.find("regression: smoke/gpt-nano/oss-2x1 peak tensor bytes 103 (baseline 100"), std::string::npos)
      << msg;
  const std::string table = render_regressions(regressions);
  EXPECT_NE(table.find("| smoke/gpt-nano/oss-2x1 | peak tensor bytes | 100 | 103 |"), std::string::npos) << table;
}

TEST_F(BaselineTest, OneRepeatsTimingSpikeIsNotAMemoryRegression) {
  // Repeats peaked at 100 and 110 bytes: the smallest is what every run needed.
  oss() = aggregate(oss().bench_case, {fake_summary(800, 100, 100, 1000, "oss"), fake_summary(800, 110, 100, 1000, "oss")});
  EXPECT_TRUE(compare_to_baseline(results_, baseline_, GateOptions()).empty());
  oss() = aggregate(oss().bench_case, {fake_summary(800, 110, 100, 1000, "oss"), fake_summary(800, 104, 100, 1000, "oss")});
  EXPECT_EQ(metrics(compare_to_baseline(results_, baseline_, GateOptions())),
            (std::vector<std::string>{"smoke/gpt-nano/oss-2x1: peak tensor bytes"}));
}

TEST_F(BaselineTest, FlagsAnyChangeInBytesSent) {
  oss().comm_bytes_per_step_by_kind["all_reduce"] += 1;  // one byte more per step
  oss().comm_bytes_per_step_by_kind["all_gather"] = 4;   // a new kind
  EXPECT_EQ(metrics(compare_to_baseline(results_, baseline_, GateOptions())),
            (std::vector<std::string>{"smoke/gpt-nano/oss-2x1: bytes sent per step (all_gather)",
                                      "smoke/gpt-nano/oss-2x1: bytes sent per step (all_reduce)"}));
}

TEST_F(BaselineTest, RenamedCaseAndEmptyBaselineFail) {
  oss().bench_case.name = "smoke/gpt-nano/oss-renamed";
  EXPECT_EQ(metrics(compare_to_baseline(results_, baseline_, GateOptions())),
            (std::vector<std::string>{"smoke/gpt-nano/oss-renamed: missing from baseline",
                                      "smoke/gpt-nano/oss-2x1: missing from results"}));
  const auto empty = compare_to_baseline(results_, {}, GateOptions());
  ASSERT_FALSE(empty.empty());
  EXPECT_EQ(empty[0].metric, "baseline");
}

TEST_F(BaselineTest, DeviceMismatchAndFailedCasesFail) {
  oss().bench_case.device = "cuda";
  results_[0].status = "failed";
  results_[0].error = "run 1 exited with code 1";
  EXPECT_EQ(metrics(compare_to_baseline(results_, baseline_, GateOptions())),
            (std::vector<std::string>{"smoke/gpt-nano/ddp-2x1: failed", "smoke/gpt-nano/oss-2x1: device"}));
  GateOptions bad;
  bad.max_ratio_drop = 1.0;
  EXPECT_THROW(compare_to_baseline(results_, baseline_, bad), c10::ValueError);
}

TEST_F(BaselineTest, RoundTripsThroughTheFileFormat) {
  const fs::path path = fs::temp_directory_path() / "strata_bench_test_baseline.jsonl";
  std::ofstream(path) << baseline_text(results_) << "\n";  // a blank line is allowed
  const auto read = read_baseline(path.string());
  ASSERT_EQ(read.size(), 2u);
  const BaselineEntry& e = read.at("smoke/gpt-nano/oss-2x1");
  EXPECT_DOUBLE_EQ(e.tokens_per_s, 800);
  EXPECT_DOUBLE_EQ(*e.tokens_per_s_vs_ref, 0.8);
  EXPECT_EQ(e.reference, "smoke/gpt-nano/ddp-2x1");
  EXPECT_EQ(e.model_state_bytes_max, 16004);
  EXPECT_TRUE(compare_to_baseline(results_, read, GateOptions()).empty());
  std::ofstream(path) << "{\"case\": \"x\"}\n";
  EXPECT_THROW(read_baseline(path.string()), c10::ValueError);
  fs::remove(path);
  try {
    read_baseline(path.string());
    FAIL() << "missing baseline accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(path.string()), std::string::npos);
  }
}

TEST(BenchTest, CommittedSmokeBaselineCoversTheSmokeSuiteOnCpu) {
  const auto baseline = read_baseline(std::string(STRATA_SOURCE_DIR) + "/bench/baselines/smoke.jsonl");
  const auto cases = all_cases(select_suites("smoke"));
  ASSERT_EQ(baseline.size(), cases.size());
  std::set<std::string> strategies;
  for (const auto& c : cases) {
    ASSERT_EQ(baseline.count(c.name), 1u) << c.name;
    EXPECT_EQ(baseline.at(c.name).device, "cpu") << c.name;
    EXPECT_EQ(c.device, "cpu") << c.name;
    strategies.insert(c.strategy);
    if (c.strategy != "single") {
      EXPECT_EQ(c.nproc, 2) << c.name;
    }
  }
  EXPECT_EQ(strategies, (std::set<std::string>{"single", "ddp", "oss", "sdp", "fsdp"}));
  EXPECT_EQ(baseline.count("smoke/gpt-nano/fsdp-ac-2x1"), 1u);
  EXPECT_EQ(baseline.count("smoke/gpt-nano/fsdp-offload-disk-2x1"), 1u);
}

TEST(BenchTest, PerRankFieldsAreReadWhenPresentAndDashedWhenAbsent) {
  const BenchCase c = make_case("fsdp/gpt-mini/fsdp-2x1", "fsdp");
  auto s = fake_summary(1000, 100, 200, 1000, "fsdp");
  s["psi"] = 4000;
  s["per_rank"] = nlohmann::json::array();
  for (int r = 0; r < 2; ++r) {
    s["per_rank"].push_back({{"rank", r},
                             {"forward_s", 0.010 * (r + 1)},
                             {"backward_s", 0.020},
                             {"comm_wait_s", 0.003},
                             {"optimizer_s", 0.001},
                             {"step_s", 0.040},
                             {"tokens_per_s", 500.0},
                             {"peak_tensor_bytes", 100 * (r + 1)},
                             {"memory", {{"params", 10}, {"grads", 20}, {"optimizer", 30}, {"activations_other", 40}}},
                             {"predicted", {{"params", 10}, {"grads", 20}, {"optimizer", 20}}},
                             {"peak_rss_bytes", 5000},
                             {"comm_bytes_per_step", {{"all_gather", 64}, {"reduce_scatter", 32}}}});
  }
  const CaseResult r = aggregate(c, {s});
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(*r.ranks[1].forward_s, 0.020);
  EXPECT_EQ(*r.ranks[1].peak_tensor_bytes, 200);
  EXPECT_EQ(*r.ranks[0].activations_other, 40);
  EXPECT_EQ(*r.ranks[0].predicted_optimizer, 20);
  EXPECT_DOUBLE_EQ(r.ranks[0].comm_bytes_per_step.at("all_gather"), 64);
  EXPECT_DOUBLE_EQ(*r.psi, 4000);
  const Suite suite{"fsdp", "", {c}};
  const std::string md = render_per_rank_markdown({suite}, {r});
  EXPECT_NE(md.find("| fsdp/gpt-mini/fsdp-2x1 | 1 | 500 | 20.0 | 20.0 | 3.0 | 1.0 | 40.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1.200 |"), std::string::npos) << md;  // measured 60 ÷ predicted 50

  // An older summary: memory from the per-rank arrays, times from rank 0's scalars, "—" elsewhere.
  auto old = fake_summary(1000, 100, 200);
  old["backward_s_per_step"] = 0.5;
  const CaseResult o = aggregate(make_case("zero/gpt-mini/ddp-2x1"), {old});
  ASSERT_EQ(o.ranks.size(), 2u);
  EXPECT_EQ(*o.ranks[1].peak_tensor_bytes, 200);
  EXPECT_EQ(*o.ranks[1].optimizer, 8004);
  EXPECT_FALSE(o.ranks[0].forward_s.has_value());
  EXPECT_DOUBLE_EQ(*o.ranks[0].backward_s, 0.5);
  EXPECT_FALSE(o.ranks[1].backward_s.has_value());
  // No prediction in the summary: none made up (the report reads the strategy's own model only).
  EXPECT_FALSE(o.ranks[0].predicted_params.has_value());
  const std::string old_md = render_per_rank_markdown({Suite{"zero", "", {o.bench_case}}}, {o});
  EXPECT_NE(old_md.find("| zero/gpt-mini/ddp-2x1 | 0 | — | — | 500.0 |"), std::string::npos) << old_md;
}

TEST(BenchTest, FailedAndSkippedCasesAreReportedNotDropped) {
  BenchCase ok = make_case("sweep/gpt-nano/ddp-2x1");
  BenchCase bad = make_case("sweep/gpt-nano/sdp-2x1", "sdp");
  BenchCase skipped = make_case("sweep/gpt-nano/ddp-offload-disk-2x1");
  skipped.skip_reason = "--offload is for fsdp only";
  const std::vector<BenchCase> cases = {ok, bad, skipped};
  CaseRun good_run;
  good_run.bench_case = &cases[0];
  good_run.summary = fake_summary(1000, 1, 2);
  CaseRun bad_run;
  bad_run.bench_case = &cases[1];
  bad_run.error = "killed by SIGKILL (exit 137; out of memory?)";
  const auto results = aggregate_runs(cases, {good_run, bad_run});
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].status, "ok");
  EXPECT_EQ(results[1].status, "failed");
  EXPECT_NE(results[1].error.find("out of memory"), std::string::npos);
  EXPECT_EQ(results[2].status, "skipped");
  const std::string md = render_markdown({Suite{"sweep", "", cases}}, results, ReportHeader());
  EXPECT_NE(md.find("**failed**: run 1 killed by SIGKILL"), std::string::npos) << md;
  EXPECT_NE(md.find("**skipped**: --offload is for fsdp only"), std::string::npos) << md;
  ReportHeader header;
  header.libtorch = "1.13.1";
  header.machine.nproc = 2;
  const auto line = case_record(results[1], header);
  EXPECT_EQ(line.at("status"), "failed");
  EXPECT_EQ(line.at("libtorch"), "1.13.1");
  EXPECT_EQ(line.at("cores"), 2);
  EXPECT_EQ(case_record(results[0], header).at("per_rank").size(), 2u);
}

TEST(BenchTest, SuitesRunTheWorkloadsTheModelFamiliesGive) {
  // A registry whose only family with strategy-suite workloads is the Llama:
  // the suites name its presets, not the GPT's.
  strata::recipes::ModelRegistry llama_first;
  strata::recipes::BenchWorkloads bench = strata::recipes::llama_model_spec().bench();
  bench.tiny = {"llama-nano", 8, 20};
  bench.small = {"llama-micro"};
  bench.medium = {"llama-mini", 8, 40};
  llama_first.add(strata::recipes::llama_model_spec().bench(bench));
  SuiteRegistry registry;
  register_builtin_suites(registry, builtins(), llama_first);
  std::set<std::string> names;
  for (const auto& c : all_cases(registry.select("smoke,ddp,planner,peer"))) {
    names.insert(c.name);
    EXPECT_EQ(c.name.find("gpt"), std::string::npos) << c.name;
  }
  EXPECT_TRUE(names.count("smoke/llama-nano/ddp-2x1"));
  EXPECT_TRUE(names.count("ddp/llama-micro/ddp-2x1"));
  EXPECT_TRUE(names.count("ddp/llama-mini/ddp-2x1"));
  EXPECT_TRUE(names.count("planner/held-out/llama-micro/sdp-3x1-t128-b8")) << "the family's own held-out cases";
  EXPECT_TRUE(names.count("peer/llama-mini/fsdp-2x1-fp32-ac/strata"));
  EXPECT_FALSE(names.count("peer/llama-mini/oss-2x1-fp32/strata")) << "its peer runs no ZeRO-1";
  // Without a family that gives workloads, selecting a strategy suite fails naming why.
  strata::recipes::ModelRegistry none;
  SuiteRegistry empty;
  register_builtin_suites(empty, builtins(), none);
  EXPECT_NE(strata::testing::what_of([&] { empty.select("smoke"); }).find("ModelSpec::bench"), std::string::npos);
}

TEST(BenchTest, SuiteRegistryTakesSuitesFromOtherFiles) {
  SuiteRegistry registry;
  register_builtin_suites(registry, builtins(), models());
  EXPECT_EQ(registry.names().back(), "peer");  // bench/peer_suite.cpp registers there, after planner
  registry.add("extra", [] { return Suite{"extra", "from another file", {make_case("extra/gpt-nano/x")}}; });
  const auto suites = registry.select("smoke,extra");
  ASSERT_EQ(suites.size(), 2u);
  EXPECT_EQ(suites[1].cases.at(0).name, "extra/gpt-nano/x");
  EXPECT_THROW(registry.add("extra", [] { return Suite{}; }), c10::ValueError);
  EXPECT_EQ(registry.names().back(), "extra");
  EXPECT_THROW(registry.select("extr"), c10::ValueError);
}

TEST(BenchTest, SweepIsTheCrossProductWithSkipsAndReferences) {
  const Suite s = make_sweep(SweepOptions()
                                 .presets({"gpt-micro", "gpt-mini"})
                                 .strategies({"single", "ddp", "oss", "sdp", "fsdp"})
                                 .ac({0, 1})
                                 .offload({"none", "disk"})
                                 .precision({"fp32", "bf16-mixed"})
                                 .nproc({2}),
                             builtins(), models());
  ASSERT_EQ(s.cases.size(), 2u * 5 * 2 * 2 * 2);
  int skipped = 0;
  for (const auto& c : s.cases) {
    EXPECT_EQ(c.steps, 20) << c.name;
    EXPECT_EQ(c.device, "cpu") << c.name;
    if (!c.skip_reason.empty()) {
      ++skipped;
      EXPECT_EQ(c.strategy, "single") << c.name;  // only single at 2 ranks is refused
      continue;
    }
    const std::string ref = "sweep/" + c.preset + "/ddp-2x1-b8-t64";
    EXPECT_EQ(c.reference, c.name == ref ? "" : ref) << c.name;
  }
  EXPECT_EQ(skipped, 2 * 2 * 2 * 2);  // single: presets x ac x offload x precision
  const auto& fsdp = *std::find_if(s.cases.begin(), s.cases.end(), [](const BenchCase& c) {
    return c.name == "sweep/gpt-mini/fsdp-ac1-offload-disk-bf16-2x1-b8-t64";
  });
  EXPECT_EQ(fsdp.precision, "bf16-mixed");
  EXPECT_EQ(fsdp.extra, (std::vector<std::string>{"--activation-checkpointing", "1", "--offload", "disk"}));
  EXPECT_THROW(make_sweep(SweepOptions().presets({"gpt-huge"}), builtins(), models()), c10::ValueError);
  EXPECT_THROW(make_sweep(SweepOptions().nproc({0}), builtins(), models()), c10::ValueError);
  EXPECT_THROW(make_sweep(SweepOptions().strategies({"ddp", "ddp"}), builtins(), models()), c10::ValueError);
  EXPECT_THROW(make_sweep(SweepOptions().strategies({"pipeline"}), builtins(), models()), c10::ValueError);
  // No strategies given: the reference strategy alone.
  EXPECT_EQ(make_sweep(SweepOptions(), builtins(), models()).cases.at(0).strategy, "ddp");
  // The reference is the reference strategy's case wherever it comes in the list.
  const Suite later = make_sweep(SweepOptions().strategies({"fsdp", "oss", "ddp"}), builtins(), models());
  for (const auto& c : later.cases) {
    EXPECT_EQ(c.reference, c.strategy == "ddp" ? "" : "sweep/gpt-micro/ddp-2x1-b8-t64") << c.name;
  }
  // A pipeline axis: single runs one rank per stage, so only at pp 2 of 2
  // ranks; 3 does not divide 2; ddp at pp 2 is one rank per stage too.
  const Suite pp = make_sweep(
      SweepOptions().strategies({"single", "ddp"}).nproc({2}).pp({1, 2, 3}).microbatches({4}), builtins(), models());
  ASSERT_EQ(pp.cases.size(), 2u * 3);
  std::map<std::string, std::string> skipped_pp;
  for (const auto& c : pp.cases) skipped_pp[c.name] = c.skip_reason;
  EXPECT_NE(skipped_pp.at("sweep/gpt-micro/single-m4-2x1-b8-t64"), "");
  EXPECT_EQ(skipped_pp.at("sweep/gpt-micro/single-pp2-m4-2x1-b8-t64"), "");
  EXPECT_NE(skipped_pp.at("sweep/gpt-micro/ddp-pp3-m4-2x1-b8-t64").find("does not divide"), std::string::npos);
  const auto& staged = *std::find_if(pp.cases.begin(), pp.cases.end(), [](const BenchCase& c) {
    return c.name == "sweep/gpt-micro/single-pp2-m4-2x1-b8-t64";
  });
  EXPECT_EQ(staged.extra, (std::vector<std::string>{"--accumulate-grad-batches", "4", "--pp-size", "2", "--pp-schedule",
                                                    "1f1b"}));
  EXPECT_EQ(staged.reference, "sweep/gpt-micro/ddp-m4-2x1-b8-t64");
  EXPECT_THROW(make_sweep(SweepOptions().pp({0}), builtins(), models()), c10::ValueError);
  EXPECT_THROW(split_int_list("1,x", "nproc"), c10::ValueError);
  EXPECT_THROW(split_list("a,,b", "presets"), c10::ValueError);
  EXPECT_EQ(split_list("a, b", "presets"), (std::vector<std::string>{"a", "b"}));
}

TEST(BenchTest, SuitesTakeAUsersStrategyFromItsSpec) {
  // A strategy registered by another project gets its own suite, smoke rows
  // (with the variant's precision), and planner cases; the built-ins' held-out
  // planner cases stay what they were.
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  const auto& ddp = registry.spec("ddp");
  registry.add(strata::StrategySpec("mine", "a user's strategy")
                   .factory(ddp.factory())
                   .memory(strata::replicated_memory)
                   .bench({{.tag = "bf16", .precision = "bf16-mixed", .suites = {"smoke", "planner"}}}));
  SuiteRegistry suites;
  register_builtin_suites(suites, registry, models());
  std::map<std::string, BenchCase> cases;
  for (const auto& c : all_cases(suites.select("mine,smoke,planner"))) cases[c.name] = c;
  ASSERT_TRUE(cases.count("mine/gpt-mini/mine-2x1")) << "its own suite";
  EXPECT_EQ(cases.at("mine/gpt-mini/mine-2x1").reference, "mine/gpt-mini/ddp-2x1");
  ASSERT_TRUE(cases.count("smoke/gpt-nano/mine-bf16-2x1"));
  EXPECT_EQ(cases.at("smoke/gpt-nano/mine-bf16-2x1").precision, "bf16-mixed");
  EXPECT_EQ(cases.at("smoke/gpt-nano/mine-bf16-2x1").reference, "smoke/gpt-nano/ddp-2x1");
  EXPECT_EQ(cases.at("planner/gpt-mini/mine-bf16-2x1").precision, "bf16-mixed");
  for (const char* held_out : {"planner/held-out/gpt-micro-w192/ddp-2x1-t128-b8",
                               "planner/held-out/gpt-micro-w192/fsdp-2x1-t128-b8", "planner/held-out/gpt-mini/oss-3x1-t128-b8",
                               "planner/held-out/gpt-mini/fsdp-4x1-t128-b4", "planner/held-out/gpt-nano/fsdp-ac-3x1-t256-b4"}) {
    EXPECT_TRUE(cases.count(held_out)) << held_out;
  }
}

TEST(BenchTest, ASweepTakesEveryRegisteredFamilysPresets) {
  // The presets are the model registry's, not a list of the bench's own.
  EXPECT_EQ(make_sweep(SweepOptions().presets({"llama-micro"}), builtins(), models()).cases.at(0).name,
            "sweep/llama-micro/ddp-2x1-b8-t64");
  try {
    make_sweep(SweepOptions().presets({"llama-huge"}), builtins(), models());
    ADD_FAILURE() << "an unknown preset was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3-0.6b"), std::string::npos) << e.what();
  }
}

TEST(BenchTest, ChartDataAndScripts) {
  // gpt-mini: ddp, fsdp, and fsdp + bf16 (a second panel, whose row has no
  // ddp: divided by its first strategy); tokens/s 200 (ddp) and 100 (fsdp).
  const BenchCase ddp_case = make_case("fsdp/gpt-mini/ddp-2x1", "ddp");
  BenchCase fsdp_case = make_case("fsdp/gpt-mini/fsdp-2x1", "fsdp");
  BenchCase bf16_case = make_case("fsdp/gpt-mini/fsdp-bf16-2x1", "fsdp");
  bf16_case.precision = "bf16-mixed";
  BenchCase plain_ddp = ddp_case;
  for (BenchCase* c : {&plain_ddp, &fsdp_case, &bf16_case}) {
    c->preset = "gpt-mini";
    c->block_size = 128;
    c->threads_per_rank = 1;
  }
  const CaseResult ddp = aggregate(plain_ddp, {fake_summary(200, 10, 20)});
  const CaseResult r = aggregate(fsdp_case, {fake_summary(100, 10, 20)});
  const CaseResult bf16 = aggregate(bf16_case, {fake_summary(300, 10, 20)});
  const PanelChart tokens = panel_chart_data({ddp, r, bf16}, ChartMetric::kTokensPerS, builtins());
  EXPECT_EQ(tokens.panels, (std::vector<std::string>{"fp32", "bf16"}));
  EXPECT_EQ(tokens.strategies, (std::vector<std::string>{"ddp", "fsdp"}));
  // One shape for every case: rows are named by preset.
  EXPECT_FALSE(tokens.long_labels);
  EXPECT_NE(tokens.data.find("\"preset\" \"ddp\" \"fsdp\"\n\"gpt-mini\" 1 0.5\n"), std::string::npos) << tokens.data;
  EXPECT_NE(tokens.data.find("\"gpt-mini\" ? 1\n"), std::string::npos) << tokens.data;
  const std::string script = panel_chart_script(tokens, "t.dat", "t.png", "png", "title");
  EXPECT_NE(script.find("set output 't.png'"), std::string::npos);
  EXPECT_NE(script.find("set multiplot layout 1,2"), std::string::npos) << script;
  EXPECT_NE(script.find("'t.dat' index 1 using i:xtic(1)"), std::string::npos) << script;
  // A quote in a title is doubled, as gnuplot's single-quoted strings want.
  EXPECT_NE(panel_chart_script(tokens, "t.dat", "t.png", "png", "the job's ceiling").find("title 'the job''s ceiling'"),
            std::string::npos);
  const PanelChart memory = panel_chart_data({ddp, r}, ChartMetric::kPeakTensorBytes, builtins());
  EXPECT_NE(memory.data.find("\"gpt-mini\" 1 1\n"), std::string::npos) << memory.data;
  // Another shape (block 256): rows name it, and a ratio never crosses shapes.
  BenchCase wide_case = fsdp_case;
  wide_case.name = "fsdp/gpt-mini/fsdp-2x1-t256";
  wide_case.block_size = 256;
  const CaseResult wide = aggregate(wide_case, {fake_summary(50, 10, 20)});
  const PanelChart mixed = panel_chart_data({ddp, r, wide}, ChartMetric::kTokensPerS, builtins());
  EXPECT_TRUE(mixed.long_labels);
  EXPECT_NE(mixed.data.find("\"gpt-mini (2x1 b8 t128)\" 1 0.5\n"), std::string::npos) << mixed.data;
  EXPECT_NE(mixed.data.find("\"gpt-mini (2x1 b8 t256)\" ? 1\n"), std::string::npos) << mixed.data;

  const fs::path dir = fs::temp_directory_path() / "strata_bench_test_charts";
  fs::remove_all(dir);
  const ChartFiles missing = write_charts({ddp, r, bf16}, dir.string(), builtins(), "/nonexistent/gnuplot");
  EXPECT_NE(missing.note.find("gnuplot not found"), std::string::npos) << missing.note;
  EXPECT_TRUE(fs::exists(dir / "tokens_per_s.dat"));
  EXPECT_TRUE(fs::exists(dir / "memory.gp"));
  EXPECT_FALSE(fs::exists(dir / "memory.png"));
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "gnuplot is not installed (scripts/setup installs gnuplot-nox): PNG drawing not tested";
  }
  const ChartFiles drawn = write_charts({ddp, r, bf16}, dir.string(), builtins());
  EXPECT_EQ(drawn.note, "");
  EXPECT_GT(fs::file_size(dir / "tokens_per_s.png"), 1000u);
  EXPECT_GT(fs::file_size(dir / "memory.png"), 1000u);
  fs::remove_all(dir);
}

}  // namespace
