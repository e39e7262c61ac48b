// The pp suite (pp_suite.h).
#include "strata/bench/pp_suite.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace strata::bench {
namespace {

constexpr int kMicrobatches[] = {2, 4, 8};

/// A pipeline case's figures over its repeats.
struct Bubble {
  std::string schedule;
  int microbatches = 0;
  std::vector<std::vector<double>> measured;  ///< per rank, one per repeat
  std::vector<double> simulated;              ///< per stage rank (last repeat's costs)
  double formula = 0.0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / double(v.size());
}

/// The pipeline cases' bubbles, in the order of first appearance.
std::vector<std::pair<std::string, Bubble>> bubbles(const std::vector<CaseRun>& runs) {
  std::vector<std::pair<std::string, Bubble>> out;
  for (const auto& run : runs) {
    if (run.profiled || run.bench_case == nullptr || !run.summary.contains("pipeline")) continue;
    const auto& p = run.summary.at("pipeline");
    const std::string& name = run.bench_case->name;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == name; });
    if (it == out.end()) {
      out.push_back({name, {p.at("schedule").get<std::string>(), p.at("microbatches").get<int>(), {}, {}, 0.0}});
      it = std::prev(out.end());
    }
    Bubble& b = it->second;
    const auto& ranks = p.at("per_rank");
    b.measured.resize(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) b.measured[r].push_back(ranks[r].at("idle_share").get<double>());
    b.simulated = p.at("simulated_idle_share_per_stage_rank").get<std::vector<double>>();
    b.formula = p.at("formula_idle_share").get<double>();
  }
  return out;
}

std::string percent(double share) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * share);
  return buf;
}

}  // namespace

std::vector<std::string> pp_suite_schedules() { return {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}; }

Suite pp_suite(const StrategyRegistry& strategies, const recipes::BenchWorkloads& w) {
  const StrategySpec* reference = strategies.reference();
  TORCH_CHECK_VALUE(reference != nullptr, "the pp suite compares with the reference strategy; none is registered");
  // 8 equal blocks (2 per stage when interleaved), the medium model's width;
  // half its batch per micro-batch, so 8 micro-batches stay a short step.
  const std::vector<std::string> blocks = {"--n-layer", "8"};
  const int64_t batch = std::max<int64_t>(1, w.medium.batch / 2);
  Suite s{"pp",
          "Pipeline parallelism on " + w.medium.preset + " with 8 blocks, 2 ranks x 1 thread, " +
              std::to_string(batch) + " samples per micro-batch at block 128: --pp-size 2 under each schedule "
              "(interleaved-1f1b with 2 stages per rank) at 2, 4 and 8 micro-batches (--accumulate-grad-batches), "
              "against " + reference->name() + " over the same 2 ranks at the same micro-batches and tokens per "
              "step (a pipeline's 2 ranks share its samples; " + reference->name() + "'s ranks take half each). "
              "vs ref: tokens/s ÷ " +
              reference->name() + "'s. The bubble table and chart: each rank's idle share of the step (1 - its "
              "compute ÷ the slowest rank's step) beside the schedule's simulation with the run's own costs and "
              "the closed formula.",
          {}};
  for (int m : kMicrobatches) {
    const std::string accumulate = std::to_string(m);
    BenchCase ref;
    ref.name = "pp/" + w.medium.preset + "/" + reference->name() + "-m" + accumulate + "-2x1";
    for (const std::string& schedule : pp_suite_schedules()) {
      BenchCase c;
      c.suite = "pp";
      c.preset = w.medium.preset;
      c.strategy = strategies.single_process() ? strategies.single_process()->name() : reference->name();
      c.nproc = 2;
      c.block_size = 128;
      c.batch_size = batch;
      c.steps = 12;
      c.model_flags = blocks;
      c.extra = {"--accumulate-grad-batches", accumulate, "--pp-size", "2", "--pp-schedule", schedule};
      if (schedule == "interleaved-1f1b") c.extra.insert(c.extra.end(), {"--pp-virtual-stages", "2"});
      c.name = "pp/" + w.medium.preset + "/pp2-" + schedule + "-m" + accumulate + "-2x1";
      c.reference = ref.name;
      if (schedule == pp_suite_schedules().front()) {
        ref.suite = "pp";
        ref.preset = c.preset;
        ref.strategy = reference->name();
        ref.nproc = 2;
        ref.block_size = 128;
        // Each data-parallel rank takes a pipeline's samples over its 2 ranks: half of them.
        ref.batch_size = std::max<int64_t>(1, batch / 2);
        ref.steps = c.steps;
        ref.model_flags = blocks;
        ref.extra = {"--accumulate-grad-batches", accumulate};
        s.cases.push_back(ref);
      }
      s.cases.push_back(c);
    }
  }
  return s;
}

std::string pp_markdown(const std::vector<CaseRun>& runs) {
  const auto all = bubbles(runs);
  if (all.empty()) return "";
  std::ostringstream out;
  out << "\n### pp: each rank's idle share of the step (median over repeats)\n\n"
      << "| case | schedule | micro-batches | measured, per rank | simulated, per rank | formula |\n"
      << "|---|---|---:|---|---|---:|\n";
  for (const auto& [name, b] : all) {
    std::string measured, simulated;
    for (const auto& per_repeat : b.measured) measured += (measured.empty() ? "" : ", ") + percent(median(per_repeat));
    for (double x : b.simulated) simulated += (simulated.empty() ? "" : ", ") + percent(x);
    out << "| " << name << " | " << b.schedule << " | " << b.microbatches << " | " << measured << " | " << simulated
        << " | " << percent(b.formula) << " |\n";
  }
  return out.str();
}

PanelChart pp_bubble_chart(const std::vector<CaseRun>& runs) {
  PanelChart chart;
  chart.strategies = {"measured", "simulated", "formula"};
  chart.ylabel = "idle share of the step (mean over ranks)";
  chart.ymax = 0.5;  // a pp-2 bubble is at most 1/3 by the formula (the line at 1 stays off the chart)
  chart.long_labels = true;  // the schedules' names, slanted
  // micro-batches -> schedule -> {measured, simulated, formula}, in order of appearance.
  std::map<int, std::vector<std::pair<std::string, std::vector<double>>>> panels;
  for (const auto& [name, b] : bubbles(runs)) {
    std::vector<double> measured;
    for (const auto& per_repeat : b.measured) measured.push_back(median(per_repeat));
    panels[b.microbatches].push_back({b.schedule, {mean(measured), mean(b.simulated), b.formula}});
  }
  std::ostringstream data;
  data << "# one block per panel (micro-batches per step); rows: schedule; columns: the idle share measured "
          "(each rank's median over repeats, averaged over ranks), simulated and by the formula\n";
  size_t p = 0;
  for (const auto& [m, rows] : panels) {
    chart.panels.push_back(std::to_string(m) + " micro-batches");
    if (p++ > 0) data << "\n\n";
    data << "# panel " << p - 1 << ": " << m << " micro-batches\n\"schedule\" \"measured\" \"simulated\" \"formula\"\n";
    for (const auto& [schedule, v] : rows) data << '"' << schedule << "\" " << v[0] << " " << v[1] << " " << v[2] << "\n";
  }
  chart.data = data.str();
  return chart;
}

}  // namespace strata::bench
