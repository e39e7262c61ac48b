// bench_test - Unit tests for bench/harness.cpp and bench/report.cpp (the pure
// logic; strata-gpt subprocesses run only in the bench_smoke_gate ctest).
#include "bench/harness.h"
#include "bench/report.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace strata::bench;
namespace fs = std::filesystem;

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

BenchCase make_case(const std::string& name, const std::string& strategy = "ddp", const std::string& reference = "") {
  BenchCase c;
  c.name = name;
  c.suite = name.substr(0, name.find('/'));
  c.strategy = strategy;
  c.nproc = 2;
  c.reference = reference;
  return c;
}

TEST(BenchTest, ZeroFormulas) {
  // Ψ' = 1000 parameters, N = 4 ranks, fp32 AdamW.
  EXPECT_DOUBLE_EQ(zero_model_state_bytes("single", 1000, 1), 16000);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes("ddp", 1000, 4), 16000);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes("oss", 1000, 4), 8000 + 2000);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes("sdp", 1000, 4), 4000 + 3000);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes("fsdp", 1000, 4), 4000);
  // At N = 1 every formula is the unsharded 16Ψ'.
  for (const char* s : {"oss", "sdp", "fsdp"}) EXPECT_DOUBLE_EQ(zero_model_state_bytes(s, 1000, 1), 16000) << s;
  EXPECT_THROW(zero_model_state_bytes("pipeline", 1000, 2), c10::Error);
  EXPECT_THROW(zero_model_state_bytes("ddp", 1000, 0), c10::Error);
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
  const auto cases = all_cases(select_suites("single,ddp,zero,memory,smoke,attention"));
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
    EXPECT_NE(msg.find("single, ddp, zero, fsdp, memory, smoke, attention, kernels"), std::string::npos) << msg;
  }
  EXPECT_THROW(select_suites("zero,zero"), c10::ValueError);
  EXPECT_THROW(select_suites(""), c10::ValueError);
  EXPECT_THROW(select_suites("smoke,"), c10::ValueError);
}

TEST(BenchTest, DdpSuiteKeepsTheGlobalBatch) {
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
  c.data = "addition";  // anything but the generated text is passed through
  const auto addition = gpt_command(c, "g", "generated.txt", "o");
  EXPECT_NE(std::find(addition.begin(), addition.end(), "addition"), addition.end());
  EXPECT_EQ(std::find(addition.begin(), addition.end(), "generated.txt"), addition.end());
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
  const std::vector<CaseResult> results = {aggregate(ddp, {fake_summary(1000, 10, 20)}),
                                           aggregate(oss, {fake_summary(500, 10, 10, 1000, "oss")})};
  ReportHeader header;
  header.commit = "abc1234";
  header.machine.cpu_model = "Test CPU";
  const std::string md = render_markdown({suite}, results, header);
  EXPECT_NE(md.find("`abc1234`"), std::string::npos) << md;
  EXPECT_NE(md.find("Test CPU"), std::string::npos) << md;
  EXPECT_NE(md.find("### zero"), std::string::npos) << md;
  EXPECT_NE(md.find("| zero/gpt-mini/ddp-2x1 | ddp | 2×1 | 32 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 500 | 0.50× ddp-2x1 | – |"), std::string::npos) << md;  // oss ÷ ddp throughput
  EXPECT_NE(md.find("1.000 ✓"), std::string::npos) << md;                  // ddp model state = 16Ψ'
  EXPECT_NE(md.find("1.334 (+"), std::string::npos) << md;                  // oss 16004 / 12000, flagged
}

TEST(BenchTest, RunRecordHasProvenanceAndSummary) {
  const BenchCase c = make_case("smoke/gpt-nano/ddp-2x1");
  CaseRun run;
  run.bench_case = &c;
  run.command = "strata-gpt --strategy ddp";
  run.summary = fake_summary(123, 1, 2);
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
    result_ = aggregate(make_case("smoke/gpt-nano/ddp-2x1"), {fake_summary(1000, 100, 100)});
    baseline_[result_.bench_case.name] = {result_.bench_case.name, 1000, 100, 16004};
  }
  CaseResult result_;
  std::map<std::string, BaselineEntry> baseline_;
};

TEST_F(BaselineTest, PassesWithinTolerance) {
  result_.tokens_per_s.median = 600;     // 40% slower: inside the generous 50%
  result_.peak_tensor_bytes_max = 104;   // +4%
  EXPECT_TRUE(compare_to_baseline({result_}, baseline_, GateOptions()).empty());
}

TEST_F(BaselineTest, FlagsSlowdown) {
  result_.tokens_per_s.median = 400;
  const auto regressions = compare_to_baseline({result_}, baseline_, GateOptions());
  ASSERT_EQ(regressions.size(), 1u);
  EXPECT_EQ(regressions[0].metric, "tokens_per_s");
  EXPECT_DOUBLE_EQ(regressions[0].limit, 500);
  const std::string msg = regressions[0].message();
  EXPECT_NE(msg.find("smoke/gpt-nano/ddp-2x1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("400.0 < limit 500.0"), std::string::npos) << msg;
}

TEST_F(BaselineTest, FlagsMemoryGrowth) {
  result_.peak_tensor_bytes_max = 106;
  result_.model_state_bytes_max = 20000;
  const auto regressions = compare_to_baseline({result_}, baseline_, GateOptions());
  ASSERT_EQ(regressions.size(), 2u);
  EXPECT_EQ(regressions[0].metric, "peak_tensor_bytes_max");
  EXPECT_EQ(regressions[1].metric, "model_state_bytes_max");
  EXPECT_NE(regressions[0].message().find("106 > limit 105"), std::string::npos) << regressions[0].message();
}

TEST_F(BaselineTest, CasesWithoutBaselineAreNotGatedAndOptionsAreChecked) {
  result_.bench_case.name = "smoke/gpt-nano/new-case";
  result_.tokens_per_s.median = 1;
  EXPECT_TRUE(compare_to_baseline({result_}, baseline_, GateOptions()).empty());
  GateOptions bad;
  bad.max_slowdown = 1.0;
  EXPECT_THROW(compare_to_baseline({result_}, baseline_, bad), c10::ValueError);
}

TEST_F(BaselineTest, RoundTripsThroughTheFileFormat) {
  const fs::path path = fs::temp_directory_path() / "strata_bench_test_baseline.jsonl";
  std::ofstream(path) << baseline_text({result_}) << "\n";  // a blank line is allowed
  const auto read = read_baseline(path.string());
  ASSERT_EQ(read.count(result_.bench_case.name), 1u);
  EXPECT_DOUBLE_EQ(read.at(result_.bench_case.name).tokens_per_s, 1000);
  EXPECT_EQ(read.at(result_.bench_case.name).model_state_bytes_max, 16004);
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

}  // namespace
