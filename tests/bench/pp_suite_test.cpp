// pp_suite_test - bench/pp_suite.h: the pp suite's cases (each schedule at
// 2, 4 and 8 micro-batches against the reference strategy at the same tokens
// per step) and its bubble table and chart from runs' pipeline.json.
#include "tests/builtin_models.h"
#include "tests/builtin_strategies.h"
#include "strata/bench/pp_suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace strata::bench;

/// pipeline.json as PipelineBubble writes it, 2 ranks.
nlohmann::json pipeline(const std::string& schedule, int m, double idle0, double idle1, double formula) {
  return {{"schedule", schedule},
          {"pp_size", 2},
          {"microbatches", m},
          {"per_rank", {{{"rank", 0}, {"idle_share", idle0}}, {{"rank", 1}, {"idle_share", idle1}}}},
          {"simulated_idle_share_per_stage_rank", {formula + 0.01, formula + 0.02}},
          {"formula_idle_share", formula}};
}

}  // namespace

TEST(PpSuiteTest, EverySchedulesMicrobatchesAgainstTheReferenceAtTheSameTokensPerStep) {
  const auto& models = strata::testing::builtin_models();
  const Suite s = pp_suite(strata::testing::builtin_strategies(), models.bench_family().bench());
  ASSERT_EQ(s.cases.size(), 3u * (1 + pp_suite_schedules().size())) << "per micro-batch count: ddp and 4 schedules";
  for (const BenchCase& c : s.cases) {
    const bool pp = std::find(c.extra.begin(), c.extra.end(), "--pp-size") != c.extra.end();
    if (!pp) {
      EXPECT_TRUE(c.reference.empty()) << c.name;
      continue;
    }
    const auto ref = std::find_if(s.cases.begin(), s.cases.end(), [&](const BenchCase& r) { return r.name == c.reference; });
    ASSERT_NE(ref, s.cases.end()) << c.name << " names " << c.reference;
    EXPECT_EQ(ref->nproc, c.nproc) << c.name;
    // One pipeline takes a micro-batch over its 2 ranks; ddp's 2 ranks take half each.
    EXPECT_EQ(ref->batch_size * ref->nproc, c.batch_size) << c.name;
    EXPECT_EQ(std::find(ref->extra.begin(), ref->extra.end(), "--accumulate-grad-batches")[1],
              std::find(c.extra.begin(), c.extra.end(), "--accumulate-grad-batches")[1])
        << c.name;
  }
}

TEST(PpSuiteTest, TheBubbleTableAndChartReadEachRunsPipeline) {
  BenchCase one, two;
  one.name = "pp/gpt-mini/pp2-1f1b-m4-2x1";
  two.name = "pp/gpt-mini/pp2-gpipe-m8-2x1";
  std::vector<CaseRun> runs(5);
  // Three repeats of 1f1b at 4 micro-batches (rank 0's median 0.4 of 0.2,
  // 0.9 and 0.4; rank 1's 0.3), one of gpipe at 8, and a run without a
  // pipeline (left out).
  for (auto& r : runs) r.bench_case = &one;
  runs[0].summary["pipeline"] = pipeline("1f1b", 4, 0.2, 0.1, 0.2);
  runs[1].summary["pipeline"] = pipeline("1f1b", 4, 0.9, 0.3, 0.2);
  runs[2].summary["pipeline"] = pipeline("1f1b", 4, 0.4, 0.3, 0.2);
  runs[3].bench_case = &two;
  runs[3].summary["pipeline"] = pipeline("gpipe", 8, 0.1, 0.1, 1.0 / 9);
  runs[4].summary = {{"tokens_per_s", 1}};
  const std::string table = pp_markdown(runs);
  EXPECT_NE(table.find("| pp/gpt-mini/pp2-1f1b-m4-2x1 | 1f1b | 4 | 40.0%, 30.0% | 21.0%, 22.0% | 20.0% |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| pp/gpt-mini/pp2-gpipe-m8-2x1 | gpipe | 8 | 10.0%, 10.0% |"), std::string::npos) << table;
  const PanelChart chart = pp_bubble_chart(runs);
  EXPECT_EQ(chart.panels, (std::vector<std::string>{"4 micro-batches", "8 micro-batches"}));
  EXPECT_NE(chart.data.find("\"1f1b\" 0.35 0.215 0.2\n"), std::string::npos) << chart.data;
  EXPECT_EQ(pp_markdown({runs[4]}), "") << "no pipeline, no table";
}
